"""Forks and replays: new runs that start from another run's record.

A fork continues a run's conversation after one of its steps — read from its
checkpoint chain and its log, never run again — under the version asked for
(default: the one the original is pinned to), with limits of its own. Its
side effects wait for a person unless `effects="policy"` (runs.runtime.wiring
wraps the policy; the approval card says what the original did there). A
replay starts where its original started and calls the model again; every
call it proposes is answered from the original's record or ends it
`replay_diverged` (runs.domain.pipeline.replay): it executes nothing.

Both are runs like any other: created in the caller's tenant by a member who
may submit, counted against the tenant's quota, seeded with a checkpoint and
rung in one transaction, then executed by the same workers, fence and lease.
Each gets a session of its own (the original's session goes on without it)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import transaction

from checkpoints.models import Checkpoint
from checkpoints.repository import state_through
from ops.tracing import submit_context
from runs.clock import CLOCK, IDS
from runs.domain.checkpoint import CheckpointState
from runs.domain.scrub import scrub_text
from runs.domain.writes import EventWrite
from runs.errors import InvalidInput, PublishForbidden, RunNotFinished, RunNotForkable
from runs.models import TERMINAL, AgentVersion, Run, Session
from runs.runtime.enqueue import enqueue_drive
from runs.services.agent_schema import resolve_limits
from runs.services.submit import _check_quota, _principal_stamp
from runs.services.validation import check_text
from runs.store.cursor import statement_cursor
from runs.store.events import append_events
from runs.store.lineage import own_start

EFFECTS = ("approve", "policy")


def run_fork(
    *,
    run: Run,
    from_step: Any,
    agent_version: Any = None,
    input: Any = None,
    effects: Any = None,
    principal: Any = None,
    may_publish: bool = False,
) -> Run:
    """A new run whose conversation is `run`'s through the end of step
    `from_step`, continuing at the next step. `input`: a user message added
    after that step. `effects`: "approve" (default: each side-effect call waits
    for a person) or "policy" (the agent's policy decides, as for a fresh run;
    `may_publish` — the permission to publish agents — is required).
    `principal` is the user the fork acts for."""
    if isinstance(from_step, bool) or not isinstance(from_step, int):
        raise InvalidInput("from_step must be an integer", fields={"from_step": ["must be an integer"]})
    effects = "approve" if effects is None else effects
    if effects not in EFFECTS:
        raise InvalidInput("effects must be approve or policy", fields={"effects": ["must be one of approve, policy"]})
    if input is not None:
        input = scrub_text(check_text(input, "input"))
    if effects == "policy" and not may_publish:
        raise PublishForbidden("a fork whose side effects the policy decides needs the runs.publish_agent permission")
    _not_a_child(run, "forked")
    _detail_kept(run, "forked")
    if not 0 <= from_step <= run.step_count:
        raise InvalidInput(
            f"from_step must be from 0 to {run.step_count}",
            fields={"from_step": [f"must be from 0 to {run.step_count} (the run's last step)"]},
        )
    version = _version_of(run, agent_version)
    through = state_through(run, from_step)
    if through.state is None:
        raise InvalidInput(
            f"cannot fork from step {from_step}: {through.problem}", fields={"from_step": [through.problem or ""]}
        )
    conversation = list(through.state.conversation)
    if input:
        conversation.append({"role": "user", "content": input})
    return _create(
        origin=run,
        version=version,
        conversation=conversation,
        step=from_step,
        input=input or "",
        principal=principal,
        lineage={"forked_from_id": run.id, "forked_from_step": from_step, "fork_effects": effects},
    )


def run_replay(*, run: Run, agent_version: Any = None, principal: Any = None) -> Run:
    """A new run that starts where `run` started and calls the model again
    under `agent_version` (default: the version `run` is pinned to); each call
    it proposes is answered with `run`'s recorded result for that position,
    or ends it `replay_diverged`. `run` must have ended."""
    _not_a_child(run, "replayed")
    _detail_kept(run, "replayed")
    if run.status not in TERMINAL:
        raise RunNotFinished(f"the run is {run.status}; a run is replayed once it has ended")
    version = _version_of(run, agent_version)
    start = own_start(run.id)
    through = state_through(run, start)
    if through.state is None:
        raise RunNotForkable(f"the run's start is no longer recorded: {through.problem}")
    return _create(
        origin=run,
        version=version,
        conversation=list(through.state.conversation),
        step=start,
        input=run.input,
        principal=principal,
        lineage={"replay_of_id": run.id},
    )


def _not_a_child(run: Run, done: str) -> None:
    """A child run is never forked or replayed on its own: it runs under its
    parent's budget and policies, which a run of its own would escape."""
    if run.parent_id is not None:
        raise RunNotForkable(f"a child run is not {done} on its own; {done[:-2]} its parent instead")


