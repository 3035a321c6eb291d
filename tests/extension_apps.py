"""Loaded with `-p tests.extension_apps` (pytest.ini) before Django's
settings: the suite, and every process it starts, installs the worked example
app (examples/payments) through `AGENTRT_EXTRA_APPS`, so its `agent_tools`
module is found by discovery like a project's own app (issue 13)."""

import os

os.environ.setdefault("AGENTRT_EXTRA_APPS", "examples.payments")
