"""Settings for agentrt, read from the environment (12-factor).

`DATABASE_URL` selects PostgreSQL; without it the embedded default is a
SQLite file in WAL mode with a busy timeout, so `make run` needs nothing but
Python and make.
"""

import ipaddress
import json
import os
from datetime import timedelta
from pathlib import Path

import dj_database_url

from agentrt_site import serving
from runs.domain.limits import default_limits  # Django-free: the one limits table

BASE_DIR = Path(__file__).resolve().parent.parent


def env_int(name, default):
    return int(os.environ.get(name, default))


def env_float(name, default):
    return float(os.environ.get(name, default))


def env_list(name, default=""):
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


# --- Security ------------------------------------------------------------------
DEBUG = os.environ.get("DJANGO_DEBUG", "0") == "1"
# No built-in key outside DEBUG: every process (web, worker, maintenance, CLI)
# refuses to start without one. `make run` passes the demo's own key (var/secret_key).
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            "DJANGO_SECRET_KEY is not set: agentrt refuses to start without a secret key when DEBUG is off. "
            "Set DJANGO_SECRET_KEY (e.g. python -c 'import secrets; print(secrets.token_urlsafe(50))'), "
            "or use `make run` for the demo, which keeps its own key in var/secret_key."
        )
    SECRET_KEY = "agentrt-insecure-debug-only-key"
# Loopback names only unless the environment names the hosts.
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", "")
# HTTPS: off by default (the demo is plain http on loopback); production turns them on.
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = os.environ.get("AGENTRT_SECURE_COOKIES", "0") == "1"
SECURE_HSTS_SECONDS = env_int("AGENTRT_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = os.environ.get("AGENTRT_HSTS_INCLUDE_SUBDOMAINS", "1") == "1"
SECURE_HSTS_PRELOAD = os.environ.get("AGENTRT_HSTS_PRELOAD", "0") == "1"
SECURE_SSL_REDIRECT = os.environ.get("AGENTRT_SSL_REDIRECT", "0") == "1"
# A load balancer's plain-http probes, and Prometheus scraping each web node directly (a redirect would
# not protect the bearer token: it is sent with the first, plain request).
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
# "X-Forwarded-Proto=https": trust that header from the proxy in front (only behind one that sets it).
if os.environ.get("AGENTRT_PROXY_SSL_HEADER"):
    _header, _, _value = os.environ["AGENTRT_PROXY_SSL_HEADER"].partition("=")
    SECURE_PROXY_SSL_HEADER = ("HTTP_" + _header.strip().upper().replace("-", "_"), _value.strip() or "https")
# The demo's unauthenticated /demo/hook exists only under `make run` (manage.py demo sets it).
AGENTRT_DEMO = os.environ.get("AGENTRT_DEMO", "0") == "1"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 12}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Login throttling (django-axes; agentrt_site/logins.py): the admin login is the session login. Failures
# are counted per (username, client IP) in the database, so across processes, and lock the pair, the
# address (spraying) or the username (guesses from many addresses), each at its own limit.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = env_int("AGENTRT_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = env_float("AGENTRT_LOGIN_COOLOFF_HOURS", 0.25)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]  # what is recorded, and forgiven by a success
AXES_RESET_ON_SUCCESS = True
AXES_HTTP_RESPONSE_CODE = 429
AXES_HANDLER = "agentrt_site.logins.LoginThrottle"
AGENTRT_LOGIN_IP_FAILURE_LIMIT = env_int("AGENTRT_LOGIN_IP_FAILURE_LIMIT", 20)
AGENTRT_LOGIN_USERNAME_FAILURE_LIMIT = env_int("AGENTRT_LOGIN_USERNAME_FAILURE_LIMIT", 50)
# The client's address is the TCP peer (daphne runs without --proxy-headers); X-Forwarded-For is believed only
# from these proxies' addresses or networks (comma-separated; empty: never).
AXES_CLIENT_IP_CALLABLE = "agentrt_site.logins.client_ip"
AGENTRT_TRUSTED_PROXIES = env_list("AGENTRT_TRUSTED_PROXIES")
for _proxy in AGENTRT_TRUSTED_PROXIES:
    try:
        ipaddress.ip_network(_proxy, strict=False)
    except ValueError:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(f"AGENTRT_TRUSTED_PROXIES: {_proxy!r} is not an IP address or network") from None
