"""The tool registry and the built-in tools (DESIGN §16)."""

from runs.domain.errors import OutcomeUnknown, ToolFailure  # noqa: F401  (public: raise them from a tool)
from runs.tools import builtin  # noqa: F401  (registers echo, http_get, http_post, sleep)
from runs.tools.registry import REGISTRY, ToolRegistry, register  # noqa: F401
