"""The checkpoint repository: read the chain back, and `seed_checkpoint`.

Writes happen inside the step's fenced transactions (runs/store/repository.py,
which writes the stored form: references to the events that hold the
conversation, runs.domain.stored_form); this module reads: `latest()` walks
from the newest row back to the full snapshot it rebases, reads the events
the rows name and materialises the conversation. Rows written before the
stored form (every item inline) are read as they are. `seed_checkpoint`
rebuilds a state from the session's history and this run's own event log; it
is called when the run is created and again whenever no usable checkpoint
exists, so a run whose checkpoints were all deleted still reaches the same
end. Identical-call counts are counted from the invocation rows.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from uuid import UUID

from django.db.models import Max

from checkpoints.models import Checkpoint
from runs.domain.checkpoint import CallCounts, CheckpointState
from runs.domain.events import ANSWER_EVENTS, EventType
from runs.domain.pipeline import ANSWERED, _call_fingerprint
from runs.domain.stored_form import assistant_item, is_stored, item_from_event, materialised, referenced, tool_item
from runs.domain.values import InvocationStatus
from runs.models import Event, Run, ToolInvocation
from runs.store.cursor import sql_uuid, statement_cursor
from runs.store.json_text import parsed
from runs.store.lineage import lineage_base


def checkpoint_latest(run_id) -> CheckpointState | None:
    # Hand-written and prepared (statement_cursor): read as a run's execution
    # starts, between its claim and its first model call, where the ORM's
    # query building cost about a millisecond.
    rid = sql_uuid(UUID(str(run_id)))
    with statement_cursor() as cursor:
        cursor.execute(
            'SELECT version, "full", base_version, state FROM checkpoints WHERE run_id = %s'
            " ORDER BY version DESC LIMIT 1",
            [rid],
        )
        newest = cursor.fetchone()
    if newest is None:
        return None
    version, full, base, state = newest
    if full:
        rows = [(version, True, parsed(state))]
    else:
        if base is None:
            return None
        rows = list(
            Checkpoint.objects.filter(run_id=run_id, version__gte=base, version__lte=version)
            .order_by("version")
            .values_list("version", "full", "state")
        )
    return materialise_rows(run_id, rows)


def materialise_rows(run_id, rows: list[tuple[int, bool, dict]]) -> CheckpointState | None:
    """The state a chain of rows (a full row and its deltas, in version order)
    materialises to; the events stored rows name are read in one query. None
    when the chain is broken or names an event the log does not hold."""
    wanted = sorted({seq for _, _, state in rows if is_stored(state) for seq in referenced(state)})
    events: dict[int, tuple[str, object]] = {}
    if wanted:
        # Hand-written and prepared like checkpoint_latest's read (one shape per number of events).
        with statement_cursor() as cursor:
            cursor.execute(
                "SELECT sequence, type, payload FROM events WHERE run_id = %s AND sequence IN ("
                + ", ".join(["%s"] * len(wanted))
                + ")",
                [sql_uuid(UUID(str(run_id))), *wanted],
            )
            events = {seq: (type_, parsed(payload)) for seq, type_, payload in cursor.fetchall()}
    plain: list[tuple[int, bool, dict]] = []
    links: list[tuple[dict, int]] = []
    for version, full, state in rows:
        if is_stored(state):
            done = materialised(state, events)
            if done is None:
                return None
            state, linked = done
            links += linked
        plain.append((version, full, state))
    result = CheckpointState.materialise(plain)
    if result is not None:
        for item, seq in links:  # what the next full row names again instead of copying
            result.backed_by(item, seq)
    return result


def session_history(run) -> list[dict]:
    """The conversation the session carried before this run: each earlier
    run's input and final answer."""
    items: list[dict] = []
    earlier = (
        Run.objects.filter(session_id=run.session_id, created_at__lt=run.created_at)
        .exclude(id=run.id)
        .order_by("created_at")
        .values_list("input", "final_message")
    )
    for text, answer in earlier:
        if text:  # a fork with no message of its own has none (its conversation came from the original)
            items.append({"role": "user", "content": text})
        if answer:
            items.append({"role": "assistant", "content": answer, "tool_calls": []})
    return items


