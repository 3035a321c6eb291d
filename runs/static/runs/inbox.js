// The inbox of approvals waiting for a decision, oldest first: drawn again from /approvals/rows/ whenever the header's
// count is read (runs/static/runs/header.js fires `agentrt:waiting` after each read, on every change the tenant's
// socket reports). Rows are built from text only (textContent, dataset, property assignment).
(function () {
  'use strict';
  const FMT = window.agentrtFmt;

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function row(a) {
    const tr = el('tr'); tr.dataset.approval = a.id;
    const since = el('td'); const t = el('time', null, FMT.ago(a.created_at)); t.dateTime = a.created_at; t.title = FMT.absolute(a.created_at);
    since.appendChild(t); tr.appendChild(since);
    const run = el('td', 'run-id'); const link = el('a', 'mono', a.run_short); link.href = '/runs/' + encodeURIComponent(a.run) + '/'; link.title = a.run;
    run.appendChild(link); tr.appendChild(run);
    tr.appendChild(el('td', null, a.agent));
    const kind = el('td', null, a.kind);
    if (a.deadline_passed) { kind.append(' '); const b = el('span', 'badge s-FAILED', 'deadline passed'); b.title = "The run's deadline has passed: confirm or reject only"; kind.appendChild(b); }
    tr.appendChild(kind);
    tr.appendChild(el('td', 'mono', a.tool));
    const args = el('td', 'args mono', a.arguments_preview); args.title = a.arguments_preview; tr.appendChild(args);
    const go = el('td'); const decide = el('a', 'btn', 'Decide →');
    decide.href = '/runs/' + encodeURIComponent(a.run) + '/#approval-' + encodeURIComponent(a.id);
    go.appendChild(decide); tr.appendChild(go);
    return tr;
  }

  function start() {
    const table = document.getElementById('inbox');
    const tbody = table.querySelector('tbody');
    const live = document.getElementById('live');
    const query = new URLSearchParams();
    if (table.dataset.tenant) query.set('tenant', table.dataset.tenant);
    let inFlight = false;
    let again = false;

    function refresh() {
      if (inFlight) { again = true; return; }
      inFlight = true;
      fetch('/approvals/rows/?' + query.toString(), { credentials: 'same-origin', headers: { Accept: 'application/json' } })
        .then((r) => (r.ok ? r.json() : null))
        .then((body) => {
          if (!body) return;
          const rows = body.results.map(row);
          if (!rows.length) {
            const empty = el('tr', 'empty'); const cell = el('td', 'muted', 'Nothing waits for a decision.'); cell.colSpan = 7;
            empty.appendChild(cell); rows.push(empty);
          }
          tbody.replaceChildren(...rows);
        })
        .catch(() => {})
        .finally(() => { inFlight = false; if (again) { again = false; refresh(); } });
    }

    document.addEventListener('agentrt:waiting', refresh);
    window.agentrtRuns.onState((state) => { live.textContent = state; });
    setInterval(() => tbody.querySelectorAll('time[datetime]').forEach((t) => { t.textContent = FMT.ago(t.dateTime); }), 15000);
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start); else start();
})();