# API tokens (django-rest-knox): stored as SHA-512 digests, expiring, revocable
# by deleting them in the admin (Knox › Auth tokens). Header: `Authorization: Token <token>`.
AGENTRT_TOKEN_TTL_DAYS = env_float("AGENTRT_TOKEN_TTL_DAYS", 90)
REST_KNOX = {
    "TOKEN_TTL": timedelta(days=AGENTRT_TOKEN_TTL_DAYS) if AGENTRT_TOKEN_TTL_DAYS > 0 else None,
    "AUTH_HEADER_PREFIX": "Token",
    "AUTO_REFRESH": False,
}
# Hostile-member limits.
AGENTRT_MAX_SLEEP_SECONDS = env_float("AGENTRT_MAX_SLEEP_SECONDS", 60)
AGENTRT_WS_MAX_PER_USER = env_int("AGENTRT_WS_MAX_PER_USER", 20)
AGENTRT_REDIS_URL = os.environ.get("REDIS_URL", "")  # sockets counted across processes (runs/web/ws_limits.py)
# --- end Security ------------------------------------------------------------

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "knox",
    "axes",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "django_q",
    "runs",
    "approvals",
    "checkpoints",
    "maintenance",
    "ops",
    "webhooks",
]
# A project's own apps (their `agent_tools` / `agent_providers` modules are
# found at startup), e.g. AGENTRT_EXTRA_APPS=examples.payments. Operator configuration.
INSTALLED_APPS += env_list("AGENTRT_EXTRA_APPS", "")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Content-Security-Policy on every response (django-csp; CONTENT_SECURITY_POLICY below).
    "csp.middleware.CSPMiddleware",
    # Before anything reads request.COOKIES: 400 for a Cookie header beyond 8 KiB or 64 backslashes (CVE-2024-7592
    # on Python < 3.11.10; agentrt_site/cookie_limit.py). The two above read no cookie.
    "agentrt_site.cookie_limit.CookieLimitMiddleware",
    # Static files straight from the app's finders (no collectstatic step):
    # the admin's CSS and the API docs' assets under daphne, DEBUG or not.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: turns a lockout into its 429 response.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "agentrt_site.urls"
WSGI_APPLICATION = "agentrt_site.wsgi.application"
ASGI_APPLICATION = "agentrt_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------
# Persistent connections: django-q2's ORM broker opens a connection per query
# with Django's default of 0 and drops from ~280 to ~24 tasks/s.
CONN_MAX_AGE = env_int("AGENTRT_CONN_MAX_AGE", 600)
# The web server's pool (PostgreSQL under ASGI only; 0: no pool, a connection per request).
AGENTRT_DB_POOL_SIZE = env_int("AGENTRT_DB_POOL_SIZE", 8)
AGENTRT_DB_POOL_TIMEOUT = env_float("AGENTRT_DB_POOL_TIMEOUT", 10)  # seconds a request waits for a free connection
AGENTRT_LEASE_SECONDS = env_float("AGENTRT_LEASE_SECONDS", 30)
# How often maintenance asks PostgreSQL whether the processes holding live leases still have their sessions
# (runs/runtime/liveness.py): a dead worker's run is taken over within about this, not a lease later. 0: off.
AGENTRT_DEAD_OWNER_PROBE_SECONDS = env_float("AGENTRT_DEAD_OWNER_PROBE_SECONDS", 1.0)

