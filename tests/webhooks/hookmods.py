"""Post-run hooks for the tests (named in AGENTRT_HOOK_MODULES of a real qcluster).

`test.record` appends what it saw to AGENTRT_TEST_HOOK_LOG; `test.explode` always raises."""

import json
import os

from runs import hooks


@hooks.register("test.record")
def record(run_view):
    with open(os.environ["AGENTRT_TEST_HOOK_LOG"], "a") as fh:
        fh.write(
            json.dumps(
                {
                    "run": run_view.run["id"],
                    "status": run_view.run["status"],
                    "event": run_view.event,
                    "delivery": run_view.delivery,
                    "attempt": run_view.attempt,
                }
            )
            + "\n"
        )


@hooks.register("test.explode")
def explode(run_view):
    raise RuntimeError(f"the hook exploded on run {run_view.run['id']}")
