"""Sweep locks: a transaction-scoped advisory lock per sweep (the statement is
in runs/store/locks.py), so a sweep that misses it skips."""

from __future__ import annotations

from runs.store.locks import try_transaction_lock


def try_sweep_lock(name: str) -> bool:
    """Call inside `transaction.atomic()`; True when this node may sweep."""
    return try_transaction_lock(name)
