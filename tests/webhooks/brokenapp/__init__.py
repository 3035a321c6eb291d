"""An app whose `agent_hooks` module fails to import (tests/webhooks/test_registry.py)."""
