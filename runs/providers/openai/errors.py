"""How a chat-completions server's HTTP status is classified: retried before
output (408/409/429/5xx), or permanent (other 4xx; a context-length code is
`ContextLengthExceeded`). Messages are the adapter's own words."""

from __future__ import annotations

import json

import httpx

from runs.domain.errors import ModelError
from runs.providers.wire.retry import Retry, read_limited, retry_after

PERMANENT_STATUSES = {
    400: "BadRequest",
    401: "AuthenticationFailed",
    403: "PermissionDenied",
    404: "NotFound",
    422: "BadRequest",
}
RETRY_STATUSES = {408: "ProviderTimeout", 409: "ProviderConflict", 429: "RateLimited"}
CONTEXT_CODES = {"context_length_exceeded", "string_above_max_length"}


def raise_status(response: httpx.Response) -> None:
    status = response.status_code
    wait = retry_after(response.headers)
    code = None
    if status in (400, 413, 422):
        code = error_code(read_limited(response))
    if status in RETRY_STATUSES:
        raise Retry(RETRY_STATUSES[status], f"the model server answered HTTP {status}", wait)
    if status >= 500:
        raise Retry("ProviderUnavailable", f"the model server answered HTTP {status}", wait)
    if code in CONTEXT_CODES:
        raise ModelError(
            "ContextLengthExceeded",
            f"the model server answered HTTP {status}: the context is too long",
            transient=False,
        )
    if status in PERMANENT_STATUSES:
        raise ModelError(PERMANENT_STATUSES[status], f"the model server answered HTTP {status}", transient=False)
    if 400 <= status < 500:
        raise ModelError("BadRequest", f"the model server answered HTTP {status}", transient=False)
    raise ModelError("UnexpectedStatus", f"the model server answered HTTP {status}", transient=False)


def error_code(body: bytes) -> str | None:
    """The machine code of an error body (`error.code` / `error.type`), if any."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    if isinstance(error, dict):
        for key in ("code", "type"):
            if isinstance(error.get(key), str):
                return error[key]
    return None
