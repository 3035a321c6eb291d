// The run list, kept live over /ws/runs/. Everything a frame carries reaches the page as text
// (textContent, dataset, property assignment): no markup is ever built from data.
(function () {
  'use strict';

  // The event vocabulary (runs.domain.events), written by the server with json_script.
  const T = JSON.parse(document.getElementById('event-types').textContent).types;

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function newRow(frame) {
    const tr = el('tr');
    tr.dataset.run = frame.run;
    const link = el('a', null, String(frame.run).slice(0, 8));
    link.href = '/runs/' + encodeURIComponent(frame.run) + '/';
    const id = el('td', 'mono'); id.appendChild(link); tr.appendChild(id);
    tr.appendChild(el('td', null, frame.agent || ''));
    const status = el('td'); const badge = el('span', 'badge'); badge.dataset.field = 'status'; status.appendChild(badge); tr.appendChild(status);
    for (const field of ['waiting', 'steps', 'cost']) { const td = el('td'); td.dataset.field = field; tr.appendChild(td); }
    tr.appendChild(el('td', 'muted', frame.occurred_at));
    return tr;
  }

  function row(tbody, frame) {
    let tr = Array.from(tbody.rows).find((r) => r.dataset.run === String(frame.run));
    if (!tr) {
      const empty = tbody.querySelector('tr.empty'); if (empty) empty.remove();
      tr = newRow(frame);
      tbody.prepend(tr);
    }
    const badge = tr.querySelector('[data-field=status]');
    badge.textContent = frame.run_status; badge.className = 'badge s-' + frame.run_status;
    tr.querySelector('[data-field=steps]').textContent = frame.step_count;
    tr.querySelector('[data-field=cost]').textContent = frame.cost_usd;
    const w = tr.querySelector('[data-field=waiting]');
    if (frame.type === T.RUN_WAITING_FOR_APPROVAL) w.textContent = (frame.payload && (frame.payload.kind === 'child_run' ? 'child runs' : frame.payload.reason)) || 'approval';
    else if (frame.type === T.RUN_WAITING_FOR_USER) w.textContent = 'user input';
    else if (!String(frame.run_status).startsWith('WAITING')) w.textContent = '';
  }

  function start() {
    const tbody = document.querySelector('#runs tbody');
    const live = document.getElementById('live');
    function connect() {
      const ws = new WebSocket((location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + '/ws/runs/');
      ws.onopen = () => { live.textContent = 'live'; };
      ws.onmessage = (m) => row(tbody, JSON.parse(m.data));
      ws.onclose = () => { live.textContent = 'reconnecting…'; setTimeout(connect, 1000); };
    }
    connect();
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start); else start();
})();
