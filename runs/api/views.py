"""The REST API. Each view parses, authorizes (tenant scope,
permission), calls one service and renders the selectors' shapes; status and
lease columns are written only by the services.

Tenancy (runs.services.scoping): the caller acts in its own tenant; every query is
scoped to it and another tenant's object is 404. A superuser sees every
tenant but acts (creates, cancels, resumes, answers, decides) only in its own.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from csp.constants import UNSAFE_INLINE
from csp.decorators import csp_update
from django.db.models import Q, QuerySet
from django.utils.decorators import method_decorator
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerSplitView
from rest_framework import exceptions, generics, status
from rest_framework.pagination import PageNumberPagination
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from approvals.models import Approval
from approvals.services import approval_confirm, approval_decide, approval_for, can_resolve
from runs.api import serializers as s
from runs.api.errors import REQUEST_ID_HEADER, request_id
from runs.api.throttles import WriteScopedRateThrottle
from runs.clock import CLOCK
from runs.domain.values import RunStatus
from runs.errors import PublishForbidden
from runs.models import AgentVersion, Run
from runs.runtime.resume import run_resume
from runs.services import agent_load, run_get, run_submit, scoping
from runs.services.agent_schema import AgentDefinition
from runs.services.inputs import run_input
from runs.services.lifecycle import run_cancel, run_retry
from runs.services.run_list import FILTER_PARAMS, WAITING_ON, run_filters_from, runs_filtered
from runs.services.selectors import run_events, with_children

MAX_SEQUENCE = 2**63 - 1
EVENTS_DEFAULT_LIMIT = 100
EVENTS_MAX_LIMIT = 500
PUBLISH_PERMISSION = "runs.publish_agent"


# -- building blocks ---------------------------------------------------------------


class HasTenant(BasePermission):
    """The caller belongs to a tenant (a superuser may read without one)."""

    message = "you are not a member of any tenant"
    code = "no_tenant"

    def has_permission(self, request, view) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        return caller_tenant(request) is not None or scoping.sees_every_tenant(user)


class _WithoutSerializer:
    """A view as the browsable API's raw-data form sees it: our views parse their bodies with their own
    serializers (no `serializer_class`), so the form starts empty instead of asking for one."""

    def __init__(self, view):
        self._view = view

    def __getattr__(self, name):
        if name == "get_serializer":
            raise AttributeError(name)
        return getattr(self._view, name)


class ApiBrowsableRenderer(BrowsableAPIRenderer):
    """DRF's browsable API over views that are not model-bound: the raw JSON form (media type and content),
    no HTML forms (the API takes JSON only) and no filter form (the filters are query parameters, described
    in the OpenAPI schema and on /api/docs/)."""

    def get_filter_form(self, data, view, request):
        return None

    def get_raw_data_form(self, data, view, method, request):
        if getattr(view, "serializer_class", None) is None:
            view = _WithoutSerializer(view)
        return super().get_raw_data_form(data, view, method, request)


def browsable(request) -> bool:
    """Whether DRF's browsable API may answer this request: its user is signed in. Reading the user
    authenticates the request here, during content negotiation: a credential that fails (a bad token, a
    session write without its CSRF token) raises its own error now, answered in JSON (the user is anonymous
    from then on)."""
    user = request.user
    return bool(user and user.is_authenticated)


def caller_tenant(request):
    """The caller's tenant, looked up once per request."""
    django_request = getattr(request, "_request", request)
    if not hasattr(django_request, "agentrt_tenant"):
        django_request.agentrt_tenant = scoping.tenant_for(request.user)
    return django_request.agentrt_tenant


def acting_tenant(request):
    """The tenant a create happens in: the caller's own, never another."""
    tenant = caller_tenant(request)
    if tenant is None:
        raise exceptions.PermissionDenied(
            "you are not a member of any tenant; creates happen in your own tenant", code="no_tenant"
        )
    return tenant


