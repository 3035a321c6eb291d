"""Worked examples of extending agentrt from a project's own Django apps."""
