"""`/metrics`, `/healthz`, `/readyz`: unauthenticated by session, cheap, and
free of tenant data (no tenant, run or user appears in a body or a label).
`/readyz` tells an anonymous caller only whether the node is ready; why it is
not (the database's error, the unapplied migrations' names) only to staff or
to the metrics token's bearer."""

from __future__ import annotations

import hmac
import logging

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ops.collector import deployment_registry

log = logging.getLogger("agentrt.ops")


def _authorized(request) -> bool:
    """`AGENTRT_METRICS_TOKEN` set: `Authorization: Bearer <token>`, compared
    in constant time. Unset: open (see README, Operations)."""
    token = settings.AGENTRT_METRICS_TOKEN
    if not token:
        return True
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


@never_cache
@require_http_methods(["GET"])
def metrics(request):
    """The deployment-wide figures in Prometheus text format."""
    if not _authorized(request):
        response = JsonResponse(
            {"code": "not_authenticated", "message": "a valid bearer token is required"}, status=401
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response

    try:
        body = generate_latest(deployment_registry())
    except (OperationalError, InterfaceError) as exc:  # unreachable; anything else is a bug and raises
        log.warning("metrics scrape: database unavailable (%s)", type(exc).__name__)
        return JsonResponse({"code": "database_unavailable", "message": "the database could not be read"}, status=503)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)


@never_cache
@require_http_methods(["GET"])
def healthz(request):
    """The process is up and serving; touches nothing else."""
    return JsonResponse({"ok": True, "status": "ok"})


def readiness() -> tuple[bool, dict]:
    """The database answers and no migration on disk is unapplied."""
    checks: dict = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except DatabaseError as exc:
        checks["database"] = f"unreachable ({type(exc).__name__})"
        return False, checks
    try:
        executor = MigrationExecutor(connection)
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except DatabaseError as exc:
        checks["migrations"] = f"unknown ({type(exc).__name__})"
        return False, checks
    unapplied = sorted(f"{m.app_label}.{m.name}" for m, backwards in plan if not backwards)
    checks["migrations"] = "ok" if not unapplied else {"unapplied": unapplied}
    return not unapplied, checks


def _shows_details(request, database_ok: bool) -> bool:
    """Whether /readyz may say why: to staff (a session) or to a caller
    with `Authorization: Bearer <AGENTRT_METRICS_TOKEN>` (only when the token
    is set). Anyone else hears ready or not ready, never a migration's or an
    error's name. The session is read only when the database answered."""
    token = settings.AGENTRT_METRICS_TOKEN
    if token and _authorized(request):
        return True
    if not database_ok:
        return False
    try:
        return bool(request.user.is_authenticated and request.user.is_staff)
    except DatabaseError:
        return False


@never_cache
@require_http_methods(["GET"])
def readyz(request):
    ready, checks = readiness()
    body: dict = {"ready": ready, "status": "ready" if ready else "unavailable"}
    if _shows_details(request, checks.get("database") == "ok"):
        body["checks"] = checks
    return JsonResponse(body, status=200 if ready else 503)