if os.environ.get("DATABASE_URL"):
    _db = dj_database_url.parse(os.environ["DATABASE_URL"], conn_max_age=CONN_MAX_AGE)
    if _db["ENGINE"].endswith("postgresql"):
        # Every timeout is below the heartbeat interval (lease / 3), so a dead
        # connection or a lock wait cannot hang the heartbeat past the lease.
        _hb_ms = int(AGENTRT_LEASE_SECONDS * 1000 / 3)
        _stmt_ms = max(500, min(5000, _hb_ms - 200))
        _db.setdefault("OPTIONS", {})
        _db["OPTIONS"].update(
            {
                # libpq's floor is 2 s: leases under ~9 s cannot get one below the heartbeat.
                "connect_timeout": max(2, min(3, int(AGENTRT_LEASE_SECONDS / 3) - 1)),
                # Django's ORM keeps client-side binding (never prepared); the
                # runtime's few fenced statement shapes run on a server-binding
                # cursor and are prepared once per connection: planning was about
                # half of their server time. 0 turns it off (transaction-mode
                # poolers that cannot carry prepared statements).
                "prepare_threshold": (None if os.environ.get("AGENTRT_PG_PREPARE", "1") == "0" else 1),
                "keepalives": 1,
                "keepalives_idle": 5,
                "keepalives_interval": 2,
                "keepalives_count": 2,
                "options": (
                    f"-c statement_timeout={_stmt_ms} "
                    f"-c lock_timeout={_stmt_ms} "
                    f"-c idle_in_transaction_session_timeout={max(500, _hb_ms - 100)}"
                ),
            }
        )
        # Off by default: with it django-q2's broker pings before every poll (~2x idle commits).
        _db["CONN_HEALTH_CHECKS"] = os.environ.get("AGENTRT_CONN_HEALTH_CHECKS", "0") == "1"
        if serving.ASGI and AGENTRT_DB_POOL_SIZE > 0:
            # The web server (agentrt_site/serving.py): persistent connections are never reused
            # under ASGI, so every request paid for a new server connection. A pool keeps them;
            # Django requires CONN_MAX_AGE 0 with it (a request's connection goes back to the
            # pool when the request finishes). The pool checks a connection before lending it
            # (CONN_HEALTH_CHECKS: one empty round trip), so a server restart costs no request an error.
            _db["CONN_MAX_AGE"] = 0
            _db["CONN_HEALTH_CHECKS"] = True
            _db["OPTIONS"]["pool"] = {
                "min_size": 1,
                "max_size": AGENTRT_DB_POOL_SIZE,
                "timeout": AGENTRT_DB_POOL_TIMEOUT,
            }
    DATABASES = {"default": _db}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("AGENTRT_SQLITE_PATH", str(BASE_DIR / "db.sqlite3")),
            "OPTIONS": {
                "timeout": 20,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=20000;",
            },
            "CONN_MAX_AGE": CONN_MAX_AGE,
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
# Only for `collectstatic` (a CDN or another web server in front): unset, the
# app serves its files from the finders below.
STATIC_ROOT = os.environ.get("AGENTRT_STATIC_ROOT") or None
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG
LOGIN_URL = "/accounts/login/"  # the live pages' login: members are not staff
# A login without ?next= lands on the runs list (Django's default, /accounts/profile/, is a 404).
LOGIN_REDIRECT_URL = "/runs/"
DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024

# --- Content-Security-Policy (django-csp 4) ---------------------------------
# No inline script or style anywhere: the live pages load code and styles from static files and their
# data from json_script blocks, the admin has none, Swagger UI gets its init script as a file. Only
# the API docs (Swagger UI, ReDoc style themselves inline) add `style-src 'unsafe-inline'`, on their
# own views (runs/api/views.py, django-csp's csp_update).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'"],
        # 'self' covers the live pages' ws:/wss: to the same host.
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}

# --- Channels -------------------------------------------------------------
# The Redis layer's receive is a blocking BZPOPMIN of up to 5 s
# (channels_redis's brpop_timeout). redis-py 8 reads with a 5 s socket timeout
# unless told otherwise, so an idle socket's consumer died with "Timeout
# reading" about every 5 s. The read timeout is set above the pop's: a Redis
# that stops answering is still noticed, after this many seconds.
AGENTRT_REDIS_SOCKET_TIMEOUT = env_float("AGENTRT_REDIS_SOCKET_TIMEOUT", 15)


def redis_channel_layer(url: str, socket_timeout: float = AGENTRT_REDIS_SOCKET_TIMEOUT) -> dict:
    """The channel layer on Redis at `url`, its reads bounded above the layer's blocking receive."""
    # settings-time, when a Redis URL is set: only a Redis-backed layer loads channels_redis
    from channels_redis.core import RedisChannelLayer
    from django.core.exceptions import ImproperlyConfigured

    if not socket_timeout > RedisChannelLayer.brpop_timeout:
        raise ImproperlyConfigured(
            f"AGENTRT_REDIS_SOCKET_TIMEOUT must be longer than the channel layer's blocking receive"
            f" ({RedisChannelLayer.brpop_timeout} s), else every idle live socket is dropped"
        )
    return {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [{"address": url, "socket_timeout": socket_timeout, "socket_connect_timeout": 5}]},
    }