class Pagination(PageNumberPagination):
    """DRF's page numbers, strict: a page or page size that is not a positive integer is 400
    (DRF would silently fall back); a page size above the maximum is clamped to it."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200

    def paginate_queryset(self, queryset, request, view=None):
        page = request.query_params.get(self.page_query_param)
        if page is not None and page not in self.last_page_strings:
            query_int(request, self.page_query_param, 1, 1, MAX_SEQUENCE)
        return super().paginate_queryset(queryset, request, view)

    def get_page_size(self, request):
        if request.query_params.get(self.page_size_query_param) is not None:
            return min(
                query_int(request, self.page_size_query_param, self.page_size, 1, MAX_SEQUENCE), self.max_page_size
            )
        return self.page_size

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            parameter["schema"]["minimum"] = 1
            if parameter["name"] == self.page_size_query_param:
                parameter["description"] = (
                    f"Results per page (default {self.page_size}; above {self.max_page_size} is clamped to it)."
                )
        return parameters


def errors(*codes: int) -> dict[int, OpenApiResponse]:
    described = {
        400: (
            "Invalid input (`fields` names the fields), unparseable JSON (`parse_error`)"
            " or nesting too deep (`depth_exceeded`)."
        ),
        401: "Not authenticated.",
        403: "Not a tenant member, CSRF failure for session auth, or missing permission.",
        404: "No such object in your tenant (for lists: no such page).",
        409: "Conflict with the object's state.",
        413: "Body larger than DATA_UPLOAD_MAX_MEMORY_SIZE.",
        415: "Writes take application/json only.",
        429: "Throttled (see Retry-After), or `quota_exceeded`: the tenant's active-run quota is reached.",
    }
    return {code: OpenApiResponse(s.ErrorOut, description=described.get(code, "")) for code in codes}


READ_ERRORS = (400, 401, 403)  # 400: a NUL in the query string
LIST_ERRORS = (*READ_ERRORS, 404)  # 404: a page past the end
WRITE_ERRORS = (400, 401, 403, 413, 415, 429)
ID_PARAM = OpenApiParameter("id", OpenApiTypes.UUID, OpenApiParameter.PATH)
# An optional body that, if sent, must be an empty JSON object.
NO_FIELDS = {"application/json": {"type": "object", "properties": {}, "additionalProperties": False}}


class ApiView(APIView):
    # Base of every view: tenant-member permission, X-Request-ID on every answer.
    # (A comment, not a docstring: the schema would show it on every operation.)

    permission_classes = [IsAuthenticated, HasTenant]
    throttle_classes = [WriteScopedRateThrottle]

    def get_renderers(self):
        # JSON for everyone; DRF's browsable API as well for a signed-in user whose client asks for HTML (a
        # browser). Anyone else gets JSON whatever it asks (an anonymous browser: the 401 body, not a 406).
        renderers = super().get_renderers()
        if browsable(self.request):
            renderers.append(ApiBrowsableRenderer())
        return renderers

    def perform_content_negotiation(self, request, force=False):
        return super().perform_content_negotiation(request, force=force or not browsable(request))

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        # A NUL reaches PostgreSQL as a DataError (a 500) from any filter: refuse it here, once.
        bad = {
            name: ["NUL characters are not allowed"]
            for name, values in request.query_params.lists()
            if "\x00" in name or any("\x00" in value for value in values)
        }
        if bad:
            raise exceptions.ValidationError(bad)

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        response[REQUEST_ID_HEADER] = request_id(request)
        return response


class ApiListView(ApiView, generics.GenericAPIView):
    pagination_class = Pagination

    def page(self, queryset: QuerySet, serializer_class) -> Response:
        page = self.paginate_queryset(queryset)
        return self.get_paginated_response(serializer_class(page, many=True).data)


def parse(serializer_class, data: Any) -> dict[str, Any]:
    serializer = serializer_class(data=data if data is not None else {})
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def query_choice(request, name: str, choices) -> str | None:
    value = request.query_params.get(name)
    if value is None:
        return None
    if value not in choices:
        raise exceptions.ValidationError({name: [f"must be one of {', '.join(choices)}"]})
    return value


def query_uuid(request, name: str) -> UUID | None:
    value = request.query_params.get(name)
    if value is None:
        return None
    try:
        return UUID(value)
    except ValueError:
        raise exceptions.ValidationError({name: ["must be a UUID"]}) from None


def query_int(request, name: str, default: int, minimum: int, maximum: int) -> int:
    value = request.query_params.get(name)
    if value is None:
        return default
    if not value.isascii() or not value.isdigit() or len(value) > 19:
        raise exceptions.ValidationError({name: [f"must be an integer from {minimum} to {maximum}"]})
    number = int(value)
    if not minimum <= number <= maximum:
        raise exceptions.ValidationError({name: [f"must be an integer from {minimum} to {maximum}"]})
    return number


def visible_run(request, run_id: str) -> Run:
    return scoping.run_visible(request.user, run_id)


def actionable_run(request, run_id: str) -> Run:
    """A run the caller may act on: its own tenant's only (a superuser too); 404 otherwise."""
    return scoping.run_actionable(request.user, run_id)


