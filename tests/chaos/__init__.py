"""Seeded chaos soak (RELIABILITY §3–4): `python -m tests.chaos.soak`, its pure
invariant checker (`checker.py`) and a small CI version (`test_soak_small.py`)."""