if os.environ.get("REDIS_URL"):
    CHANNEL_LAYERS = {"default": redis_channel_layer(os.environ["REDIS_URL"])}
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
# Shared cache (DRF throttles count across processes only with Redis).
if os.environ.get("REDIS_URL"):
    CACHES = {
        "default": {
            "BACKEND": "agentrt_site.redis_cache.SharedRedisCache",
            "LOCATION": os.environ["REDIS_URL"],
            # Deployments (or test databases) sharing one Redis keep their counters apart.
            "KEY_PREFIX": os.environ.get("AGENTRT_CACHE_PREFIX", f"agentrt:{DATABASES['default']['NAME']}"),
        }
    }

# django-q2's cluster status (each node's sentinel saves its workers every guard cycle, for 3 s): what
# `agentrt_status` and /metrics count live workers from (ops/fleet.py). It needs a cache every process shares:
# Redis with REDIS_URL (the default cache), else files on this machine (the embedded default's one node), one
# folder per database so that two deployments or test databases never count each other's workers.
if os.environ.get("REDIS_URL"):
    AGENTRT_Q_STATUS_CACHE = "default"
else:
    import hashlib as _hashlib

    AGENTRT_Q_STATUS_CACHE = "agentrt_q_status"
    _q_status_dir = _hashlib.sha256(str(DATABASES["default"]["NAME"]).encode()).hexdigest()[:16]
    CACHES = {
        **globals().get("CACHES", {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}),
        AGENTRT_Q_STATUS_CACHE: {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": os.environ.get("AGENTRT_Q_STATUS_DIR", str(BASE_DIR / "var" / "q-status" / _q_status_dir)),
        },
    }

# Wake sockets through the channel layer after each commit. Across processes
# only Redis carries it; without Redis the consumers' poll delivers.
AGENTRT_NOTIFY_LIVE = os.environ.get("AGENTRT_NOTIFY_LIVE", "1" if os.environ.get("REDIS_URL") else "0") == "1"
# Without Redis, on PostgreSQL: the statement that appends a run's events also sends `NOTIFY agentrt_live`
# (delivered at commit) and each web process LISTENs on one connection of its own (runs/web/live_bell.py).
AGENTRT_LIVE_PG_NOTIFY = os.environ.get("AGENTRT_LIVE_PG_NOTIFY", "0" if os.environ.get("REDIS_URL") else "1") == "1"
# A live socket reads the events table at least this often without being woken (the fallback of both wake-ups).
AGENTRT_LIVE_POLL_SECONDS = env_float("AGENTRT_LIVE_POLL_SECONDS", 0.5)
if AGENTRT_LIVE_POLL_SECONDS <= 0:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(f"AGENTRT_LIVE_POLL_SECONDS must be a positive number, not {AGENTRT_LIVE_POLL_SECONDS}")

# --- DRF ------------------------------------------------------------------
# The REST API (runs/api/): strict JSON in, JSON out, one error body.
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "runs.api.auth.TokenAuthentication",  # knox, without reading every token of the user per request
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["runs.api.parsers.StrictJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "runs.api.errors.exception_handler",
    "DEFAULT_THROTTLE_CLASSES": [],
    "DEFAULT_THROTTLE_RATES": {
        scope: os.environ.get(f"AGENTRT_THROTTLE_{scope.upper()}", "600/min")
        for scope in (
            "runs_create",
            "runs_cancel",
            "runs_resume",
            "runs_retry",
            "runs_input",
            "approvals_decide",
            "agents_create",
            "webhooks",
        )
    },
    "STRICT_JSON": True,
}

