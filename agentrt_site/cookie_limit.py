"""A bound on the Cookie header, checked before anything parses it.

CVE-2024-7592: `http.cookies._unquote`, which Django's `parse_cookie` uses
for every request's `request.COOKIES` (and Channels' CookieMiddleware for
every WebSocket handshake), takes time quadratic in the backslash escapes of
a quoted value. Python before 3.11.10 has it; on 3.11.7 a 15 KB
`Cookie: a="\\\\\\\\..."` cost 0.44 s against 0.003 s for a plain request, with
no login. The fix is the interpreter (README: set-up); this
bound keeps a deployment still on an affected patch level from being held
by it, and costs a patched one nothing.

The bound, chosen to be generous for what browsers send:

- at most `MAX_COOKIE_BYTES` (8 KiB) for all of a request's Cookie headers
  together. A browser keeps cookies of at most 4 KiB each, and a request's
  header rarely reaches 8 KiB: nginx refuses any header line longer than
  8 KiB by default (`large_client_header_buffers 4 8k`), so whatever passes
  the documented proxy passes here too;
- at most `MAX_COOKIE_BACKSLASHES` (64) backslashes. An RFC 6265 cookie value
  has none; Python's SimpleCookie writes one per octal escape (`\\054` for a
  comma). The quadratic cost is in those escapes: within 8 KiB the attack
  still costs 0.11 s a request without this second limit, 0.0001 s with it.

Beyond either: HTTP 400 `{"code": "cookie_too_large" | "cookie_invalid",
"message": ...}` before a view, a session or a CSRF check runs (the Django
middleware, first among those that read cookies), and a WebSocket handshake
is refused (403) before Channels' CookieMiddleware parses it (the ASGI
wrapper in agentrt_site/asgi.py)."""

from __future__ import annotations

from channels.security.websocket import WebsocketDenier
from django.http import JsonResponse

MAX_COOKIE_BYTES = 8 * 1024
MAX_COOKIE_BACKSLASHES = 64


def problem(header: bytes) -> tuple[str, str] | None:
    """(code, message) when the Cookie header (all of them, joined) is
    beyond the bound; None when it may be parsed."""
    if len(header) > MAX_COOKIE_BYTES:
        return "cookie_too_large", (
            f"the Cookie header is {len(header)} bytes; at most {MAX_COOKIE_BYTES} are accepted "
            "(clear this site's cookies)"
        )
    escapes = header.count(b"\\")
    if escapes > MAX_COOKIE_BACKSLASHES:
        return "cookie_invalid", (
            f"the Cookie header carries {escapes} backslashes; at most {MAX_COOKIE_BACKSLASHES} are accepted "
            "(a cookie value has none)"
        )
    return None


class CookieLimitMiddleware:
    """Django middleware (HTTP under daphne and under WSGI): a request whose
    Cookie header is beyond the bound gets 400 before anything reads
    `request.COOKIES`. Placed right after SecurityMiddleware and
    CSPMiddleware (which read no cookie), so its answer carries their
    headers like every other response."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        found = problem(request.META.get("HTTP_COOKIE", "").encode("latin-1", "replace"))
        if found is not None:
            code, message = found
            return JsonResponse({"code": code, "message": message}, status=400)
        return self.get_response(request)


class WebsocketCookieLimit:
    """ASGI middleware around the whole application: a WebSocket handshake
    whose Cookie headers are beyond the bound is refused (403) before the
    session and authentication middlewares parse them; HTTP passes on to
    Django, where CookieLimitMiddleware answers it."""

    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket":
            header = b"; ".join(value for name, value in scope.get("headers", []) if name.lower() == b"cookie")
            if problem(header) is not None:
                return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