def _detail_kept(run: Run, done: str) -> None:
    """A run whose detail retention removed has no recorded steps or calls to start from."""
    if run.detail_removed_at is not None:
        raise RunNotForkable(
            f"the run's detail (its events, tool calls and checkpoints) was removed by retention on "
            f"{run.detail_removed_at:%Y-%m-%d}; it cannot be {done}"
        )


def _version_of(run: Run, wanted: Any) -> AgentVersion:
    """The version of `run`'s agent asked for: None (the version `run` is
    pinned to), "latest", or a version as the agents API shows it (its `id`
    or its `version` hash)."""
    versions = AgentVersion.objects.filter(agent_id=run.agent_id)
    if wanted is None:
        found = versions.filter(version=run.agent_version).first()
        if found is None:
            raise InvalidInput(
                "the version the run is pinned to no longer exists",
                fields={"agent_version": ["the run's version no longer exists; name one"]},
            )
        return found
    if not isinstance(wanted, str) or not wanted or len(wanted) > 64:
        raise InvalidInput("agent_version must be a version id", fields={"agent_version": ["must be a version id"]})
    if wanted == "latest":
        found = versions.filter(version=run.agent.latest_version).first()
    else:
        try:
            found = versions.filter(id=UUID(wanted)).first()
        except ValueError:
            found = versions.filter(version=wanted).first()
    if found is None:
        raise InvalidInput(
            f"no version {wanted!r} of agent {run.agent.name!r}",
            fields={"agent_version": [f"unknown version of agent {run.agent.name!r}"]},
        )
    return found


def _create(
    *,
    origin: Run,
    version: AgentVersion,
    conversation: list[dict],
    step: int,
    input: str,
    principal: Any,
    lineage: dict[str, Any],
) -> Run:
    """The new run, its session, its seed checkpoint (the conversation it
    starts from, at `step`) and `run.created`, with `drive_run` rung, in one
    transaction, under the tenant's quota."""
    limits = resolve_limits(settings.AGENTRT_DEFAULT_LIMITS, version.definition.get("limits") or {}, {})
    stamp = _principal_stamp(principal)
    now = CLOCK.now()
    with transaction.atomic(durable=True):
        _check_quota(origin.tenant)
        session = Session.objects.create(
            id=IDS.new_id(), tenant_id=origin.tenant_id, agent_id=origin.agent_id, created_at=now
        )
        run = Run(
            id=IDS.new_id(),
            tenant_id=origin.tenant_id,
            session=session,
            agent_id=origin.agent_id,
            agent_version=version.version,
            input=input,
            limits=limits.model_dump(mode="json"),
            deadline_at=now + timedelta(seconds=limits.deadline_seconds) if limits.deadline_seconds else None,
            usage={},
            step_count=step,  # its own steps are numbered on from the original's (steps budgeted from 1)
            **stamp,
            **lineage,
            created_at=now,
            updated_at=now,
        )
        run.save(force_insert=True)
        row = CheckpointState(conversation=conversation, step=step).next_checkpoint("seed", now)
        Checkpoint.objects.create(
            id=IDS.new_id(),
            tenant_id=run.tenant_id,
            run=run,
            version=row.version,
            full=True,
            base_version=None,
            trigger="seed",
            state=row.state,
            code_version=settings.AGENTRT_CODE_VERSION,
            created_at=now,
        )
        created = {
            "agent": origin.agent.name,
            "agent_version": run.agent_version,
            "input": run.input[:2000],
            **_lineage_fields(run),
            **submit_context(run.id),
        }
        with statement_cursor() as cursor:
            append_events(
                cursor,
                tenant_id=run.tenant_id,
                session_id=run.session_id,
                run_id=run.id,
                epoch=0,
                events=[EventWrite("run.created", created, now)],
            )
        enqueue_drive(run.id)
    return Run.objects.select_related("agent").get(id=run.id)


def _lineage_fields(run: Run) -> dict[str, Any]:
    if run.forked_from_id is not None:
        return {
            "forked_from": {"run": str(run.forked_from_id), "step": run.forked_from_step},
            "effects": run.fork_effects,
        }
    if run.replay_of_id is not None:
        return {"replay_of": str(run.replay_of_id)}
    return {}
