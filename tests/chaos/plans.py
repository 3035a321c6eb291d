"""What the chaos soak runs: the fault plans a run can carry and the seeded
scripted agent each run gets (DESIGN §16's scripted provider)."""

from __future__ import annotations

import hashlib
import random

POINTS = ("tool.before_watermark", "tool.after_watermark", "tool.after_execute")
PLANS = {
    "kill@before_watermark": ("tool.before_watermark", "kill"),
    "kill@after_watermark": ("tool.after_watermark", "kill"),
    "kill@after_execute": ("tool.after_execute", "kill"),
    "kill@after_result": (None, "kill"),
    "stop@before_watermark": ("tool.before_watermark", "stop"),
    "stop@after_watermark": ("tool.after_watermark", "stop"),
    "stop@after_execute": ("tool.after_execute", "stop"),
    "cancel@before_watermark": ("tool.before_watermark", "cancel"),
    "cancel@after_watermark": ("tool.after_watermark", "cancel"),
    # killed after the watermark; the operator approves the re-run and cancels the run at once (F12 after a park)
    "approve+cancel@after_watermark": ("tool.after_watermark", "kill"),
}
PLAN_NAMES = list(PLANS)
# every http_post asks for this socket timeout: the soak's sink answers some POSTs later than it (and drops
# some), so the call ends `uncertain` in a live run (issue 11) — without any process dying
POST_TIMEOUT = 2.5

# the side-effect tool of the reconciled runs (tests/chaos/tools.py) and what configures its reconciler
RECONCILED_TOOL = "reconciled_post"
TOOL_MODULE = "tests.chaos.tools"
LOG_ENV = "AGENTRT_CHAOS_RECONCILE_LOG"
SINK_ENV = "AGENTRT_CHAOS_SINK_LOG"
SEED_ENV = "AGENTRT_CHAOS_SEED"
CONFLICT_ENV = "AGENTRT_CHAOS_CONFLICT_SHARE"
STRENGTH = {"conflict": 0, "waiting": 1, "completed": 2, "continue": 3}  # runs/tools/reconcile.py: strongest wins


def conflicts(seed: str, key: str, share: float) -> bool:
    """The seeded share of the keys whose reconciler answers `conflict` (the checker draws the same)."""
    digest = hashlib.sha256(f"{seed}:reconcile:{key}".encode()).hexdigest()
    return int(digest[:8], 16) / 2**32 < share


def rule(seed: str, key: str, share: float, seen: list[str]) -> str:
    """What the reconciler answers for `key` given the attempts of it the sink holds: `conflict` for a
    seeded share of the keys, else `continue` when the sink holds it (it took effect), else `waiting`."""
    if conflicts(seed, key, share):
        return "conflict"
    return "continue" if seen else "waiting"


# -- the agents --------------------------------------------------------------------


def agent_definition(
    index: int, rng: random.Random, host: str, plan: str, post_tool: str = "http_post"
) -> tuple[dict, int]:
    """A seeded scripted agent: 2–7 tool steps, 1–3 side effects (`post_tool`:
    http_post, or reconciled_post — the same request, with a reconciler:
    tests/chaos/tools.py) among echo / http_get calls, then a final text
    turn. Returns it and the number of side-effect calls it makes."""
    steps = rng.randint(2, 7)  # tool steps; with the final text turn, 3–8 steps (RELIABILITY §4)
    posts = [rng.randint(1, steps) for _ in range(rng.randint(1, 3))]
    if plan != "none":
        posts[0] = rng.randint(1, min(2, steps))  # the planned point comes early
    first_post = min(posts)
    turns = []
    for s in range(1, steps + 1):
        calls = []
        for k in range(posts.count(s)):
            calls.append(
                {
                    "name": post_tool,
                    "arguments": {
                        "url": f"http://{host}/effect",
                        "json": {"run": index, "step": s, "n": k},
                        "timeout_seconds": POST_TIMEOUT,
                    },
                }
            )
        for k in range(rng.randint(0 if calls else 1, 2)):
            if rng.random() < 0.5:
                calls.append({"name": "echo", "arguments": {"text": f"run {index} step {s} look {k}"}})
            else:
                calls.append({"name": "http_get", "arguments": {"url": f"http://{host}/get/{index}/{s}/{k}"}})
        rng.shuffle(calls)
        turns.append({"tool_calls": calls, "delay_ms": rng.randint(50, 250)})
    turns.append({"text": f"run {index} done", "delay_ms": rng.randint(50, 250)})
    if plan == "kill@after_result":
        turns[first_post]["delay_ms"] = 700  # the model call after the first result: the after-result window
    definition = {
        "name": f"chaos-{index:04d}",
        "instructions": "chaos soak agent",
        "model": {"provider": "scripted", "turns": turns},
        "tools": ["echo", "http_get", post_tool],
        "policy": {"default": "allow"},
    }
    return definition, len(posts)


class RunSpec:
    def __init__(
        self, index: int, plan: str, agent: str, posts: int, cancel_after: float | None, reconciled: bool = False
    ):
        self.index = index
        self.reconciled = reconciled
        self.plan = plan
        self.agent = agent
        self.posts = posts
        self.cancel_after = cancel_after
        self.run_id: str | None = None
        self.submitted_at: float | None = None
        self.planned_done = False
        self.approvals_seen = 0