def seed_state(run) -> CheckpointState:
    """Build the state from history and the run's committed log (no checkpoint).
    A fork or a replay starts from the run it came from (`lineage_seed`)."""
    base = lineage_seed(run)
    if base is None:
        base = CheckpointState(conversation=session_history(run) + [{"role": "user", "content": run.input}], step=0)
    return catch_up(run, base, always=True)


def lineage_seed(run) -> CheckpointState | None:
    """The state a fork or a replay starts from, rebuilt from the run it came
    from (None: the run has no lineage): its conversation through the base
    step, then — for a fork given one — the fork's input. What the submit's
    seed checkpoint holds, read again when that row is gone."""
    base = lineage_base(run)
    if base is None:
        return None
    origin = Run.objects.filter(id=base.run_id).first()
    start = state_through(origin, base.step).state if origin is not None else None
    if start is None:
        raise Run.DoesNotExist(f"the run {base.run_id} that {run.id} starts from no longer holds step {base.step}")
    conversation = list(start.conversation)
    if run.forked_from_id is not None and run.input:
        conversation.append({"role": "user", "content": run.input})
    return CheckpointState(conversation=conversation, step=base.step)


@dataclass(frozen=True)
class Through:
    """A run's state through the end of a step, or why there is none."""

    state: CheckpointState | None
    problem: str | None = None


def state_through(run, step: int) -> Through:
    """The run's conversation through the end of `step`: its model turn and
    every call of it answered from the record (step 0: what the run started
    with). Read from the newest checkpoint at or before the step, caught up
    from the log; from the seed and the log when the checkpoints are gone
    (pruned, or deleted); a step before a fork's own first one from the run
    it was forked from. `problem` says why there is no such state: the run
    never finished that step's model turn, or a call of it has no recorded
    result (it still waits, or its outcome is unknown)."""
    base = lineage_base(run)
    start = base.step if base is not None else 0
    if base is not None and step < start:
        origin = Run.objects.filter(id=base.run_id).first()
        if origin is None:
            return Through(None, f"the run this one starts from is gone; step {step} is not recorded")
        return state_through(origin, step)
    state = _checkpoint_at(run.id, step) or lineage_seed(run)  # the checkpoints gone: the seed, rebuilt
    if state is None:
        conversation = session_history(run) + [{"role": "user", "content": run.input}]
        state = CheckpointState(conversation=conversation, step=0)
    return _caught_up_to(run, state, step)


def _checkpoint_at(run_id, step: int) -> CheckpointState | None:
    """The newest checkpoint of the run whose step is at most `step`, materialised (None: none, or its
    chain is broken)."""
    newest = (
        Checkpoint.objects.filter(run_id=run_id, state__step__lte=step)
        .order_by("-version")
        .values_list("version", "full", "base_version")
        .first()
    )
    if newest is None:
        return None
    version, full, base = newest
    low = version if full else base
    if low is None:
        return None
    rows = list(
        Checkpoint.objects.filter(run_id=run_id, version__gte=low, version__lte=version)
        .order_by("version")
        .values_list("version", "full", "state")
    )
    return materialise_rows(run_id, rows)


