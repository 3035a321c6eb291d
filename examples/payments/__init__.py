"""A worked example (issue 13, item 6): a team's own side-effect tool with
typed arguments, a journal written before each call starts, and a reconciler
that reads the journal and the payment gateway to answer for a call whose
outcome is unknown (seed 000, "What the consumer does").

Install it like any app (`INSTALLED_APPS`, or `AGENTRT_EXTRA_APPS=examples.payments`
here); agentrt finds `agent_tools.py` by itself. `PAYMENTS_GATEWAY_URL` names
the gateway; `python -m examples.payments.fake_gateway` runs a local fake one.
`PAYMENTS_TENANT` names the one tenant whose runs may charge through it
(unset: none may).
"""
