"""A hook module that fails to import (tests/webhooks/test_registry.py)."""

raise ImportError("this hook module is broken on purpose")