# -- agents -----------------------------------------------------------------------


class AgentListCreate(ApiListView):
    """List agent versions; create or update an agent."""

    throttle_scope = "agents_create"

    def get_queryset(self):
        qs = (
            scoping.agent_versions_visible_to(self.request.user)
            .select_related("published_by")
            .order_by("-created_at", "id")
        )
        name = self.request.query_params.get("name")
        if name is not None:
            if len(name) > 100:
                raise exceptions.ValidationError({"name": ["at most 100 characters"]})
            qs = qs.filter(agent__name=name)
        return qs

    @extend_schema(
        operation_id="agents_list",
        tags=["agents"],
        summary="Agent versions of your tenant, newest first",
        parameters=[OpenApiParameter("name", str, description="Only this agent's versions.")],
        responses={200: s.AgentVersionOut(many=True), **errors(*LIST_ERRORS)},
    )
    def get(self, request):
        return self.page(self.get_queryset(), s.AgentVersionOut)

    @extend_schema(
        operation_id="agents_create",
        tags=["agents"],
        summary="Create or update an agent (its definition)",
        description="Needs `runs.publish_agent` (403 `permission_denied` otherwise). The new version records "
        "who published it and when. A tool or a model endpoint outside the tenant's allow-lists is 400 "
        "`tool_not_allowed` (naming `tools`) or `endpoint_not_allowed` (naming `model`).",
        request=AgentDefinition,
        responses={201: s.AgentVersionOut, **errors(*WRITE_ERRORS)},
    )
    def post(self, request):
        tenant = acting_tenant(request)
        if not request.user.has_perm(PUBLISH_PERMISSION):
            raise PublishForbidden("publishing an agent needs the runs.publish_agent permission")
        s.agent_definition_check(request.data)
        version = agent_load(tenant=tenant, definition=dict(request.data), published_by=request.user)
        version = AgentVersion.objects.select_related("agent", "published_by").get(id=version.id)
        return Response(s.AgentVersionOut(version).data, status=status.HTTP_201_CREATED)


# -- runs -------------------------------------------------------------------------


