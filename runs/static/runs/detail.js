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
  // Cancel events by wire name too, so the page shows them wherever the vocabulary has them.
  const CANCEL_REQUESTED = T.RUN_CANCEL_REQUESTED || 'run.cancel_requested';
  const CANCEL_TOO_LATE = T.RUN_CANCEL_TOO_LATE || 'run.cancel_too_late';
  const ENDED = new Set(['COMPLETED', 'FAILED', 'CANCELLED']);
  const FMT = window.agentrtFmt;
  // What a page's figures are read again after (a debounce: at most one read in flight).
  const USAGE_EVENTS = new Set([T.MODEL_RESPONSE_COMPLETED, T.MODEL_RESPONSE_FAILED, T.TOOL_CALL_COMPLETED,
    T.TOOL_CALL_FAILED, T.RUN_CHECKPOINTED, T.RUN_COMPLETED, T.RUN_FAILED, T.RUN_CANCELLED, T.RUN_WAITING_FOR_APPROVAL,
    T.RUN_WAITING_FOR_USER, T.RUN_REQUEUED, T.MODEL_REQUEST_STARTED, CANCEL_REQUESTED]);

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

  // A cancel's who, how and why, as run.cancel_requested records them and run.cancelled repeats them.
  function who(p) {
    return (p.by ? 'by ' + p.by : '') + (p.via ? ' via ' + p.via : '') + (p.reason ? ': ' + p.reason : '') +
      (p.parent ? ' (its parent run was cancelled)' : '');
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
      case T.TOOL_CALL_PROGRESS: return p.tool + ' ' + (p.remote ? 'runs as task ' + p.remote.task_id : p.progress + (p.total != null ? '/' + p.total : '') + (p.message ? ' — ' + p.message : ''));
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
      case T.RUN_CANCELLED: return who(p);
      case CANCEL_REQUESTED: return who(p);
      case CANCEL_TOO_LATE: return 'the run ended first' + (p.by ? ' (cancel ' + who(p) + ')' : '');
      case T.RUN_RETRIED: return who(p) + (p.failure ? ', after ' + p.failure.reason : '');
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
    const tools = new Map();  // approval id -> the tool it asks about (from approval.requested), for the decisions
    const cancelForm = document.getElementById('cancel-form');
    const retryForm = document.getElementById('retry-form');  // drawn only for a user who may act on the run
    const cancelInfo = document.getElementById('cancel-info');
    const decisions = document.getElementById('decisions');
    const duration = document.getElementById('duration');
    const CAN_ACT = cancelForm.dataset.canAct === '1';  // the user may act on this run (its own tenant's)
    let summary = data('summary-data');
    let status = RUN.status;
    let cancelAsked = Boolean(summary.cancel_requested_at);
    let last = 0;
    let lastAt = null;

    // Cancel is offered only while it applies: to a run that has not ended, once (a second request adds nothing);
    // Retry only to a run that failed for a transient reason (the server says so: summary.retryable).
    function showActions() {
      cancelForm.hidden = !(CAN_ACT && summary.cancellable !== false && !ENDED.has(status) && !cancelAsked);
      if (retryForm) retryForm.hidden = !(CAN_ACT && status === 'FAILED' && summary.retryable === true);
    }

    // Events up to HISTORY happened before the page was drawn: they draw the timeline, while the status and the
    // actions stay as the server drew them (a replay passes through RUNNING on its way to COMPLETED).
    const HISTORY = summary.last_sequence || 0;

    function setStatus(s, e) {
      if (e && e.sequence <= HISTORY) return;
      const b = document.getElementById('status'); b.textContent = s; b.className = 'badge s-' + s;
      if (ENDED.has(status) && !ENDED.has(s)) {  // going again (a retry): it has not ended, and may be cancelled
        duration.dataset.ended = '';
        cancelAsked = false;
      }
      status = s;
      showActions();
    }

    // Usage only grows: a read that answers late never shows less than one that answered before it.
    function showSummary(next) {
      const u = summary.usage || {};
      const n = next.usage || {};
      const most = {};
      for (const k of Object.keys(n)) most[k] = Math.max(Number(n[k]) || 0, Number(u[k]) || 0);
      summary = Object.assign({}, next, { usage: most, step_count: Math.max(next.step_count || 0, summary.step_count || 0) });
      document.getElementById('steps').textContent = summary.step_count;
      document.getElementById('tokens').textContent = (most.input_tokens || 0) + ' in / ' + (most.output_tokens || 0) + ' out';
      document.getElementById('cached').textContent = (most.cache_read_input_tokens || 0) + ' read / ' + (most.cache_creation_input_tokens || 0) + ' written';
      document.getElementById('calls').textContent = (most.model_calls || 0) + ' model / ' + (most.tool_calls || 0) + ' tool';
      document.getElementById('cost').textContent = '$' + FMT.cost(most.cost_usd);
      if (summary.cancel_requested_at) cancelAsked = true;
      if (summary.ended_at && !duration.dataset.ended) duration.dataset.ended = summary.ended_at;
      showActions();
      tick();
    }

    let reading = false;
    let readAgain = false;
    function readSummary() {
      if (reading) { readAgain = true; return; }
      reading = true;
      fetch('/runs/' + encodeURIComponent(RUN.id) + '/summary/', { credentials: 'same-origin', headers: { Accept: 'application/json' } })
        .then((r) => (r.ok ? r.json() : null))
        .then((next) => { if (next) showSummary(next); })
        .catch(() => {})
        .finally(() => { reading = false; if (readAgain) { readAgain = false; readSummary(); } });
    }

    function tick() {
      const s = FMT.seconds(duration.dataset.created, duration.dataset.ended || null);
      duration.textContent = s === null ? '' : FMT.duration(s) + (duration.dataset.ended ? '' : ' so far');
      document.querySelectorAll('.head time[datetime]').forEach((t) => { t.textContent = FMT.ago(t.dateTime); t.title = FMT.absolute(t.dateTime); });
    }

    function showCancel(e) {
      const p = e.payload || {};
      const text = e.type === CANCEL_TOO_LATE ? 'Cancel requested ' + who(p) + ', but the run had ended first.'
        : (e.type === T.RUN_CANCELLED ? 'Cancelled ' : 'Cancel requested ') + who(p);
      cancelInfo.replaceChildren(el('span', null, text + ' '), timeAt(e.occurred_at));
      cancelInfo.hidden = false;
    }

    function timeAt(iso) {
      const t = el('time', 'muted', FMT.ago(iso)); t.dateTime = iso || ''; t.title = FMT.absolute(iso); return t;
    }

    function addDecision(p, at) {
      const li = el('li', 'decision d-' + (p.decision || ''));
      li.dataset.approval = p.approval || '';
      li.appendChild(el('span', 'badge', p.decision || ''));
      li.appendChild(el('span', 'tool', tools.get(p.approval) || p.kind || ''));
      li.appendChild(el('span', null, (p.decided_by ? 'by ' + p.decided_by : 'by nobody') + (p.decided_via ? ' via ' + p.decided_via : '')));
      li.appendChild(timeAt(p.decided_at || at));
      if (p.reason) li.appendChild(el('span', 'reason', '“' + p.reason + '”'));
      decisions.appendChild(li);
      document.getElementById('decisions-panel').hidden = false;
    }

    // The tree of child runs. Rows the server drew, and rows for children started while the page is
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

    // Each badge of the tree follows its run over the page's shared socket to the tenant's status stream.
    function watchFamily() {
      if (watching || !document.querySelector('#family [data-run]')) return;
      watching = true;
      window.agentrtRuns.onFrame((f) => {
        if (!f.run || !f.run_status) return;
        document.querySelectorAll('#family [data-run]').forEach((b) => {
          if (b.dataset.run === String(f.run)) { b.textContent = f.run_status; b.className = 'badge s-' + f.run_status; }
        });
      });
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

    // "Fork from here": a new run whose conversation is this one's through the end of that step (runs/web/lineage.py).
    const CAN_FORK = Boolean(document.getElementById('fork-form'));
    function forkHere(step) {
      const f = el('form', 'fork-from-here'); f.method = 'post'; f.action = '/runs/' + encodeURIComponent(RUN.id) + '/fork/';
      f.appendChild(hidden('csrfmiddlewaretoken', CSRF));
      f.appendChild(hidden('from_step', String(step)));
      const b = el('button', null, 'Fork from here'); b.type = 'submit';
      b.title = 'A new run that continues after step ' + step + '; its side effects wait for approval';
      f.appendChild(b);
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
      if (p.mcp) card.appendChild(el('div', 'muted mcp', 'MCP server ' + p.mcp.server + ', tool ' + p.mcp.tool +
        ". The server's hints, not trusted (the operator classified this tool): " + pretty(p.mcp.server_hints || {})));
      if (p.arguments !== undefined) card.appendChild(el('pre', null, pretty(p.arguments)));
      if (p.fork && p.fork.original && !p.fork.same_arguments) card.appendChild(el('pre', 'fork-original', 'the original: ' + p.fork.original.tool + ' ' + pretty(p.fork.original.arguments)));
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
      const at = el('time', 'at', FMT.clock(e.occurred_at)); at.dateTime = e.occurred_at || ''; at.title = FMT.absolute(e.occurred_at);
      li.appendChild(at);
      const gap = el('span', 'delta', lastAt ? FMT.delta(lastAt, e.occurred_at) : '');
      gap.title = lastAt ? 'since the event before' : 'the first event';
      li.appendChild(gap);
      lastAt = e.occurred_at;
      li.appendChild(el('span', 'type', e.type));
      const d = el('span', 'mono', describe(e)); d.title = e.occurred_at || ''; li.appendChild(d);
      timeline.appendChild(li);
      if (e.type === T.MODEL_RESPONSE_COMPLETED && CAN_FORK && Number.isInteger(p.step)) d.appendChild(forkHere(p.step));
      if (e.type === T.MODEL_REQUEST_STARTED) document.getElementById('steps').textContent = Math.max(p.step || 0, summary.step_count || 0);
      if (e.type === T.APPROVAL_REQUESTED && p.approval) tools.set(p.approval, p.tool || '');
      if (e.type === T.APPROVAL_RESOLVED) addDecision(p, e.occurred_at);
      if (e.type === CANCEL_REQUESTED || e.type === CANCEL_TOO_LATE || (e.type === T.RUN_CANCELLED && p.by)) {
        if (e.type === CANCEL_REQUESTED) cancelAsked = true;
        showCancel(e);
      }
      if (e.sequence > HISTORY && ENDED.has(STATUS[e.type])) duration.dataset.ended = e.occurred_at;
      if (USAGE_EVENTS.has(e.type)) readSummary();
      if (e.type === T.APPROVAL_REQUESTED) approvalCard({ id: p.approval, kind: p.kind, request_hash: p.request_hash, tool: p.tool, presentation: p.presentation || { tool: p.tool }, deadline_passed: p.deadline_passed === true, ends_run: p.deadline_passed === true ? 'deadline_exceeded' : null });
      if (e.type === T.APPROVAL_RESOLVED) { const c = document.getElementById('approval-' + p.approval); if (c) c.remove(); }
      if (STATUS[e.type]) setStatus(STATUS[e.type], e);
      else showActions();
      if (e.type === T.RUN_WAITING_FOR_APPROVAL && p.kind === 'child_run' && Array.isArray(p.children)) { p.children.forEach(addChild); watchFamily(); }
      if (e.type === T.MODEL_RESPONSE_DELTA) showAnswer('Answer (streaming…)', 'delta:' + p.step + ':' + p.attempt).textContent += p.text || '';
      if (e.type === T.RUN_COMPLETED) showAnswer('Answer', 'final').textContent = p.final_message || '';
      if (e.type === T.RUN_FAILED && p.failure) { failure.hidden = false; failure.className = 'panel failure'; failure.textContent = 'Failed: ' + p.failure.reason + ' — ' + p.failure.message; }
      // A retry is a new attempt of this run: the failure it follows is history, said as such.
      if (e.type === T.RUN_RETRIED) { failure.hidden = false; failure.className = 'panel notice-panel'; failure.textContent = 'Retried ' + who(p) + (p.failure ? ' after it failed ' + p.failure.reason + ' — ' + p.failure.message : ''); }
    }

    data('pending-data').forEach(approvalCard);
    watchFamily();
    showActions();
    tick();
    setInterval(tick, 1000);
    if (location.hash.startsWith('#approval-')) {
      const card = document.getElementById(location.hash.slice(1));
      if (card) card.scrollIntoView();
    }
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
