"""The tool registry and the built-in tools (DESIGN §16)."""
from .registry import REGISTRY, ToolRegistry, register  # noqa: F401
from . import builtin  # noqa: F401  (registers echo, http_get, http_post, sleep)
