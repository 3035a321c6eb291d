"""What joins a commit besides its rows: the intents of runs.domain.writes,
each run by the one handler registered for its type.

The composition root registers the handlers at start-up
(runs/runtime/wiring.py, `connect_intents`); the store runs them at their
place in the transaction and knows nothing of what they do, so it imports
nothing above the domain and the models:

- a unit's own intents (`UnitOfWork.intents`: a doorbell, children started,
  a child's join) run last in its transaction, in the order it carries them;
- `EnqueueDeliveries`, raised by the store for each batch of events it
  appends that something announces (`announces`, a set lookup), runs right
  after the events are inserted;
- `Wake`, raised for each commit that wrote events, runs once the
  transaction has committed (its cursor is None).

An intent with no handler raises `LookupError`, in its transaction, which
then rolls back: nothing that should have joined a commit is dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from runs.domain.writes import EventWrite, Intent

Cursor = Any
IntentT = TypeVar("IntentT", bound=Intent)

_handlers: dict[type[Intent], Callable[[Cursor, Any], None]] = {}
_announced: list[Callable[[Sequence[EventWrite]], bool]] = []  # the one predicate, once registered


def register(kind: type[IntentT], handler: Callable[[Cursor, IntentT], None]) -> None:
    """The one handler of `kind`: `handler(cursor, intent)`. Registering a type
    again replaces its handler (the composition root runs once a process)."""
    _handlers[kind] = handler


def register_announced(wants: Callable[[Sequence[EventWrite]], bool]) -> None:
    """Which batches of events something announces (their deliveries are
    written with them): asked for every unit, so it must be cheap."""
    _announced[:] = [wants]


def registered() -> frozenset[type[Intent]]:
    return frozenset(_handlers)


def run(cursor: Cursor, intent: Intent) -> None:
    """Run `intent`'s handler with the transaction's cursor."""
    handler = _handlers.get(type(intent))
    if handler is None:
        raise LookupError(
            f"no handler for the intent {type(intent).__name__}: runs.runtime.wiring.connect_intents registers them"
        )
    handler(cursor, intent)


def announces(events: Sequence[EventWrite]) -> bool:
    """Whether these events have deliveries to write in their transaction."""
    if not _announced:
        raise LookupError("nothing says which events are announced: runs.runtime.wiring.connect_intents registers it")
    return _announced[0](events)
