"""A project app with its own model provider (issue 13, item 4): installed
with `AGENTRT_EXTRA_APPS=tests.provider_app`, its `agent_providers` module is
found by discovery like `admin.py`. In-process tests name the module in
`AGENTRT_PROVIDER_MODULES` instead (the suite does not install this app)."""
