// The header's "N waiting": approvals waiting for a decision the user may make, read again (at most one request
// at a time) whenever the tenant's socket says a run changed, and each time the socket opens (it misses what came
// before). Pages that show the same list (the inbox) listen for the `agentrt:waiting` event fired after each read.
(function () {
  'use strict';

  function start() {
    const badge = document.getElementById('waiting-count');
    if (!badge || !window.agentrtRuns) return;
    let inFlight = false;
    let again = false;

    function show(n) {
      badge.dataset.count = String(n);
      badge.textContent = n + ' waiting';
      badge.classList.toggle('some', n > 0);
      document.dispatchEvent(new CustomEvent('agentrt:waiting', { detail: { waiting: n } }));
    }

    function refresh() {
      if (inFlight) { again = true; return; }
      inFlight = true;
      fetch('/approvals/count/', { credentials: 'same-origin', headers: { Accept: 'application/json' } })
        .then((r) => (r.ok ? r.json() : null))
        .then((body) => { if (body && typeof body.waiting === 'number') show(body.waiting); })
        .catch(() => {})
        .finally(() => {
          inFlight = false;
          if (again) { again = false; refresh(); }
        });
    }

    window.agentrtRuns.onFrame(refresh);
    window.agentrtRuns.onState((state) => { if (state === 'live') refresh(); });
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start); else start();
})();
