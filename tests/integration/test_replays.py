"""Replays (issue 37 item 3), executed in-process on the real schema: the
model is called again, every call is answered from the original's record
and none is executed — side effects and reads alike; the first proposal that
differs, or a call whose outcome the original never learned, ends the run
FAILED `replay_diverged` with both calls recorded."""

from __future__ import annotations

import pytest

from approvals.models import Approval
from approvals.services import approval_decide
from runs.errors import RunNotFinished
from runs.models import Event, Run, ToolInvocation
from runs.runtime.executor import run_drive
from runs.services.lineage import run_fork, run_replay

pytestmark = pytest.mark.django_db(transaction=True)


def post(sink, n):
    return {"tool_calls": [{"name": "http_post", "arguments": {"url": sink.url, "json": {"effect": n}}}]}


def reload(run):
    return Run.objects.select_related("agent").get(id=run.id)


def drive(run):
    run_drive(run_id=run.id)
    return reload(run)


@pytest.fixture
def original(load_agent, submit, sink):
    """Step 1 reads (http_get of the sink), step 2 and 3 send, step 4 answers."""
    read = {"tool_calls": [{"name": "http_get", "arguments": {"url": sink.url}}]}
    load_agent(
        name="payer", turns=[read, post(sink, 1), post(sink, 2), {"text": "paid"}], tools=("http_get", "http_post")
    )
    run = drive(submit(agent="payer", text="pay"))
    assert run.status == "COMPLETED" and sink.count() == 2 and sink.gets == 1
    return run


def test_a_replay_with_the_same_version_completes_and_executes_nothing(original, sink):
    replay = run_replay(run=original)
    assert replay.replay_of_id == original.id and replay.agent_version == original.agent_version
    replay = drive(replay)
    assert replay.status == "COMPLETED" and replay.final_message == "paid", replay.failure
    assert sink.count() == 2 and sink.gets == 1  # no send, and not even the read ran again
    rows = list(ToolInvocation.objects.filter(run=replay).order_by("step_number"))
    assert [(r.step_number, r.tool_name, r.status, r.attempt, r.effect_sent_at) for r in rows] == [
        (1, "http_get", "completed", 0, None),
        (2, "http_post", "completed", 0, None),
        (3, "http_post", "completed", 0, None),
    ]
    originals = {r.step_number: r for r in ToolInvocation.objects.filter(run=original)}
    assert all(r.result == originals[r.step_number].result for r in rows)
    answers = list(Event.objects.filter(run=replay, type="tool.call.completed").order_by("sequence"))
    assert len(answers) == 3 and all(e.payload["replayed"] is True and e.payload["executed"] is False for e in answers)
    assert [e.payload["original_invocation"] for e in answers] == [str(originals[s].id) for s in (1, 2, 3)]
    assert not Event.objects.filter(run=replay, type="tool.call.started").exists()  # no watermark: nothing sent
    assert replay.usage["tool_calls"] == 0 and replay.usage["model_calls"] == 4


def test_a_replay_whose_step_2_arguments_differ_fails_replay_diverged_and_sends_nothing(original, load_agent, sink):
    read = {"tool_calls": [{"name": "http_get", "arguments": {"url": sink.url}}]}
    changed = load_agent(
        name="payer", turns=[read, post(sink, 7), post(sink, 2), {"text": "paid"}], tools=("http_get", "http_post")
    )
    replay = drive(run_replay(run=original, agent_version=changed.version))
    assert replay.status == "FAILED" and replay.failure["reason"] == "replay_diverged"
    details = replay.failure["details"]
    assert details["reason"] == "different_call" and details["step"] == 2 and details["call_index"] == 0
    assert details["original"]["arguments"]["json"] == {"effect": 1}
    assert details["replayed"]["arguments"]["json"] == {"effect": 7}
    assert sink.count() == 2 and sink.gets == 1
    # Both calls are in the log too: the replay's proposal, not run, beside the failure naming the original's.
    proposed = Event.objects.get(run=replay, type="tool.call.proposed", payload__step=2)
    assert proposed.payload["arguments"]["json"] == {"effect": 7}
    not_run = ToolInvocation.objects.get(run=replay, step_number=2)
    assert not_run.status == "failed" and not_run.result["error"] == "replay_diverged" and not_run.attempt == 0
    failed = Event.objects.get(run=replay, type="run.failed").payload["failure"]
    assert failed["details"]["original"]["invocation"] == str(
        ToolInvocation.objects.get(run=original, step_number=2).id
    )


