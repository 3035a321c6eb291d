"""ASGI entry point: HTTP (admin, API, pages) and WebSockets.

WebSocket routes are wrapped in SameOriginValidator (runs/web/ws_origin.py:
only a page of this server's own origin — scheme, host and port — or of a
CSRF_TRUSTED_ORIGINS one can open a socket with the operator's cookie) and in
the session + token authentication stack; the whole application in
WebsocketCookieLimit (agentrt_site/cookie_limit.py)."""

import os

from django.core.asgi import get_asgi_application

from agentrt_site import serving

serving.ASGI = True  # before the settings load: this process's PostgreSQL connections come from a pool
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrt_site.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402 - needs the app registry: after get_asgi_application()

from agentrt_site.cookie_limit import WebsocketCookieLimit  # noqa: E402 - with the rest, after get_asgi_application()
from runs.web.routing import websocket_urlpatterns  # noqa: E402 - needs the app registry: after get_asgi_application()
from runs.web.ws_auth import TokenAuthMiddlewareStack  # noqa: E402 - needs the app registry: after get_asgi_application()
from runs.web.ws_origin import SameOriginValidator  # noqa: E402 - needs the app registry: after get_asgi_application()

# A handshake's Cookie header is bounded before Channels parses it (CVE-2024-7592; HTTP: CookieLimitMiddleware).
application = WebsocketCookieLimit(
    ProtocolTypeRouter(
        {
            "http": django_asgi_app,
            "websocket": SameOriginValidator(TokenAuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
        }
    )
)
