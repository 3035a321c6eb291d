"""Tool modules a test names in `AGENTRT_TOOL_MODULES` (operator configuration)."""
