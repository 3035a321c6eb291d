"""A run's rows are made with time-ordered ids (issue 16 item 5): PostgreSQL's
uuid order follows the order the loop wrote them, so each insert goes to the
right edge of its primary-key index (or, for checkpoints, beside the run's
others) instead of a random leaf of a large table's index."""

from __future__ import annotations

import pytest

from checkpoints.models import Checkpoint
from runs.models import ModelCall, ToolInvocation
from runs.runtime.executor import run_drive
from runs.store.repository import _checkpoint_id

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_runs_rows_sort_by_id_in_the_order_the_loop_wrote_them(load_agent, submit):
    turns = [{"tool_calls": [{"name": "echo", "arguments": {"text": f"step {i}"}}]} for i in range(12)]
    load_agent(turns=[*turns, {"text": "done"}])
    run = submit()
    assert run_drive(run_id=run.id).kind.value == "completed"
    assert run.id.version == 7 and run.session_id.version == 7
    calls = list(ModelCall.objects.filter(run_id=run.id).order_by("id").values_list("step_number", flat=True))
    assert calls == list(range(1, 14))
    tools = list(ToolInvocation.objects.filter(run_id=run.id).order_by("id").values_list("step_number", flat=True))
    assert tools == list(range(1, 13))
    written = Checkpoint.objects.filter(run_id=run.id, version__gt=1).values_list("id", "version")
    assert len(written) >= 24
    assert all(cid == _checkpoint_id(run.id, version) for cid, version in written)
    assert {cid.int >> 80 for cid, _ in written} == {run.id.int >> 80}  # the run's 48-bit time prefix
