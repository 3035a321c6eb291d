// How the live pages write times, durations and costs (the server writes the same for the first paint:
// runs/services/run_list.py and runs/templatetags/console.py). Text only: callers set it with textContent.
window.agentrtFmt = (function () {
  'use strict';

  function pad(n, w) { return String(n).padStart(w || 2, '0'); }

  // A duration in seconds: 850 ms, 12.3 s, 4 min 05 s, 2 h 03 min, 3 d 4 h.
  function duration(seconds) {
    if (seconds === null || seconds === undefined || !isFinite(seconds)) return '';
    const s = Math.max(0, seconds);
    if (s < 1) return Math.round(s * 1000) + ' ms';
    if (s < 60) return (Math.floor(s * 10) / 10).toFixed(1) + ' s';
    const total = Math.floor(s);
    if (total < 3600) return Math.floor(total / 60) + ' min ' + pad(total % 60) + ' s';
    if (total < 86400) return Math.floor(total / 3600) + ' h ' + pad(Math.floor((total % 3600) / 60)) + ' min';
    return Math.floor(total / 86400) + ' d ' + Math.floor((total % 86400) / 3600) + ' h';
  }

  // How long ago an ISO time was: just now, 42 s ago, 5 min ago, 3 h ago, 2 d ago.
  function ago(iso, now) {
    const t = Date.parse(iso);
    if (isNaN(t)) return '';
    const s = Math.max(0, ((now || Date.now()) - t) / 1000);
    if (s < 5) return 'just now';
    if (s < 60) return Math.floor(s) + ' s ago';
    if (s < 3600) return Math.floor(s / 60) + ' min ago';
    if (s < 86400) return Math.floor(s / 3600) + ' h ago';
    return Math.floor(s / 86400) + ' d ago';
  }

  // The time of day of an ISO time, to the millisecond, in the browser's zone: 14:03:07.125.
  function clock(iso) {
    const d = new Date(iso);
    if (isNaN(d.getTime())) return '';
    return pad(d.getHours()) + ':' + pad(d.getMinutes()) + ':' + pad(d.getSeconds()) + '.' + pad(d.getMilliseconds(), 3);
  }

  // The absolute time shown on hover: the ISO time the server sent (UTC) and the browser's local reading.
  function absolute(iso) {
    const d = new Date(iso);
    if (isNaN(d.getTime())) return String(iso || '');
    return String(iso) + ' (' + d.toLocaleString() + ')';
  }

  // The time from one event to the next: +0 ms, +850 ms, +1.2 s, +4 min 05 s.
  function delta(fromIso, toIso) {
    const a = Date.parse(fromIso), b = Date.parse(toIso);
    if (isNaN(a) || isNaN(b)) return '';
    return '+' + duration((b - a) / 1000);
  }

  // A cost in USD with four decimals everywhere: 0.0000, 0.0125, 1.5000.
  function cost(value) {
    const n = Number(value);
    return (isFinite(n) ? n : 0).toFixed(4);
  }

  function seconds(fromIso, toIso) {
    const a = Date.parse(fromIso), b = toIso ? Date.parse(toIso) : Date.now();
    return isNaN(a) || isNaN(b) ? null : (b - a) / 1000;
  }

  return { duration, ago, clock, absolute, delta, cost, seconds };
})();
