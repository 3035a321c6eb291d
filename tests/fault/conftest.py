"""Fixtures shared by the fault tests: offered here rather than imported into each test module (where the import
looks unused to the linter and a parameter of the same name shadows it)."""

from __future__ import annotations

from tests.fault.test_kill_points import stack as stack
