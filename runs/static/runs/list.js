// The runs list, kept live over the page's shared socket to ws/runs/ (runs/static/runs/live.js). A frame about a
// row on the page updates it in place; a frame about a run the page does not show yet asks the server whether that
// run passes the page's filters (/runs/rows/), and only the first page takes new rows. Everything a frame or a row
// carries reaches the page as text (textContent, dataset, property assignment): no markup is ever built from data.
(function () {
  'use strict';

  const T = JSON.parse(document.getElementById('event-types').textContent).types;
  const FILTERS = JSON.parse(document.getElementById('page-filters').textContent);
  const FIRST_PAGE = JSON.parse(document.getElementById('first-page').textContent) === true;
  const FMT = window.agentrtFmt;
  const ENDED = new Set(['COMPLETED', 'FAILED', 'CANCELLED']);
  const WAITING_LABELS = { approval: 'approval', user: 'user', child_runs: 'child runs' };
  const STATUSES = FILTERS.status ? new Set(String(FILTERS.status).split(',')) : null;

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function td(field, cls, text) {
    const cell = el('td', cls, text);
    if (field) cell.dataset.field = field;
    return cell;
  }

  function copyButton(id) {
    const b = el('button', 'copy', 'copy');
    b.type = 'button';
    b.dataset.copy = id;
    b.title = 'Copy the full id ' + id;
    return b;
  }

  // A row drawn from the server's row shape (runs.services.run_list.run_row), as the template draws it.
  function newRow(r) {
    const tr = el('tr');
    tr.dataset.run = r.id;
    const id = el('td', 'run-id');
    const link = el('a', 'mono', r.short_id);
    link.href = '/runs/' + encodeURIComponent(r.id) + '/';
    link.title = r.id;
    id.append(link, ' ', copyButton(r.id));
    tr.appendChild(id);
    tr.appendChild(el('td', null, r.agent));
    const input = el('td', 'input muted', r.input_preview); input.title = r.input_preview; tr.appendChild(input);
    const status = el('td'); const badge = el('span', 'badge s-' + r.status, r.status); badge.dataset.field = 'status';
    status.appendChild(badge); tr.appendChild(status);
    tr.appendChild(td('waiting', null, r.waiting_label || ''));
    tr.appendChild(td('steps', 'num', r.step_count));
    tr.appendChild(td('cost', 'num mono', r.cost));
    const dur = td('duration', 'num', ''); dur.dataset.created = r.created_at; dur.dataset.ended = r.ended_at || '';
    tr.appendChild(dur);
    const created = td('created', null, null);
    const time = el('time', null, FMT.ago(r.created_at)); time.dateTime = r.created_at; time.title = FMT.absolute(r.created_at);
    created.appendChild(time); tr.appendChild(created);
    if (document.querySelector('#runs thead th.tenant')) tr.appendChild(td('tenant', null, r.tenant || ''));
    return tr;
  }

  function tick(root) {
    (root || document).querySelectorAll('#runs time[datetime]').forEach((t) => {
      t.textContent = FMT.ago(t.dateTime);
      if (!t.dataset.hover) { t.title = FMT.absolute(t.dateTime); t.dataset.hover = '1'; }
    });
    (root || document).querySelectorAll('#runs td[data-field=duration]').forEach((cell) => {
      const ended = cell.dataset.ended;
      const s = FMT.seconds(cell.dataset.created, ended || null);
      cell.textContent = s === null ? '' : FMT.duration(s);
      cell.title = ended ? 'from created to ended' : 'so far';
    });
  }

  function update(tr, frame) {
    const status = frame.run_status;
    const badge = tr.querySelector('[data-field=status]');
    badge.textContent = status; badge.className = 'badge s-' + status;
    if (frame.step_count !== undefined) tr.querySelector('[data-field=steps]').textContent = frame.step_count;
    if (frame.cost_usd !== undefined) tr.querySelector('[data-field=cost]').textContent = FMT.cost(frame.cost_usd);
    const w = tr.querySelector('[data-field=waiting]');
    if (frame.type === T.RUN_WAITING_FOR_APPROVAL) {
      const p = frame.payload || {};
      w.textContent = p.kind === 'child_run' ? WAITING_LABELS.child_runs : WAITING_LABELS.approval;
    } else if (frame.type === T.RUN_WAITING_FOR_USER) w.textContent = WAITING_LABELS.user;
    else if (!String(status).startsWith('WAITING')) w.textContent = '';
    const dur = tr.querySelector('[data-field=duration]');
    if (ENDED.has(status) && !dur.dataset.ended) dur.dataset.ended = frame.occurred_at || new Date().toISOString();
    // A run that no longer passes the status filter stays where it is, marked, until the page is read again.
    const stale = STATUSES !== null && !STATUSES.has(status);
    tr.classList.toggle('stale', stale);
    tr.title = stale ? 'No longer ' + Array.from(STATUSES).join(' or ') + ': read the page again to drop it' : '';
    tick(tr);
  }

  function start() {
    const tbody = document.querySelector('#runs tbody');
    const live = document.getElementById('live');
    const asked = new Set();
    let pending = new Set();
    let inFlight = false;

    function rowOf(id) { return Array.from(tbody.rows).find((r) => r.dataset.run === String(id)); }

    // Ask the server for rows the page may be missing: new runs (first page only) and, after a dropped socket, every
    // row shown, since the frames sent meanwhile are gone.
    function fetchRows() {
      if (inFlight || pending.size === 0) return;
      const ids = Array.from(pending).slice(0, 50);
      ids.forEach((id) => pending.delete(id));
      const query = new URLSearchParams();
      for (const [k, v] of Object.entries(FILTERS)) query.append(k, v);
      ids.forEach((id) => query.append('run', id));
      inFlight = true;
      fetch('/runs/rows/?' + query.toString(), { credentials: 'same-origin', headers: { Accept: 'application/json' } })
        .then((r) => (r.ok ? r.json() : { rows: [] }))
        .then((body) => {
          const rows = (body.rows || []).slice().reverse();  // oldest first, so each prepend leaves newest on top
          for (const r of rows) {
            const existing = rowOf(r.id);
            if (existing) { existing.replaceWith(newRow(r)); continue; }
            if (!FIRST_PAGE) continue;
            const empty = tbody.querySelector('tr.empty'); if (empty) empty.remove();
            tbody.prepend(newRow(r));
          }
          tick();
        })
        .catch(() => {})
        .finally(() => { inFlight = false; if (pending.size) fetchRows(); });
    }

    window.agentrtRuns.onFrame((frame) => {
      if (!frame.run) return;
      const tr = rowOf(frame.run);
      if (tr) { update(tr, frame); return; }
      if (!FIRST_PAGE || asked.has(String(frame.run))) return;
      asked.add(String(frame.run));
      pending.add(String(frame.run));
      fetchRows();
    });
    window.agentrtRuns.onState((state, reconnected) => {
      live.textContent = state;
      if (state === 'live' && reconnected) {
        Array.from(tbody.rows).forEach((r) => { if (r.dataset.run) pending.add(r.dataset.run); });
        asked.clear();
        fetchRows();
      }
    });

    // Copy a run's full id (the page shows its short form).
    tbody.addEventListener('click', (event) => {
      const button = event.target.closest('button.copy');
      if (!button) return;
      const id = button.dataset.copy;
      const done = () => { button.textContent = 'copied'; setTimeout(() => { button.textContent = 'copy'; }, 1500); };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(id).then(done, () => { fallbackCopy(id); done(); });
      } else { fallbackCopy(id); done(); }
    });

    // An empty select or input is left out of the query, so links and the server see only the filters chosen.
    document.getElementById('filters').addEventListener('submit', (event) => {
      event.target.querySelectorAll('input, select').forEach((field) => { if (!field.value) field.disabled = true; });
    });

    tick();
    setInterval(tick, 15000);
  }

  function fallbackCopy(text) {
    const area = el('textarea'); area.value = text; area.setAttribute('readonly', '');
    area.className = 'offscreen';
    document.body.appendChild(area); area.select();
    try { document.execCommand('copy'); } catch (e) { /* the id stays visible on hover */ }
    area.remove();
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start); else start();
})();