@pytest.mark.parametrize(
    "turns, reason, step",
    [
        # a final answer where the original read: a call missing
        (lambda sink: [{"text": "nothing to do"}], "call_missing", 1),
        # another tool at step 1
        (lambda sink: [post(sink, 1), {"text": "x"}], "different_call", 1),
        # one call more in step 1's batch
        (
            lambda sink: [
                {
                    "tool_calls": [
                        {"name": "http_get", "arguments": {"url": sink.url}},
                        {"name": "http_get", "arguments": {"url": sink.url + "?again"}},
                    ]
                },
                {"text": "x"},
            ],
            "no_call_recorded",
            1,
        ),
    ],
)
def test_every_kind_of_difference_diverges(original, load_agent, sink, turns, reason, step):
    changed = load_agent(name="payer", turns=turns(sink), tools=("http_get", "http_post"))
    replay = drive(run_replay(run=original, agent_version=changed.version))
    assert replay.status == "FAILED" and replay.failure["reason"] == "replay_diverged"
    assert (replay.failure["details"]["reason"], replay.failure["details"]["step"]) == (reason, step)
    assert sink.count() == 2 and sink.gets == 1


def test_a_replay_stops_at_a_call_whose_outcome_the_original_never_learned(load_agent, submit, sink, operator):
    load_agent(name="payer", turns=[post(sink, 1), {"text": "paid"}], tools=("http_post",))
    sink.behaviours = ["close"]  # sent, and no answer: the outcome is unknown
    run = drive(submit(agent="payer", text="pay"))
    assert run.status == "WAITING_FOR_APPROVAL" and sink.count() == 1
    with pytest.raises(RunNotFinished):
        run_replay(run=run)
    approval = Approval.objects.get(run=run, status="pending")
    approval_decide(
        user=operator, approval_id=approval.id, approve=False, request_hash=approval.request_hash, reason="", via="api"
    )
    run = reload(run)
    assert run.status == "FAILED"
    replay = drive(run_replay(run=run))
    assert replay.status == "FAILED" and replay.failure["reason"] == "replay_diverged"
    assert replay.failure["details"]["reason"] == "outcome_unknown"
    assert sink.count() == 1


def test_a_replay_of_a_fork_replays_the_forks_own_steps(original, sink, operator):
    fork = drive(run_fork(run=original, from_step=3, principal=operator, effects="policy", may_publish=True))
    assert fork.status == "COMPLETED" and sink.count() == 2  # step 4 answers: nothing sent
    replay = drive(run_replay(run=fork))
    assert replay.status == "COMPLETED" and replay.step_count == 4 and replay.usage["steps"] == 1
    assert sink.count() == 2 and sink.gets == 1


def test_a_replay_answers_a_question_from_the_record_and_never_waits(load_agent, submit):
    from runs.services.inputs import run_input

    ask = {"tool_calls": [{"name": "ask_user", "arguments": {"question": "Which region?"}}]}
    load_agent(name="asker", turns=[ask, {"text": "deploying"}], tools=("ask_user",))
    run = drive(submit(agent="asker", text="deploy"))
    assert run.status == "WAITING_FOR_USER"
    run_input(run=run, text="eu-west", by="alice")
    run = drive(run)
    assert run.status == "COMPLETED"
    replay = drive(run_replay(run=run))
    assert replay.status == "COMPLETED" and replay.final_message == "deploying", replay.failure
    assert not Event.objects.filter(run=replay, type="run.waiting_for_user").exists()
    answered = Event.objects.get(run=replay, type="tool.call.completed")
    assert answered.payload["replayed"] is True and answered.payload["result"] == {"answer": "eu-west"}
