"""Fork, replay and compare (REST): each parses, authorizes (the caller acts
on its own tenant's run; another tenant's is 404), calls one service and
renders the run's REST shape."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.response import Response

from runs.api import serializers as s
from runs.api.views import (
    ID_PARAM,
    PUBLISH_PERMISSION,
    READ_ERRORS,
    WRITE_ERRORS,
    ApiView,
    actionable_run,
    errors,
    parse,
    visible_run,
)
from runs.services.compare import run_compare
from runs.services.lineage import run_fork, run_replay


class RunFork(ApiView):
    """Fork a run from one of its steps."""

    throttle_scope = "runs_create"  # a fork is a submit

    @extend_schema(
        operation_id="runs_fork",
        tags=["runs"],
        summary="Fork a run from one of its steps",
        description="201 with the new run (`forked_from`): its conversation is the run's through the end of "
        "`from_step` (nothing before it runs again), continuing at the next step under `agent_version` with "
        "limits of its own, in a session of its own. Each side-effect call it proposes waits for an approval "
        "whose card says what the original did at that position (`effects: approve`), unless `effects: policy` "
        "(needs `runs.publish_agent`, 403 otherwise). 400 naming the field: `from_step` out of range or not "
        "finished (a call of it without a recorded result), an unknown `agent_version`, a bad `effects`; 409 "
        "`run_not_forkable` for a child run; 429 `quota_exceeded`.",
        parameters=[ID_PARAM],
        request=s.ForkRequest,
        responses={201: s.RunOut, **errors(*WRITE_ERRORS, 404, 409)},
    )
    def post(self, request, id):
        run = actionable_run(request, id)
        data = parse(s.ForkRequest, request.data)
        fork = run_fork(
            run=run,
            from_step=data["from_step"],
            agent_version=data.get("agent_version"),
            input=data.get("input"),
            effects=data.get("effects"),
            principal=request.user,
            may_publish=request.user.has_perm(PUBLISH_PERMISSION),
        )
        return Response(s.RunOut(fork).data, status=status.HTTP_201_CREATED)


class RunReplay(ApiView):
    """Replay a run against an agent version."""

    throttle_scope = "runs_create"

    @extend_schema(
        operation_id="runs_replay",
        tags=["runs"],
        summary="Replay a finished run against an agent version",
        description="201 with the new run (`replay_of`): it starts where the run started and calls the model "
        "for real, but executes no tool call: a call proposed at the same position with the same tool and "
        "arguments as the original's gets the original's recorded result (`replayed: true` on its "
        "`tool.call.completed` / `tool.call.failed`); the first that differs ends it FAILED `replay_diverged`, "
        "both calls in the failure's details, as does reaching a call whose outcome the original never learned "
        "(`outcome_unknown`). 409 `run_not_finished` unless the run has ended; 409 `run_not_forkable` for a "
        "child run; 400 for an unknown `agent_version`; 429 `quota_exceeded`.",
        parameters=[ID_PARAM],
        request=s.ReplayRequest,
        responses={201: s.RunOut, **errors(*WRITE_ERRORS, 404, 409)},
    )
    def post(self, request, id):
        run = actionable_run(request, id)
        data = parse(s.ReplayRequest, request.data)
        replay = run_replay(run=run, agent_version=data.get("agent_version"), principal=request.user)
        return Response(s.RunOut(replay).data, status=status.HTTP_201_CREATED)


class RunCompare(ApiView):
    """Two runs side by side, step by step."""

    @extend_schema(
        operation_id="runs_compare",
        tags=["runs"],
        summary="Compare two runs step by step",
        description="Both runs' summaries and, for each step, what each run's model said, the calls it made "
        "(tool, arguments, how each ended, whether it was `replayed` from a record), and the usage and cost of "
        "its model attempts; a fork's steps before its fork point, and a replay's before its first own step, "
        "are the original's (`inherited`). `diverged_at`: the first step whose calls or results differ, or "
        "that only one run has (null: none); a different wording of the model's text is `same_text: false`, "
        "not a divergence. 404 unless you may see both runs.",
        parameters=[ID_PARAM, OpenApiParameter("other", OpenApiTypes.UUID, OpenApiParameter.PATH)],
        responses={200: OpenApiTypes.OBJECT, **errors(*READ_ERRORS, 404)},
    )
    def get(self, request, id, other):
        return Response(run_compare(a=visible_run(request, id), b=visible_run(request, other)))


class RunCompareBare(RunCompare):
    """The same comparison at the path without the trailing slash."""

    @extend_schema(
        operation_id="runs_compare_bare",
        tags=["runs"],
        summary="Compare two runs step by step (the path without its trailing slash)",
        description="As `GET /api/runs/{id}/compare/{other}/`.",
        parameters=[ID_PARAM, OpenApiParameter("other", OpenApiTypes.UUID, OpenApiParameter.PATH)],
        responses={200: OpenApiTypes.OBJECT, **errors(*READ_ERRORS, 404)},
    )
    def get(self, request, id, other):
        return super().get(request, id, other)
