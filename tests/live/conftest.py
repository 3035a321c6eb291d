"""Fixtures shared by the live-page tests: offered here rather than imported into each test module (where the
import looks unused to the linter and a parameter of the same name shadows it)."""

from __future__ import annotations

from tests.live.test_browser import server as server
