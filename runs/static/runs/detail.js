// The live run page. Its data comes from the <script type="application/json"> blocks the server wrote with
// json_script and from the run's WebSocket; all of it reaches the page as text (textContent, form values,
// dataset): no markup is ever built from data, so a model's or a tool's text cannot become script.
(function () {
  'use strict';

  // The decisions an approver can take on a card. Each one is a submit button posting `decision=<value>` with the
  // approval id and the request hash the card shows to /runs/<id>/decide/. Another decision is one more entry.
  const DECISIONS = [
    { value: 'approve', label: 'Approve', cls: 'primary' },
    { value: 'reject', label: 'Reject', cls: 'danger' },
  ];
  // An unknown outcome (interrupted or uncertain side effect) has a third decision: the operator who knows what
  // happened confirms it, and nothing is sent again (POST /api/approvals/{id}/confirm/ on the REST side).
  const CONFIRMABLE = new Set(['interrupted_side_effect', 'uncertain_side_effect']);
  const CONFIRMS = [
    { value: 'took_effect', label: 'It took effect', cls: 'confirm-took_effect' },
    { value: 'not_taken', label: 'It did not take effect', cls: 'confirm-not_taken' },
  ];
  const TITLES = { interrupted_side_effect: 'Interrupted side effect: ', uncertain_side_effect: 'Outcome unknown: ' };

  // The event vocabulary (runs.domain.events.page_vocabulary), written by the server with json_script: the
  // wire name of each type by member name (T.RUN_COMPLETED is 'run.completed'), the timeline's classes and the
  // status each event leaves the run in. A new event type needs no change here.
  const EVENTS = data('event-types');
  const T = EVENTS.types;
  const CLASS = EVENTS.classes;
  const STATUS = EVENTS.status_after;

  function data(id) { return JSON.parse(document.getElementById(id).textContent); }

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function pretty(v) { return typeof v === 'string' ? v : JSON.stringify(v, null, 2); }

  function hidden(name, value) {
    const input = el('input'); input.type = 'hidden'; input.name = name; input.value = value; return input;
  }

  function describe(e) {
    const p = e.payload || {};
    switch (e.type) {
      case T.MODEL_REQUEST_STARTED: return 'step ' + p.step + ', attempt ' + p.attempt;
      case T.MODEL_RESPONSE_COMPLETED: return (p.text ? p.text + '  ' : '') + (p.tool_calls && p.tool_calls.length ? p.tool_calls.length + ' tool call(s)' : '') +
        '  [' + (p.usage ? p.usage.input_tokens + ' in / ' + p.usage.output_tokens + ' out' : '') + ', ' + p.stop_reason + ']';
      case T.MODEL_RESPONSE_FAILED: return p.error_class + (p.transient ? ' (transient)' : '');
      case T.TOOL_CALL_PROPOSED: return p.tool + ' ' + pretty(p.arguments);
      case T.TOOL_CALL_STARTED: return p.tool + ' attempt ' + p.attempt + ' — watermark set';
      case T.TOOL_CALL_COMPLETED: case T.TOOL_CALL_FAILED: return p.tool + ' → ' + pretty(p.result);
      case T.APPROVAL_REQUESTED: return p.kind + ' approval for ' + p.tool;
      case T.APPROVAL_RESOLVED: return p.decision + (p.decided_by ? ' by ' + p.decided_by : '') + (p.decided_via ? ' via ' + p.decided_via : '') + (p.reason ? ': ' + p.reason : '');
      case T.LEASE_TAKEN_OVER: return 'from ' + (p.previous_owner || '?') + ' (epoch ' + p.previous_epoch + ' → ' + p.lease_epoch + ')';
      case T.STEP_INTERRUPTED: return 'step ' + p.step + ' ' + p.phase + (p.tool ? ' ' + p.tool : '') + (p.outcome ? ' — outcome ' + p.outcome : '');
      case T.RUN_FAILED: return p.failure ? p.failure.reason + ': ' + p.failure.message : '';
      case T.RUN_COMPLETED: return p.final_message || '';
      case T.RUN_WAITING_FOR_USER: return p.question || '';
      case T.RUN_INPUT_RECEIVED: return p.text || '';
      case T.RUN_REQUEUED: return p.reason || '';
      case T.RUN_WAITING_FOR_APPROVAL: return p.kind === 'child_run' && Array.isArray(p.children) ? 'child runs: ' + p.children.map((c) => c.agent).join(', ') : (p.reason || '');
      case T.MODEL_RESPONSE_DELTA: return p.text || '';
      case T.RUN_CLAIMED: return p.lease_owner + ' epoch ' + p.lease_epoch;
      case T.RUN_FENCED: return 'epoch ' + p.lease_epoch + (p.late ? ' (late outcome recorded)' : '');
      default: return '';
    }
  }

  function start() {
    const RUN = data('run-data');
    const CAN_RESOLVE = data('can-resolve') === true;
    const CSRF = document.querySelector('#cancel-form input[name=csrfmiddlewaretoken]').value;
    const timeline = document.getElementById('timeline');
    const approvals = document.getElementById('approvals');
    const answer = document.getElementById('answer');
    const failure = document.getElementById('failure');
    const shownApprovals = new Set();
    let last = 0;

    function setStatus(s) { const b = document.getElementById('status'); b.textContent = s; b.className = 'badge s-' + s; }

    // The tree of child runs (seed 002, M6). Rows the server drew, and rows for children started while the page is
    // open (from this run's child_run wait); each badge follows its run over the tenant's status stream.
    const family = document.getElementById('family');
    const tree = document.getElementById('tree');
    let watching = false;

    function badge(run, status) {
      const b = el('span', 'badge s-' + status, status); b.dataset.run = run; return b;
    }

    function addChild(c) {
      if (!c || !c.run || Array.from(tree.children).some((li) => li.dataset.node === String(c.run))) return;
      const li = el('li', 'node depth-1'); li.dataset.node = String(c.run);
      const link = el('a', 'mono', String(c.run).slice(0, 8)); link.href = '/runs/' + encodeURIComponent(c.run) + '/';
      li.appendChild(link);
      li.appendChild(el('span', 'agent', c.agent || ''));
      li.appendChild(badge(String(c.run), 'QUEUED'));
      tree.appendChild(li);
      family.hidden = false;
    }

    function watchFamily() {
      if (watching || !document.querySelector('#family [data-run]')) return;
      watching = true;
      function connect() {
        const ws = new WebSocket((location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + '/ws/runs/');
        ws.onmessage = (m) => {
          const f = JSON.parse(m.data);
          if (!f.run || !f.run_status) return;
          document.querySelectorAll('#family [data-run]').forEach((b) => {
            if (b.dataset.run === String(f.run)) { b.textContent = f.run_status; b.className = 'badge s-' + f.run_status; }
          });
        };
        ws.onclose = () => { setTimeout(connect, 1000); };
      }
      connect();
    }

    // The decisions the card offers: what the server says it accepts now (`decisions`, on the cards it drew), or
    // for a card drawn from an approval.requested event, by kind — without approve when that event says the run's
    // deadline had passed (an unknown outcome is then only confirmed or rejected; the server refuses approve).
    function offered(a) {
      const all = CONFIRMABLE.has(a.kind) ? DECISIONS.concat(CONFIRMS) : DECISIONS;
      if (Array.isArray(a.decisions)) {
        return all.filter((d) => a.decisions.includes(d.value === 'took_effect' || d.value === 'not_taken' ? 'confirm' : d.value));
      }
      return a.deadline_passed ? all.filter((d) => d.value !== 'approve') : all;
    }

    function decisionForm(a) {
      const f = el('form'); f.method = 'post'; f.action = '/runs/' + encodeURIComponent(RUN.id) + '/decide/';
      f.appendChild(hidden('csrfmiddlewaretoken', CSRF));
      f.appendChild(hidden('approval', a.id));
      f.appendChild(hidden('request_hash', a.request_hash));
      const reason = el('input'); reason.type = 'text'; reason.name = 'reason'; reason.placeholder = 'Reason (optional)'; reason.maxLength = 2000;
      f.appendChild(reason);
      for (const d of offered(a)) {
        const button = el('button', d.cls, d.label); button.type = 'submit'; button.name = 'decision'; button.value = d.value;
        f.appendChild(button);
      }
      return f;
    }

    function approvalCard(a) {
      if (shownApprovals.has(a.id)) return;
      shownApprovals.add(a.id);
      const card = el('div', 'approval'); card.id = 'approval-' + a.id;
      const p = a.presentation || {};
      card.appendChild(el('div', null, (TITLES[a.kind] || 'Approval needed: ') + (p.tool || a.tool || '')));
      if (p.notice) card.appendChild(el('div', 'muted', p.notice));
      if (p.side_effect) card.appendChild(el('div', 'muted', 'side effect: ' + p.side_effect));
      if (p.arguments !== undefined) card.appendChild(el('pre', null, pretty(p.arguments)));
      if (p.error) card.appendChild(el('div', 'muted', 'error: ' + pretty(p.error)));
      if (a.ends_run || a.deadline_passed) {
        card.appendChild(el('div', 'notice', (a.deadline_passed ? "The run's deadline has passed. " : '') +
          (a.ends_run ? 'Approve (send it again) is not offered: confirm whether it took effect, or reject it; the run then ends ' + a.ends_run + '.' : '')));
      }
      card.appendChild(el('div', 'muted mono', 'request hash ' + a.request_hash));
      card.appendChild(CAN_RESOLVE ? decisionForm(a) : el('div', 'muted', 'You may not resolve approvals.'));
      approvals.appendChild(card);
    }

    function showAnswer(title, key) {
      if (answer.dataset.key !== key) {
        answer.dataset.key = key;
        answer.replaceChildren(el('h3', null, title), el('div', 'final', ''));
      }
      answer.hidden = false;
      return answer.querySelector('.final');
    }

    function apply(e) {
      if (e.sequence <= last) return;  // exactly once, in order
      last = e.sequence;
      const p = e.payload || {};
      const li = el('li', 'ev ' + (CLASS[e.type] || '') + (e.type === T.MODEL_REQUEST_STARTED ? ' step' : ''));
      li.dataset.sequence = e.sequence;
      li.appendChild(el('span', 'seq', '#' + e.sequence));
      li.appendChild(el('span', 'type', e.type));
      const d = el('span', 'mono', describe(e)); d.title = e.occurred_at || ''; li.appendChild(d);
      timeline.appendChild(li);
      if (e.type === T.MODEL_REQUEST_STARTED) document.getElementById('steps').textContent = p.step;
      if (e.type === T.APPROVAL_REQUESTED) approvalCard({ id: p.approval, kind: p.kind, request_hash: p.request_hash, tool: p.tool, presentation: p.presentation || { tool: p.tool }, deadline_passed: p.deadline_passed === true, ends_run: p.deadline_passed === true ? 'deadline_exceeded' : null });
      if (e.type === T.APPROVAL_RESOLVED) { const c = document.getElementById('approval-' + p.approval); if (c) c.remove(); }
      if (STATUS[e.type]) setStatus(STATUS[e.type]);
      if (e.type === T.RUN_WAITING_FOR_APPROVAL && p.kind === 'child_run' && Array.isArray(p.children)) { p.children.forEach(addChild); watchFamily(); }
      if (e.type === T.MODEL_RESPONSE_DELTA) showAnswer('Answer (streaming…)', 'delta:' + p.step + ':' + p.attempt).textContent += p.text || '';
      if (e.type === T.RUN_COMPLETED) showAnswer('Answer', 'final').textContent = p.final_message || '';
      if (e.type === T.RUN_FAILED && p.failure) { failure.hidden = false; failure.textContent = 'Failed: ' + p.failure.reason + ' — ' + p.failure.message; }
    }

    data('pending-data').forEach(approvalCard);
    watchFamily();
    function connect() {
      const ws = new WebSocket((location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + '/ws/runs/' + encodeURIComponent(RUN.id) + '/?after=' + last);
      ws.onopen = () => { document.getElementById('live').textContent = 'live'; };
      ws.onmessage = (m) => apply(JSON.parse(m.data));
      ws.onclose = () => { document.getElementById('live').textContent = 'reconnecting…'; setTimeout(connect, 1000); };
    }
    connect();
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start); else start();
})();