SPECTACULAR_SETTINGS = {
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "TITLE": "agentrt API",
    "DESCRIPTION": (
        "Durable runtime for LLM agent runs. Authenticate with `Authorization: Token <key>` "
        "(`manage.py drf_create_token USER`) or a session. Everything is scoped to your tenant; another "
        "tenant's object is 404. Errors are `{code, message, fields?, request_id}`. Writes take "
        "`application/json` only (UTF-8, at most DATA_UPLOAD_MAX_MEMORY_SIZE bytes, nesting ≤ 32, no NaN/Infinity, "
        "no NUL or lone surrogates, unknown fields refused)."
    ),
    "VERSION": "1.0.0",
    "OAS_VERSION": "3.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    "COMPONENT_SPLIT_REQUEST": True,
    "SCHEMA_PATH_PREFIX": "/api/",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "runs.api.schema.refuse_additional_properties",
    ],
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "runs.domain.values.RunStatus",
        "ApprovalStatusEnum": ["pending", "approved", "rejected", "expired", "invalidated", "cancelled"],
    },
}

# --- agentrt runtime --------------------------------------------------------
AGENTRT_SLICE_SECONDS = env_float("AGENTRT_SLICE_SECONDS", 120)
AGENTRT_MAX_CALL_SECONDS = env_float("AGENTRT_MAX_CALL_SECONDS", 300)
# Idle connections to model servers are kept this long for the next attempt (0: a new one per attempt).
AGENTRT_MODEL_KEEPALIVE_SECONDS = env_float("AGENTRT_MODEL_KEEPALIVE_SECONDS", 15)
if AGENTRT_MODEL_KEEPALIVE_SECONDS < 0:
    raise ValueError("AGENTRT_MODEL_KEEPALIVE_SECONDS must be 0 or more")
# The model-call retry policy (README, "When the model server is down"): a step's model call gets up to
# AGENTRT_MODEL_ATTEMPTS attempts (each its own model_calls row and model.response.failed); within one attempt
# an HTTP provider retries a failure before any output (connection refused or reset, 429, 5xx, a timeout
# before the first byte) up to AGENTRT_MODEL_RETRY_TRIES tries, waiting AGENTRT_MODEL_RETRY_BACKOFF_SECONDS
# x 2^(n-1) with equal jitter, at most AGENTRT_MODEL_RETRY_BACKOFF_MAX_SECONDS per wait (a Retry-After is
# honoured), and never more than AGENTRT_MODEL_RETRY_MAX_WAIT_SECONDS of waiting in all per attempt (nor
# past AGENTRT_MAX_CALL_SECONDS). The defaults ride out an outage of about 8 s in one attempt.
AGENTRT_MODEL_ATTEMPTS = env_int("AGENTRT_MODEL_ATTEMPTS", 3)
AGENTRT_MODEL_RETRY_TRIES = env_int("AGENTRT_MODEL_RETRY_TRIES", 6)
AGENTRT_MODEL_RETRY_BACKOFF_SECONDS = env_float("AGENTRT_MODEL_RETRY_BACKOFF_SECONDS", 0.5)
AGENTRT_MODEL_RETRY_BACKOFF_MAX_SECONDS = env_float("AGENTRT_MODEL_RETRY_BACKOFF_MAX_SECONDS", 8)
AGENTRT_MODEL_RETRY_MAX_WAIT_SECONDS = env_float("AGENTRT_MODEL_RETRY_MAX_WAIT_SECONDS", 30)
if AGENTRT_MODEL_ATTEMPTS < 1 or AGENTRT_MODEL_RETRY_TRIES < 1:
    raise ValueError("AGENTRT_MODEL_ATTEMPTS and AGENTRT_MODEL_RETRY_TRIES must be at least 1")
if min(AGENTRT_MODEL_RETRY_BACKOFF_SECONDS, AGENTRT_MODEL_RETRY_BACKOFF_MAX_SECONDS) < 0:
    raise ValueError("AGENTRT_MODEL_RETRY_BACKOFF_SECONDS and ..._MAX_SECONDS must be 0 or more")
if AGENTRT_MODEL_RETRY_MAX_WAIT_SECONDS < 0:
    raise ValueError("AGENTRT_MODEL_RETRY_MAX_WAIT_SECONDS must be 0 or more")
