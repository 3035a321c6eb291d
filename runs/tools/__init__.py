"""The tool registry and the built-in tools (DESIGN §16)."""

from runs.domain.errors import OutcomeUnknown, ToolFailure
from runs.tools import builtin  # noqa: F401 - imported for its effect: registers echo, http_get, http_post, sleep
from runs.tools.registry import REGISTRY, ToolRegistry, register

# public: register tools, and raise these from one
__all__ = ["REGISTRY", "OutcomeUnknown", "ToolFailure", "ToolRegistry", "register"]
