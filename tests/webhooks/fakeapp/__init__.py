"""An app whose `agent_hooks` module is autodiscovered (tests/webhooks/test_registry.py)."""
