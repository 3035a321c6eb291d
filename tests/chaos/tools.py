"""The soak's side-effect tool with a reconciler (issue 33 item 6: the reconciler on for part of the runs).

A share of the soak's runs (`--reconciled-fraction`) make their side effects with `reconciled_post`
instead of `http_post`: the same request (it calls the built-in tool, so the same watermark, key,
timeouts and unknown outcomes), registered with a per-tool reconciler (runs/tools/reconcile.py). When
such a call's outcome is unknown — its worker died or stopped between the watermark and the answer, or
the answer never came — Resume asks `ask_the_sink` instead of an operator. The soak's processes load
this module through AGENTRT_TOOL_MODULES.

The reconciler asks the effect sink, the system the effect lands in, whether it holds the call's
Idempotency-Key: it reads the sink's log (AGENTRT_CHAOS_SINK_LOG), which the sink writes for every POST
before it answers, drops or holds it. Its answer, seed 000's outcomes:

- `conflict` for a seeded share of the keys (AGENTRT_CHAOS_CONFLICT_SHARE, drawn from
  AGENTRT_CHAOS_SEED and the key): "the external state contradicts the record", the run fails
  `reconcile_conflict`;
- else `continue` when the sink holds the key (the effect happened; nothing is sent again and the
  agent sees the call interrupted);
- else `waiting` with a pause: nobody knows better than an operator, who approves a re-send (one,
  same key) or rejects.

Each answer is appended to AGENTRT_CHAOS_RECONCILE_LOG (one JSON line, one write) with what it read and
when it started reading, so the checker can judge both the answer (`tests.chaos.plans.rule`) and what the runtime did
with it.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from runs.tools.builtin import TIMEOUT_ARG, http_post
from runs.tools.registry import register
from tests.chaos.plans import CONFLICT_ENV, LOG_ENV, RECONCILED_TOOL, SEED_ENV, SINK_ENV, rule


def sink_attempts(path: str, key: str) -> list[str]:
    """The X-Agentrt-Attempt of every POST with this Idempotency-Key in the sink's log."""
    seen = []
    try:
        with open(path) as fh:
            for line in fh:
                if key not in line:
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # a line being written
                if record.get("key") == key:
                    seen.append(str(record.get("attempt")))
    except FileNotFoundError:
        pass
    return seen


def ask_the_sink(view: Any, invocation: dict) -> dict:
    key = invocation.get("idempotency_key") or ""
    t_read = time.time()
    seen = sink_attempts(os.environ.get(SINK_ENV, ""), key)
    seed = os.environ.get(SEED_ENV, "")
    answer = rule(seed, key, float(os.environ.get(CONFLICT_ENV) or 0), seen)
    entry = {
        "t_read": t_read,
        "t": time.time(),
        "pid": os.getpid(),
        "run": str(view.run.get("id")),
        "invocation": str(invocation.get("id")),
        "attempt": invocation.get("attempt"),
        "status": invocation.get("status"),
        "key": key,
        "seen": seen,
        "answer": answer,
    }
    path = os.environ.get(LOG_ENV)
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(entry) + "\n").encode())  # one write: lines of several processes never mix
        finally:
            os.close(fd)
    if answer == "conflict":
        return {"outcome": "conflict", "detail": f"the sink's ledger contradicts the record of {key}"}
    if answer == "continue":
        return {"outcome": "continue"}
    return {
        "outcome": "waiting",
        "pause": {
            "outcome": "require_approval",
            "capability": {"tool": RECONCILED_TOOL, "check": "sink-ledger"},
            # the attempt is kept: an approval names the attempt whose outcome it decides
            "presentation": {"attempt": invocation.get("attempt"), "sink": "no POST with this key"},
        },
    }


@register(
    name=RECONCILED_TOOL,
    description="POST a JSON body to a URL on an allowed host (a side effect whose tool reconciles itself).",
    parameters={
        "type": "object",
        "properties": {
            "url": {"type": "string", "maxLength": 2048},
            "json": {"type": "object"},
            "timeout_seconds": TIMEOUT_ARG,
        },
        "required": ["url", "json"],
        "additionalProperties": False,
    },
    read_only=False,
    side_effect="external_write",
    timeout_seconds=20,
    reconciler=ask_the_sink,
)
def reconciled_post(arguments, context):
    return http_post(arguments, context)