AGENTRT_RECONCILER = os.environ.get("AGENTRT_RECONCILER", "")
# A project's tools and providers: comma-separated dotted module
# paths imported by every process at startup (runs.extensions), in addition
# to each installed app's `agent_tools` / `agent_providers` module. Operator
# configuration only: never taken from a tenant.
AGENTRT_TOOL_MODULES = os.environ.get("AGENTRT_TOOL_MODULES", "")
AGENTRT_PROVIDER_MODULES = os.environ.get("AGENTRT_PROVIDER_MODULES", "")
AGENTRT_RECONCILE_TIMEOUT = env_float("AGENTRT_RECONCILE_TIMEOUT", 30)


# Outbound allow-lists (runs/net.py; README "Security model", Outbound requests): `host:port`, or a bare `host`
# for ports 80 and 443 only; an entry that does not parse stops the process with the entry named.
def _allow_list(name):
    # settings-time: settings import as little as they can at the top (a module that read settings would loop)
    from django.core.exceptions import ImproperlyConfigured

    from runs.net import parse_entry

    entries = env_list(name, "")
    for entry in entries:
        try:
            parse_entry(entry)
        except ValueError as exc:
            raise ImproperlyConfigured(f"{name}: {exc}") from None
    return entries


AGENTRT_HTTP_TOOL_ALLOWED_HOSTS = _allow_list("AGENTRT_HTTP_TOOL_ALLOWED_HOSTS")
# Names on an allow-list whose loopback and private addresses a request may go to (an IP literal on a list may
# anyway); a name not here that resolves to one is refused (address_not_allowed). Link-local and metadata: never.
AGENTRT_OUTBOUND_INTERNAL_NAMES = env_list("AGENTRT_OUTBOUND_INTERNAL_NAMES", "")
# MCP servers whose tools agents may call (runs/tools/mcp/config.py; README "MCP servers' tools"): JSON, parsed and
# validated when the apps load (a bad value stops the process naming the field).
AGENTRT_MCP_SERVERS = os.environ.get("AGENTRT_MCP_SERVERS", "")
# At most one `tool.call.progress` event per this many milliseconds for one running MCP call (docs/mcp.md).
AGENTRT_MCP_PROGRESS_INTERVAL_MS = env_int("AGENTRT_MCP_PROGRESS_INTERVAL_MS", 500)
AGENTRT_APPROVAL_TTL_SECONDS = env_float("AGENTRT_APPROVAL_TTL_SECONDS", 86400)
AGENTRT_INPUT_TTL_SECONDS = env_float("AGENTRT_INPUT_TTL_SECONDS", 86400)
# Active (non-terminal) runs per tenant unless Tenant.max_active_runs says otherwise; 0 = no limit.
AGENTRT_MAX_ACTIVE_RUNS = env_int("AGENTRT_MAX_ACTIVE_RUNS", 1000)
AGENTRT_ENABLE_FAULTPOINTS = os.environ.get("AGENTRT_ENABLE_FAULTPOINTS", "0") == "1"
AGENTRT_FAULTPOINTS = os.environ.get("AGENTRT_FAULTPOINTS", "")
AGENTRT_FAULTPOINT_DIR = os.environ.get("AGENTRT_FAULTPOINT_DIR", str(BASE_DIR / "var" / "faultpoints"))
AGENTRT_CODE_VERSION = os.environ.get("AGENTRT_CODE_VERSION", "dev")
# Per-model prices, USD per million tokens, e.g.
# {"llama3.1:8b": {"input_per_mtok": 0, "output_per_mtok": 0}}; unset = the built-in table.
AGENTRT_MODEL_PRICES = (
    json.loads(os.environ["AGENTRT_MODEL_PRICES"]) if os.environ.get("AGENTRT_MODEL_PRICES") else None
)


# Model endpoints (operator configuration; agents name one, never a URL or a
# key variable): {"<name>": {"provider": "openai", "base_url": "...",
# "api_key_env": "...", "models": [...]?}}. The built-in `openai` endpoint
# (api.openai.com, OPENAI_API_KEY) exists unless overridden. Validated here so
# a bad value stops the process with the bad key named.
def _model_endpoints():
    # settings-time, as `_allow_list`'s
    from django.core.exceptions import ImproperlyConfigured

    from runs.providers.endpoints import EndpointConfigError, parse_endpoints

    try:
        return parse_endpoints(os.environ.get("AGENTRT_MODEL_ENDPOINTS"), check_provider=False)
    except EndpointConfigError as exc:
        raise ImproperlyConfigured(str(exc)) from None