def _caught_up_to(run, state: CheckpointState, step: int) -> Through:
    """`state` brought forward from the log to the end of `step` (every model
    turn after `state.step`, each batch answered from its record), strictly:
    a call with no recorded answer, or no turn at `step`, is a problem."""
    turns: dict[int, dict] = {}
    for payload in (
        Event.objects.filter(run_id=run.id, type=EventType.MODEL_RESPONSE_COMPLETED)
        .order_by("sequence")
        .values_list("payload", flat=True)
    ):
        at = payload.get("step", 0) if isinstance(payload, dict) else 0
        if state.step < at <= step:
            turns.setdefault(at, payload)
    rows = {
        (r["step_number"], r["call_id"]): r
        for r in ToolInvocation.objects.filter(
            run_id=run.id, step_number__gte=state.step, step_number__lte=step
        ).values("step_number", "call_id", "status", "result")
    }
    logged: dict = {}
    for type_, payload in (
        Event.objects.filter(run_id=run.id, type__in=ANSWER_EVENTS).order_by("sequence").values_list("type", "payload")
    ):
        if isinstance(payload, dict) and not payload.get("awaiting_decision"):
            logged.setdefault(payload.get("call_id"), (type_, payload))
    conversation = list(state.conversation)
    at = state.step
    for turn_step in sorted(turns):
        if not _answered(conversation, at, rows, logged):
            return Through(None, f"a call of step {at} has no recorded result")
        payload = turns[turn_step]
        conversation.append(assistant_item(payload.get("text"), payload.get("tool_calls") or []))
        at = turn_step
    if at != step:
        return Through(None, f"the run has no completed model turn at step {step}")
    if not _answered(conversation, at, rows, logged):
        return Through(None, f"a call of step {step} has no recorded result (it waits, or its outcome is unknown)")
    return Through(CheckpointState(conversation=conversation, step=step))


def _answered(conversation: list[dict], step: int, rows: dict, logged: dict) -> bool:
    """Answer the last turn's calls the conversation has no answer for, from
    their rows, else from their events; False when one has neither."""
    for i in range(len(conversation) - 1, -1, -1):
        if conversation[i].get("role") == "assistant":
            calls = conversation[i].get("tool_calls") or []
            answered = {m.get("tool_call_id") for m in conversation[i + 1 :] if m.get("role") == "tool"}
            break
    else:
        return True
    for call in calls:
        call_id = call.get("id")
        if call_id in answered:
            continue
        row = rows.get((step, call_id))
        if row is not None and row["status"] in ANSWERED and row["result"] is not None:
            conversation.append(tool_item(call_id, call.get("name"), row["result"], row["status"] != "completed"))
        elif call_id in logged:
            type_, payload = logged[call_id]
            failed = type_ == EventType.TOOL_CALL_FAILED
            conversation.append(tool_item(call_id, call.get("name"), payload.get("result"), failed))
        else:
            return False
    return True


def checkpoint_current(run, *, first_lease: bool = False) -> CheckpointState:
    """The state to continue from: the newest checkpoint, caught up with the
    log when it is older than the run's committed events, else seeded; its
    identical-call counts are the calls of the run that ran.

    `first_lease`: the run's first claim (epoch 1), so no worker has written
    anything of it yet: its newest checkpoint is the submit's seed and
    nothing in the log is newer than it but `run.created` and `run.claimed`;
    the catch-up and the count of calls that ran, which would read the log
    and the run's tool calls to find nothing, are skipped (two reads fewer
    between a submit and its first model call)."""
    state = checkpoint_latest(run.id)
    if first_lease and state is not None and state.version == 1:
        state.identical_calls = CallCounts(Counter())
        return state
    state = seed_state(run) if state is None else catch_up(run, state)
    state.identical_calls = CallCounts(calls_that_ran(run.id))
    return state


def calls_that_ran(run_id) -> Counter[str]:
    """How many times each distinct call (tool and arguments) ran in the run:
    one per invocation row with an attempt (a re-run of the same row counts
    once, as in the loop, which never counts a recovered call again)."""
    return Counter(
        _call_fingerprint(tool, arguments)
        for tool, arguments in ToolInvocation.objects.filter(run_id=run_id, attempt__gte=1).values_list(
            "tool_name", "arguments"
        )
        if isinstance(arguments, dict)
    )


