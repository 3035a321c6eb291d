"""One error body for the whole API:
`{"code", "message", "fields"?, "request_id"}` — never raw exception text.

`exception_handler` is DRF's EXCEPTION_HANDLER; `api_not_found` answers
paths under /api/ that name no route, so they get the same body.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.db import OperationalError
from django.http import Http404, HttpResponsePermanentRedirect, JsonResponse
from django.urls import Resolver404, resolve
from rest_framework import exceptions, status
from rest_framework.response import Response

from runs.clock import IDS
from runs.errors import RunError

log = logging.getLogger("agentrt.api")

REQUEST_ID_HEADER = "X-Request-ID"
_SANE_REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$")
_ATTR = "agentrt_request_id"


class PayloadTooLarge(exceptions.APIException):
    """The body is larger than DATA_UPLOAD_MAX_MEMORY_SIZE."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "the request body is too large"
    default_code = "payload_too_large"


class DepthExceeded(exceptions.APIException):
    """The JSON body nests deeper than the parser allows."""

    status_code = status.HTTP_400_BAD_REQUEST
    default_detail = "the JSON body is nested too deeply"
    default_code = "depth_exceeded"


class TooLarge(exceptions.APIException):
    """The JSON body holds more values than the parser allows."""

    status_code = status.HTTP_400_BAD_REQUEST
    default_detail = "the JSON body holds too many values"
    default_code = "too_large"


class Unavailable(exceptions.APIException):
    """The database could not answer in time."""

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "the service is temporarily unavailable; try again"
    default_code = "unavailable"


def request_id(request) -> str:
    """The request's id: a sane `X-Request-ID` from the client, else a new one."""
    django_request = getattr(request, "_request", request)
    rid = getattr(django_request, _ATTR, None)
    if rid is None:
        given = django_request.META.get("HTTP_X_REQUEST_ID", "")
        rid = given if _SANE_REQUEST_ID.match(given) else IDS.new_id().hex
        setattr(django_request, _ATTR, rid)
    return rid


def safe_text(value: Any) -> str:
    """Text that renders as JSON whatever the client sent (no lone surrogates, no NUL)."""
    text = value if isinstance(value, str) else str(value)
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\u0000")


def flatten(detail: Any) -> dict[str, list[str]]:
    """DRF's nested error detail as `{"dotted.path": [messages]}`; `(root)` for the body itself."""
    out: dict[str, list[str]] = {}

    def walk(node: Any, path: tuple[str, ...]) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, path if key == "non_field_errors" else (*path, safe_text(key)))
        elif isinstance(node, list) and any(isinstance(item, (dict, list)) for item in node):
            for index, item in enumerate(node):
                if item:
                    walk(item, (*path, str(index)))
        else:
            messages = node if isinstance(node, list) else [node]
            out.setdefault(".".join(path) or "(root)", []).extend(safe_text(m) for m in messages)

    walk(detail, ())
    return out


def error_body(request, code: str, message: str, fields: dict | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": safe_text(message)}
    if fields:
        body["fields"] = {safe_text(k): [safe_text(m) for m in v] for k, v in fields.items()}
    body["request_id"] = request_id(request) if request is not None else IDS.new_id().hex
    return body


def _code_of(exc: exceptions.APIException) -> str:
    codes = exc.get_codes()
    if isinstance(codes, str):
        return codes
    return exc.default_code


def exception_handler(exc: Exception, context: dict) -> Response:
    """Map every exception a view raises to the one error body."""
    # not at import time: DRF's views load our parser (DEFAULT_PARSER_CLASSES), which imports this module
    from rest_framework.views import set_rollback

    request = context.get("request")
    headers: dict[str, str] = {}
    if isinstance(exc, RunError):
        set_rollback()
        body = error_body(request, exc.code, exc.message, exc.fields)
        return Response(body, status=exc.status)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound("not found")
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    elif isinstance(exc, RequestDataTooBig):
        exc = PayloadTooLarge()
    elif isinstance(exc, OperationalError):
        log.warning("database unavailable during %s: %s", getattr(request, "path", "?"), type(exc).__name__)
        exc = Unavailable()
        headers["Retry-After"] = "1"
    if isinstance(exc, exceptions.APIException):
        set_rollback()
        if getattr(exc, "auth_header", None):
            headers["WWW-Authenticate"] = exc.auth_header
        if getattr(exc, "wait", None):
            headers["Retry-After"] = f"{exc.wait:.0f}"
        if isinstance(exc, exceptions.ValidationError):
            fields = flatten(exc.detail)
            first = next(iter(fields.items()), None)
            message = f"{first[0]}: {first[1][0]}" if first else "invalid input"
            body = error_body(request, "invalid", message, fields)
        else:
            body = error_body(
                request, _code_of(exc), str(exc.detail) if isinstance(exc.detail, str) else exc.default_detail
            )
        return Response(body, status=exc.status_code, headers=headers)
    set_rollback()
    rid = request_id(request) if request is not None else "-"
    log.exception("unhandled error in the API (request_id=%s)", rid)
    return Response(
        error_body(request, "internal_error", "internal error; quote the request_id when reporting it"),
        status=status.HTTP_500_INTERNAL_SERVER_ERROR,
    )


def api_not_found(request, rest: str = ""):
    """Any /api/ path that names no route: the error body, never Django's HTML page.

    A GET of a route without its trailing slash is redirected, as APPEND_SLASH would."""
    if not request.path.endswith("/"):
        try:
            match = resolve(request.path + "/")
        except Resolver404:
            match = None
        if match is not None and match.url_name != "not-found":
            if request.method in ("GET", "HEAD"):
                query = request.META.get("QUERY_STRING", "")
                response = HttpResponsePermanentRedirect(request.path + "/" + (f"?{query}" if query else ""))
                response[REQUEST_ID_HEADER] = request_id(request)
                return response
            body = error_body(
                request, "not_found", f"no such route; the route is {request.path}/ (with a trailing slash)"
            )
            response = JsonResponse(body, status=404)
            response[REQUEST_ID_HEADER] = request_id(request)
            return response
    response = JsonResponse(error_body(request, "not_found", "no such route"), status=404)
    response[REQUEST_ID_HEADER] = request_id(request)
    return response