AGENTRT_MODEL_ENDPOINTS = _model_endpoints()
# Every limit's default, from the one limits table (runs/domain/limits.py; Django-free).
AGENTRT_DEFAULT_LIMITS = default_limits()

# --- Post-run hooks and webhooks (docs/webhooks.md) -------------------------
# Modules that register post-run hooks (runs.hooks.register), besides each installed app's `agent_hooks`.
AGENTRT_HOOK_MODULES = env_list("AGENTRT_HOOK_MODULES", "")
# Hosts (`host:port`, or `host` for 80/443) a webhook subscription's URL may name; checked when saved and before
# every attempt.
AGENTRT_WEBHOOK_ALLOWED_HOSTS = _allow_list("AGENTRT_WEBHOOK_ALLOWED_HOSTS")
# One webhook attempt as a whole: connecting, sending, and the whole answer (webhooks/deadline.py).
AGENTRT_WEBHOOK_TIMEOUT_SECONDS = env_float("AGENTRT_WEBHOOK_TIMEOUT_SECONDS", 10)
# Subscriptions per tenant: each event writes one delivery per matching subscription in the event's own transaction.
AGENTRT_WEBHOOK_MAX_PER_TENANT = env_int("AGENTRT_WEBHOOK_MAX_PER_TENANT", 20)
# Fernet keys for the signing secrets at rest (the first encrypts);
# unset: a key derived from SECRET_KEY (webhooks/secrets.py).
AGENTRT_WEBHOOK_SECRET_KEYS = env_list("AGENTRT_WEBHOOK_SECRET_KEYS", "")
# Where links in webhook payloads point (e.g. https://agentrt.example.com); unset: paths only.
AGENTRT_PUBLIC_URL = os.environ.get("AGENTRT_PUBLIC_URL", "").rstrip("/")
# Retries: BACKOFF × 2^(attempt-1) apart (at most 6 h), for at most MAX_AGE, then the delivery is failed.
AGENTRT_DELIVERY_BACKOFF_SECONDS = env_float("AGENTRT_DELIVERY_BACKOFF_SECONDS", 10)
AGENTRT_DELIVERY_MAX_AGE_SECONDS = env_float("AGENTRT_DELIVERY_MAX_AGE_SECONDS", 86400)
# A worker's hold on a delivery; a worker killed mid-delivery leaves it due again after this.
AGENTRT_DELIVERY_CLAIM_SECONDS = env_float("AGENTRT_DELIVERY_CLAIM_SECONDS", 60)
# How often run_maintenance rings deliveries that are due again (retries, lapsed claims, lost doorbells).
AGENTRT_DELIVERY_SWEEP_SECONDS = env_float("AGENTRT_DELIVERY_SWEEP_SECONDS", 1)
if AGENTRT_DELIVERY_CLAIM_SECONDS <= AGENTRT_WEBHOOK_TIMEOUT_SECONDS:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        "AGENTRT_DELIVERY_CLAIM_SECONDS must be longer than AGENTRT_WEBHOOK_TIMEOUT_SECONDS "
        "(else a second worker could send a delivery that is still in flight)"
    )

# Retention: the ended runs (COMPLETED, FAILED, CANCELLED) last written more than this many days ago lose
# their detail to the maintenance sweep (maintenance/retention.py); unset or 0: kept for ever.
try:
    AGENTRT_RETENTION_DAYS = float(os.environ.get("AGENTRT_RETENTION_DAYS") or 0)
    if not 0 <= AGENTRT_RETENTION_DAYS < 100_000:
        raise ValueError
except ValueError:
    from django.core.exceptions import ImproperlyConfigured  # not at the top: only a bad value needs it

    raise ImproperlyConfigured(
        f"AGENTRT_RETENTION_DAYS must be a number of days, 0 or more (0 or unset: off), "
        f"not {os.environ.get('AGENTRT_RETENTION_DAYS')!r}"
    ) from None