class RunListCreate(ApiListView):
    """List runs; submit a run."""

    throttle_scope = "runs_create"

    def get_queryset(self):
        filters = run_filters_from(self.request.query_params)  # InvalidInput: 400 naming the parameter
        qs = runs_filtered(user=self.request.user, filters=filters).order_by("-created_at", "id")
        session = query_uuid(self.request, "session")
        if session:
            qs = qs.filter(session_id=session)
        parent = query_uuid(self.request, "parent")
        if parent:  # within the caller's runs: another tenant's id finds nothing, like `session`
            qs = qs.filter(parent_id=parent)
        return with_children(qs)

    @extend_schema(
        operation_id="runs_list",
        tags=["runs"],
        summary="Runs of your tenant, newest first",
        description="The filters combine (AND); a value that is not one of a filter's choices, not a time or too "
        "long is 400 naming the parameter in `fields`. Every filter narrows what the caller may see: a "
        "member's list never holds another tenant's run, whatever it asks.",
        parameters=[
            OpenApiParameter(
                "status",
                str,
                description=FILTER_PARAMS["status"] + " One of " + ", ".join(st.value for st in RunStatus) + ".",
                examples=[OpenApiExample("failed or cancelled", value="FAILED,CANCELLED")],
            ),
            OpenApiParameter("agent", str, description=FILTER_PARAMS["agent"]),
            OpenApiParameter("waiting_on", str, enum=list(WAITING_ON), description=FILTER_PARAMS["waiting_on"]),
            OpenApiParameter("tenant", str, description=FILTER_PARAMS["tenant"]),
            OpenApiParameter("created_after", str, description=FILTER_PARAMS["created_after"]),
            OpenApiParameter("created_before", str, description=FILTER_PARAMS["created_before"]),
            OpenApiParameter("since", str, pattern=r"^[1-9][0-9]{0,5}[smhd]$", description=FILTER_PARAMS["since"]),
            OpenApiParameter("q", str, description=FILTER_PARAMS["q"]),
            OpenApiParameter("session", OpenApiTypes.UUID),
            OpenApiParameter("parent", OpenApiTypes.UUID, description="Only the child runs of this run."),
        ],
        responses={200: s.RunOut(many=True), **errors(*LIST_ERRORS)},
    )
    def get(self, request):
        return self.page(self.get_queryset(), s.RunOut)

    @extend_schema(
        operation_id="runs_create",
        tags=["runs"],
        summary="Submit a run",
        description=(
            "201 with the new run. Replaying the same `Idempotency-Key` with the same body answers 200 with the "
            "original run; with another body 409 `idempotency_key_reused`. 409 `session_busy` when the session "
            "has another active run, except that text sent to a session whose run waits for the user is routed "
            'to that run\'s input: 202 `{"run": id, "routed": "input"}`.'
        ),
        request=s.RunCreate,
        parameters=[
            OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER, description="At most 200 characters.")
        ],
        responses={
            201: s.RunOut,
            200: OpenApiResponse(s.RunOut, description="Idempotent replay: the original run."),
            202: OpenApiResponse(s.RoutedOut, description="Routed to the waiting run's input."),
            **errors(*WRITE_ERRORS, 409),
        },
    )
    def post(self, request):
        tenant = acting_tenant(request)
        data = parse(s.RunCreate, request.data)
        run, created = run_submit(
            tenant=tenant,
            agent=data["agent"],
            input=data["input"],
            session=data.get("session"),
            limits=data.get("limits"),
            idempotency_key=request.headers.get("Idempotency-Key"),
            by=request.user.get_username(),
            principal=request.user,
        )
        if getattr(run, "routed", False):
            return Response({"run": str(run.id), "routed": "input"}, status=status.HTTP_202_ACCEPTED)
        run = Run.objects.select_related("agent").get(id=run.id)
        return Response(s.RunOut(run).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class RunDetail(ApiView):
    """One run."""

    @extend_schema(
        operation_id="runs_retrieve",
        tags=["runs"],
        parameters=[ID_PARAM],
        responses={200: s.RunOut, **errors(*READ_ERRORS, 404)},
    )
    def get(self, request, id):
        return Response(s.RunOut(visible_run(request, id)).data)


class RunEvents(ApiView):
    """The run's events after a cursor (`after` exclusive)."""

    @extend_schema(
        operation_id="runs_events",
        tags=["runs"],
        summary="The run's events after a cursor",
        parameters=[
            ID_PARAM,
            OpenApiParameter("after", OpenApiTypes.INT, description="Exclusive sequence cursor (default 0)."),
            OpenApiParameter(
                "limit", OpenApiTypes.INT, description=f"1–{EVENTS_MAX_LIMIT} (default {EVENTS_DEFAULT_LIMIT})."
            ),
        ],
        responses={200: s.EventsPageOut, **errors(*READ_ERRORS, 404)},
    )
    def get(self, request, id):
        run = visible_run(request, id)
        after = query_int(request, "after", 0, 0, MAX_SEQUENCE)
        limit = query_int(request, "limit", EVENTS_DEFAULT_LIMIT, 1, EVENTS_MAX_LIMIT)
        results, next_after = run_events(run=run, after=after, limit=limit)
        return Response({"results": results, "next_after": next_after})


class RunCancel(ApiView):
    """Cancel a run."""

    throttle_scope = "runs_cancel"

    @extend_schema(
        operation_id="runs_cancel",
        tags=["runs"],
        summary="Cancel a run",
        description="202 with the run: a queued or waiting run ends CANCELLED at once, a running one is asked to "
        "stop. A run waiting on an unknown outcome (an interrupted or uncertain side effect) keeps its question: "
        "it stays WAITING_FOR_APPROVAL, its approval offers only confirm and reject, and it ends CANCELLED right "
        "after the decision. A second cancel is 202 again; 409 `run_terminal` on a finished run (nothing is "
        "recorded). Every accepted request is the event `run.cancel_requested` (`by`, `via`: `api`, the optional "
        "`reason`) before this answers; the run's worker hears of it at once (the cancel doorbell) and stops at "
        "its next observation point, and `run.cancelled` repeats who and why. A run already past its last "
        "observation point ends as it would have, followed by `run.cancel_too_late`.",
        parameters=[ID_PARAM],
        request=s.CancelRequest,
        responses={202: s.RunOut, **errors(*WRITE_ERRORS, 404, 409)},
    )
    def post(self, request, id):
        run = actionable_run(request, id)
        data = parse(s.CancelRequest, request.data)
        run_cancel(run=run, by=request.user.get_username(), via="api", reason=data.get("reason"))
        return Response(s.RunOut(run_get(tenant=None, run_id=run.id)).data, status=status.HTTP_202_ACCEPTED)


class RunRetry(ApiView):
    """Retry a run that failed for a transient reason."""

    throttle_scope = "runs_retry"

    @extend_schema(
        operation_id="runs_retry",
        tags=["runs"],
        summary="Retry a run that failed for a transient reason",
        description="202 with the run: a new attempt of the same run (same id, session and record), continuing from "
        "its last checkpoint — back to QUEUED, or WAITING_FOR_APPROVAL when a side effect's outcome is unknown and "
        "must be decided first. A tool call with a recorded result is answered from the record, never sent again. "
        "Only `dependency_unavailable`, `internal_error` and `max_attempts_exceeded` are retried: any other "
        "failure reason, a child run or a run past its deadline is 409 `run_not_retryable` (the message names the "
        "reason); a run that is not FAILED is 409 `run_not_failed`; 409 `session_busy` when its session has "
        "another active run; 429 `quota_exceeded`. Recorded as `run.retried` (`by`, `via`: `api`, the failure).",
        parameters=[ID_PARAM],
        request=NO_FIELDS,
        responses={202: s.RunOut, **errors(*WRITE_ERRORS, 404, 409)},
    )
    def post(self, request, id):
        run = actionable_run(request, id)
        parse(s.Empty, request.data)
        run_retry(run=run, by=request.user.get_username(), via="api")
        return Response(s.RunOut(run_get(tenant=None, run_id=run.id)).data, status=status.HTTP_202_ACCEPTED)


class RunResume(ApiView):
    """Resume a RUNNING run whose lease expired."""

    throttle_scope = "runs_resume"

    @extend_schema(
        operation_id="runs_resume",
        tags=["runs"],
        summary="Resume a run whose worker died",
        description='200 `{"outcome": ...}` once taken over; 409 `run_leased` while its lease is live, '
        "409 `run_not_running` when it is not RUNNING.",
        parameters=[ID_PARAM],
        request=NO_FIELDS,
        responses={200: s.ResumeOut, **errors(*WRITE_ERRORS, 404, 409)},
    )
    def post(self, request, id):
        run = actionable_run(request, id)
        parse(s.Empty, request.data)
        outcome = run_resume(run_id=run.id, via="api")
        return Response({"outcome": outcome})


class RunInput(ApiView):
    """Answer a run that waits for the user."""

    throttle_scope = "runs_input"

    @extend_schema(
        operation_id="runs_input",
        tags=["runs"],
        summary="Answer a run that waits for the user",
        description="202 with the run (back to QUEUED); 409 unless the run is WAITING_FOR_USER.",
        parameters=[ID_PARAM],
        request=s.InputText,
        responses={202: s.RunOut, **errors(*WRITE_ERRORS, 404, 409)},
    )
    def post(self, request, id):
        run = actionable_run(request, id)
        data = parse(s.InputText, request.data)
        run_input(run=run, text=data["text"], by=request.user.get_username())
        return Response(s.RunOut(run_get(tenant=None, run_id=run.id)).data, status=status.HTTP_202_ACCEPTED)


# -- approvals --------------------------------------------------------------------


class ApprovalList(ApiListView):
    """List approvals."""

    def get_queryset(self):
        qs = scoping.approvals_visible_to(self.request.user).order_by("-created_at", "id")
        wanted = query_choice(self.request, "status", [st for st, _ in Approval.STATUSES])
        if wanted:
            qs = qs.filter(status=wanted)
        run = query_uuid(self.request, "run")
        if run:
            qs = qs.filter(run_id=run)
        late = query_choice(self.request, "deadline_passed", ["true", "false"])
        if late is not None:
            passed = Q(run__deadline_at__isnull=False, run__deadline_at__lte=CLOCK.now())
            qs = qs.filter(passed) if late == "true" else qs.exclude(passed)
        return qs

    @extend_schema(
        operation_id="approvals_list",
        tags=["approvals"],
        summary="Approvals of your tenant, newest first",
        parameters=[
            OpenApiParameter("status", str, enum=[st for st, _ in Approval.STATUSES]),
            OpenApiParameter("run", OpenApiTypes.UUID),
            OpenApiParameter(
                "deadline_passed",
                str,
                enum=["true", "false"],
                description="Only approvals whose run's deadline has (or has not) passed: with `status=pending`, "
                "the unknown outcomes that wait past their run's deadline for a confirm or a reject.",
            ),
        ],
        responses={200: s.ApprovalOut(many=True), **errors(*LIST_ERRORS)},
    )
    def get(self, request):
        return self.page(self.get_queryset(), s.ApprovalOut)


class ApprovalDetail(ApiView):
    """One approval."""

    @extend_schema(
        operation_id="approvals_retrieve",
        tags=["approvals"],
        parameters=[ID_PARAM],
        responses={200: s.ApprovalOut, **errors(*READ_ERRORS, 404)},
    )
    def get(self, request, id):
        return Response(s.ApprovalOut(approval_for(user=request.user, approval_id=id)).data)


class ApprovalDecide(ApiView):
    """Approve or reject one approval (through the approval service)."""

    throttle_scope = "approvals_decide"
    approve = True

    def post(self, request, id):
        approval_for(user=request.user, approval_id=id, acting=True)  # 404 before 403: no enumeration
        if not can_resolve(request.user):
            raise exceptions.PermissionDenied("you do not have permission to resolve approvals")
        data = parse(s.ApprovalDecision, request.data)
        approval = approval_decide(
            user=request.user,
            approval_id=id,
            approve=self.approve,
            request_hash=data["request_hash"],
            reason=data["reason"],
            via="api",
        )
        return Response(s.ApprovalOut(approval).data)


DECIDE_DOC = (
    "Needs `approvals.resolve_approval` (403 otherwise). `request_hash` must be the one shown. "
    "409 `approval_decided` / `approval_stale` (hash differs) / `approval_expired`. Approving an unknown outcome "
    "(an interrupted or uncertain side effect, a reconciler's pause) whose run cannot go on is 409 "
    "`run_deadline_passed`, `run_budget_exhausted` or `run_cancel_requested`: confirm or reject it instead, and "
    "the run then ends."
)


class ApprovalApprove(ApprovalDecide):
    """Approve."""

    approve = True

    @extend_schema(
        operation_id="approvals_approve",
        tags=["approvals"],
        summary="Approve",
        description=DECIDE_DOC,
        parameters=[ID_PARAM],
        request=s.ApprovalDecision,
        responses={200: s.ApprovalOut, **errors(*WRITE_ERRORS, 404, 409)},
    )
    def post(self, request, id):
        return super().post(request, id)


class ApprovalReject(ApprovalDecide):
    """Reject."""

    approve = False

    @extend_schema(
        operation_id="approvals_reject",
        tags=["approvals"],
        summary="Reject",
        description=DECIDE_DOC,
        parameters=[ID_PARAM],
        request=s.ApprovalDecision,
        responses={200: s.ApprovalOut, **errors(*WRITE_ERRORS, 404, 409)},
    )
    def post(self, request, id):
        return super().post(request, id)


class ApprovalConfirm(ApiView):
    """Confirm an unknown outcome (through the approval service)."""

    throttle_scope = "approvals_decide"

    @extend_schema(
        operation_id="approvals_confirm",
        tags=["approvals"],
        summary="Confirm whether an unknown outcome took effect",
        description=(
            "For an `interrupted_side_effect` or `uncertain_side_effect` approval only: the operator says "
            "whether the call took effect (`took_effect`: true/false). The invocation gets a result "
            "recording the confirmation, the model sees it and the run goes on; nothing is sent again; the "
            "approval becomes `confirmed`. "
            + DECIDE_DOC
            + " 409 `approval_not_confirmable` for a `policy` or `reconcile` approval. 400 naming "
            "`took_effect` when it is missing or not a boolean."
        ),
        parameters=[ID_PARAM],
        request=s.ApprovalConfirmation,
        responses={200: s.ApprovalOut, **errors(*WRITE_ERRORS, 404, 409)},
    )
    def post(self, request, id):
        approval_for(user=request.user, approval_id=id, acting=True)  # 404 before 403: no enumeration
        if not can_resolve(request.user):
            raise exceptions.PermissionDenied("you do not have permission to resolve approvals")
        data = parse(s.ApprovalConfirmation, request.data)
        approval = approval_confirm(
            user=request.user,
            approval_id=id,
            request_hash=data["request_hash"],
            took_effect=data["took_effect"],
            reason=data["reason"],
            via="api",
        )
        return Response(s.ApprovalOut(approval).data)


# -- schema and docs -------------------------------------------------------------------


class JsonErrors(APIView):
    """Errors of the schema and docs pages are the API's JSON error body too (a mixin: put it first)."""

    def handle_exception(self, exc):
        response = super().handle_exception(exc)
        self.request.accepted_renderer = JSONRenderer()
        self.request.accepted_media_type = JSONRenderer.media_type
        return response

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        response[REQUEST_ID_HEADER] = request_id(request)
        return response


class SchemaView(JsonErrors, SpectacularAPIView):
    """The OpenAPI 3 document (YAML; `?format=json` for JSON)."""


# Content-Security-Policy: both UIs style themselves with inline <style> (Swagger UI's page, ReDoc's
# styled-components), so their pages alone add inline styles; scripts stay 'self' only.
DOCS_CSP = {"style-src": [UNSAFE_INLINE]}


@method_decorator(csp_update(DOCS_CSP), name="dispatch")
class SwaggerView(JsonErrors, SpectacularSwaggerSplitView):
    """Swagger UI over the schema. Its init script is served as a file (`?script`), not inline."""


@method_decorator(csp_update({**DOCS_CSP, "worker-src": ["blob:"]}), name="dispatch")
class RedocView(JsonErrors, SpectacularRedocView):
    """Redoc over the schema. Its page links no third-party stylesheet (the stock one pulls Google Fonts);
    ReDoc's search runs in a blob: worker."""

    template_name = "api/redoc.html"
