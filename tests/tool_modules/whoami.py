"""A read-only tool that reports the principal it was given (`ctx.principal`):
`AGENTRT_TOOL_MODULES=tests.tool_modules.whoami` in a cluster, or imported by
an in-process test. Each call is appended to `SEEN` and, when `WHOAMI_LOG`
names a file, to that file as one JSON line (another process's calls)."""

from __future__ import annotations

import json
import os

from runs.tools import register

SEEN: list[dict] = []


@register(name="whoami", read_only=True, parameters={"type": "object", "properties": {}})
def whoami(arguments, context):
    principal = context.principal
    seen = {
        "run_id": str(context.run_id),
        "kind": principal.kind if principal else None,
        "username": principal.username if principal else None,
        "user_id": principal.user_id if principal else None,
        "scopes": sorted(principal.scopes) if principal else None,
    }
    SEEN.append(seen)
    path = os.environ.get("WHOAMI_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(seen) + "\n")
    return {"you_are": seen["username"]}
