// One socket to ws/runs/ (the status changes of the user's tenant) per page, shared by the header's count and the
// page's own script: each subscribes with onFrame; onState tells them when the socket is live again after a drop,
// so they can read again what they may have missed (the socket sends only what happens while it is open).
window.agentrtRuns = (function () {
  'use strict';
  const frames = [];
  const states = [];
  let started = false;
  let state = 'connecting';
  let opened = 0;

  function setState(s) {
    state = s;
    states.forEach((fn) => fn(s, opened > 1));
  }

  function connect() {
    const ws = new WebSocket((location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + '/ws/runs/');
    ws.onopen = () => { opened += 1; setState('live'); };
    ws.onmessage = (m) => {
      let frame;
      try { frame = JSON.parse(m.data); } catch (e) { return; }
      frames.forEach((fn) => fn(frame));
    };
    ws.onclose = () => { setState('reconnecting'); setTimeout(connect, 1000); };
  }

  function start() {
    if (started) return;
    started = true;
    connect();
  }

  return {
    onFrame(fn) { frames.push(fn); start(); },
    onState(fn) { states.push(fn); fn(state, false); start(); },
  };
})();