# --- django-q2: a doorbell, never the source of truth -----------
Q_WORKERS = env_int("AGENTRT_WORKERS", 2)
# Fair workers (README, "Workers and tenants"): leases one tenant may hold at once, checked at every claim.
# Default: half the workers, at least 1. A node knows only its own AGENTRT_WORKERS: with several worker nodes
# set it (the same everywhere) to half their sum, as `manage.py cluster` does. 0 = no limit.
AGENTRT_TENANT_MAX_RUNNING = env_int("AGENTRT_TENANT_MAX_RUNNING", max(1, Q_WORKERS // 2))
if AGENTRT_TENANT_MAX_RUNNING < 0:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured("AGENTRT_TENANT_MAX_RUNNING must be 0 (no limit) or a number of leases")
Q_TIMEOUT = int(AGENTRT_SLICE_SECONDS + AGENTRT_MAX_CALL_SECONDS + 60)
# The doorbell: on PostgreSQL an enqueue NOTIFYs and an idle pusher LISTENs,
# re-checking the queue at least every AGENTRT_Q_FALLBACK_POLL seconds.
AGENTRT_Q_DOORBELL = os.environ.get("AGENTRT_Q_DOORBELL", "1") == "1"
AGENTRT_Q_FALLBACK_POLL = env_float("AGENTRT_Q_FALLBACK_POLL", 0.5)
# A sentinel that completes no guard cycle for this long (wedged, or stopped)
# is killed by its qcluster main process, which exits 1 for its supervisor (runs/runtime/qheal.py).
AGENTRT_SENTINEL_STALL_SECONDS = env_float("AGENTRT_SENTINEL_STALL_SECONDS", 30)
Q_CLUSTER = {
    "name": "agentrt",
    "orm": "default",
    "workers": Q_WORKERS,
    "timeout": Q_TIMEOUT,
    "retry": Q_TIMEOUT * 2 + 60,
    "max_attempts": 1,
    "ack_failures": True,
    "queue_limit": Q_WORKERS,
    "bulk": 1,
    "poll": env_float("AGENTRT_Q_POLL", 0.02),
    # On PostgreSQL the pusher waits on LISTEN instead of polling (runs/runtime/doorbell.py).
    "broker_class": "runs.runtime.doorbell.DoorbellORM",
    "cache": AGENTRT_Q_STATUS_CACHE,  # where each node's status goes: what counts its live workers
    "catch_up": False,
    "save_limit": 100,
    "label": "Django Q2",
    "guard_cycle": 0.5,
}

# --- Operations (README, Operations) -----------------------------------------
# GET /metrics requires `Authorization: Bearer <token>` when set; unset, it is open (it carries no tenant data).
AGENTRT_METRICS_TOKEN = os.environ.get("AGENTRT_METRICS_TOKEN", "")
# A worker node (`qcluster`) with AGENTRT_METRICS_PORT serves its per-process histograms there; its forked
# workers share PROMETHEUS_MULTIPROC_DIR, which must be set before any app imports prometheus_client.
from ops.worker_metrics import prepare_if_worker_node  # noqa: E402 - no Django imports in that module

prepare_if_worker_node()
# `json`: one JSON object per line with run, tenant, step, epoch and worker (ops/logs.py).
AGENTRT_LOG_FORMAT = os.environ.get("AGENTRT_LOG_FORMAT", "plain")
if AGENTRT_LOG_FORMAT not in ("plain", "json"):
    raise ValueError(f"AGENTRT_LOG_FORMAT must be plain or json, not {AGENTRT_LOG_FORMAT!r}")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"run_context": {"()": "ops.logs.RunContextFilter"}},
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "ops.logs.JsonFormatter"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": AGENTRT_LOG_FORMAT, "filters": ["run_context"]}
    },
    "root": {"handlers": ["console"], "level": os.environ.get("AGENTRT_LOG_LEVEL", "WARNING")},
    "loggers": {
        "agentrt": {"level": os.environ.get("AGENTRT_LOG_LEVEL", "INFO")},
        # django-q2 adds its own plain handler unless its logger has one: ours, so every line has one format.
        "django-q": {"handlers": ["console"], "level": os.environ.get("AGENTRT_LOG_LEVEL", "INFO"), "propagate": False},
    },
}
