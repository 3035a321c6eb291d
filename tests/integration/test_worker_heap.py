"""A worker process moves its long-lived heap out of the cyclic collector's
reach after its first task (runs/tasks.py), once."""

from __future__ import annotations

import gc
import uuid
import weakref

import pytest

from runs import tasks

pytestmark = pytest.mark.django_db(transaction=True)


class Node:
    me: Node


def test_the_first_task_freezes_the_heap_and_later_tasks_do_not_again(monkeypatch):
    monkeypatch.setattr(tasks, "_heap_frozen", False)
    gc.unfreeze()
    try:
        assert gc.get_freeze_count() == 0
        assert tasks.drive_run(str(uuid.uuid4())) == "not_claimed"
        frozen = gc.get_freeze_count()
        assert frozen > 10_000  # Django, the apps and the runtime: everything alive after the first task
        cycle = Node()
        cycle.me = cycle  # created afterwards: the collector's, as before
        gone = weakref.ref(cycle)
        del cycle
        assert tasks.drive_run(str(uuid.uuid4())) == "not_claimed"
        # Not frozen a second time (frozen objects can still be freed by refcount).
        assert gc.get_freeze_count() <= frozen
        gc.collect()
        assert gone() is None
    finally:
        gc.unfreeze()
