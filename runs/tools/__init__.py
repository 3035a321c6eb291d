"""The tool registry and the built-in tools.

What a project's `agent_tools` module uses: `register` (a typed function is
a tool), `ToolExecutionContext` (its second parameter), `ToolFailure` /
`OutcomeUnknown` (raise them to say the call failed / may have taken
effect), and `Reconciliation` / `Pause` (a reconciler's answer).
"""

from runs.domain.errors import OutcomeUnknown, ToolFailure  # noqa: F401  (public: raise them from a tool)
from runs.domain.pipeline import ToolExecutionContext  # noqa: F401  (public: a tool's second parameter)
from runs.tools import builtin  # noqa: F401  (registers echo, http_get, http_post, sleep, ask_user)
from runs.tools.reconcile import Pause, Reconciliation  # noqa: F401
from runs.tools.registry import REGISTRY, DuplicateTool, ToolRegistry, register  # noqa: F401