def catch_up(run, state: CheckpointState, *, always: bool = False) -> CheckpointState:
    """Bring a state read from a checkpoint older than the log up to the run's
    committed events (the stored form: the log is what checkpoints
    reference). Every model turn recorded after `state.step`
    (`model.response.completed` carries its calls) is appended, each earlier
    batch answered first from its invocation rows (the recorded results,
    including those written without a tool event: an operator's rejection,
    an interrupted observation, an answer to ask_user), else from the
    `tool.call.*` events. The last turn's batch is left open: the loop
    re-enters the pipeline for it, which answers recorded calls from their
    rows and never runs a call twice. The next write is a full snapshot
    numbered after every version the log has seen."""
    if not always and (run.step_count or 0) <= state.step:
        return state  # no model call was even started after the checkpoint's step
    turns: dict[int, tuple[int, dict]] = {}
    for seq, payload in (
        Event.objects.filter(run_id=run.id, type=EventType.MODEL_RESPONSE_COMPLETED)
        .order_by("sequence")
        .values_list("sequence", "payload")
    ):
        step = payload.get("step", 0) if isinstance(payload, dict) else 0
        if step > state.step and step not in turns:
            turns[step] = (seq, payload)
    if not turns and not always:
        return state
    rows: dict[tuple[int, str], dict] = {}
    for row in ToolInvocation.objects.filter(run_id=run.id, step_number__gte=state.step).values(
        "step_number", "call_id", "status", "result", "arguments", "tool_name", "attempt"
    ):
        rows[(row["step_number"], row["call_id"])] = row
    logged: dict[str | None, tuple[str, dict, int]] = {}
    for seq, type_, payload in (
        Event.objects.filter(run_id=run.id, type__in=ANSWER_EVENTS)
        .order_by("sequence")
        .values_list("sequence", "type", "payload")
    ):
        if isinstance(payload, dict) and not payload.get("awaiting_decision"):  # an unknown outcome answers nothing
            logged.setdefault(payload.get("call_id"), (type_, payload, seq))
    conversation = list(state.conversation)
    links: list[tuple[dict, int]] = []
    for step in sorted(turns):
        _answer_open_batch(conversation, state.step, rows, logged, links)
        seq, payload = turns[step]
        item = assistant_item(payload.get("text"), payload.get("tool_calls") or [])
        conversation.append(item)
        links.append((item, seq))
        state.step = step
    for item, seq in links:
        state.backed_by(item, seq)
    state.conversation = conversation
    state.needs_full = True
    top = Checkpoint.objects.filter(run_id=run.id).aggregate(v=Max("version"))["v"] or 0
    logged_versions = [
        v
        for v in Event.objects.filter(run_id=run.id, type=EventType.RUN_CHECKPOINTED).values_list(
            "payload__version", flat=True
        )
        if isinstance(v, int)
    ]
    state.version = max([state.version, top, *logged_versions])
    return state


def _answer_open_batch(
    conversation: list[dict], step: int, rows: dict, logged: dict, links: list[tuple[dict, int]]
) -> None:
    """Answer the last turn's calls the conversation has no answer for: from
    their rows, else from their events, else as interrupted; an answer its
    event holds exactly is linked to it (`links`)."""
    for i in range(len(conversation) - 1, -1, -1):
        if conversation[i].get("role") == "assistant":
            calls = conversation[i].get("tool_calls") or []
            answered = {m.get("tool_call_id") for m in conversation[i + 1 :] if m.get("role") == "tool"}
            break
    else:
        return
    for call in calls:
        call_id = call.get("id")
        if call_id in answered:
            continue
        row = rows.get((step, call_id))
        if row is not None and row["status"] in ANSWERED and row["result"] is not None:
            result, is_error = row["result"], row["status"] != InvocationStatus.COMPLETED
        elif call_id in logged:
            type_, payload, _ = logged[call_id]
            result, is_error = payload.get("result"), type_ == EventType.TOOL_CALL_FAILED
        else:
            result, is_error = {"error": "interrupted", "message": "no outcome of this call was recorded"}, True
        item = tool_item(call_id, call.get("name"), result, is_error)
        conversation.append(item)
        if call_id in logged and item == item_from_event(logged[call_id][0], logged[call_id][1]):
            links.append((item, logged[call_id][2]))
