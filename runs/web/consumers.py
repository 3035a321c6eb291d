"""WebSocket consumers: the events table is the truth.

`ws/runs/{id}/?after=N` replays the run's events after N from the table, then
streams new ones in sequence order. One sender loop per socket reads from the
table past its cursor, so a dropped channel-layer message, or the embedded
default without Redis, still delivers every event exactly once: the layer
(with Redis) or PostgreSQL's NOTIFY (without: runs/web/live_bell.py) only
wakes the loop early; a poll every AGENTRT_LIVE_POLL_SECONDS is the fallback.
`ws/runs/` streams the status changes of the caller's tenant.
"""

from __future__ import annotations

import asyncio
import json
import logging
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.db import close_old_connections

from runs.api.parsers import MAX_DEPTH, check_document
from runs.clock import CLOCK
from runs.domain.events import STATUS_EVENTS as STATUS_EVENT_TYPES
from runs.models import Event, Run
from runs.runtime.wake import run_group, tenant_group
from runs.services import scoping
from runs.services.selectors import event_to_dict
from runs.store import live
from runs.web import live_bell
from runs.web.ws_auth import anonymous_reason, credential_of, credential_still_valid
from runs.web.ws_limits import RENEW_EVERY_SECONDS, ws_admit, ws_release, ws_renew

log = logging.getLogger("agentrt.live")
RECHECK_SECONDS = 0.5  # how often an open socket re-checks its credential and access
BATCH = 200
MAX_FRAME_CHARS = 4096  # clients send at most a ping
STATUS_EVENTS = tuple(t.value for t in STATUS_EVENT_TYPES)  # what ws/runs/ streams (runs.domain.events)


@database_sync_to_async
def _tenant_of(user):
    tenant = scoping.tenant_for(user)
    return tenant.id if tenant else None


@database_sync_to_async
def _tenant_of_run(run_id):
    return Run.objects.filter(id=run_id).values_list("tenant_id", flat=True).first()


@database_sync_to_async
def _still_allowed(kind, key, user_id, tenant_id) -> bool:
    """The credential the socket opened with is still live (no logout, token
    not revoked or expired, user active) and the user still has the access:
    a member of the same tenant, or still a superuser."""
    close_old_connections()
    return credential_still_valid(kind, key, scoping.user_with_access(user_id, tenant_id))


def _frame_problem(text_data, bytes_data) -> str | None:
    """Inbound frames are bounded and parsed without recursion errors."""
    if text_data is None:
        return "only text frames are accepted"
    if len(text_data) > MAX_FRAME_CHARS:
        return f"frames are at most {MAX_FRAME_CHARS} characters"

    try:
        content = json.loads(text_data)
    except RecursionError:
        return f"the JSON nests deeper than {MAX_DEPTH} levels"
    except ValueError:
        return "the frame is not valid JSON"
    try:
        check_document(content)
    except Exception:  # DepthExceeded, TooLarge, ValidationError: all a bad frame
        return f"the JSON nests deeper than {MAX_DEPTH} levels or holds invalid text"
    return None


class _Streaming(AsyncJsonWebsocketConsumer):
    """Shared loop: wake on a group message, a NOTIFY or every
    AGENTRT_LIVE_POLL_SECONDS, then read the table past the cursor and send
    in order; re-check the credential every RECHECK_SECONDS meanwhile."""

    group = ""
    _slot = None
    _bell = None

    async def admit(self, user, tenant_id) -> bool:
        """Before accepting: take one of the user's AGENTRT_WS_MAX_PER_USER
        slots (refused with 4429 at the cap) and remember the credential and
        the access to re-check on every poll."""
        if not await ws_admit(user.pk, self.channel_name):
            await self.refuse(4429, "user %s is at the cap of open sockets", user.pk)
            return False
        self._slot = (user.pk, self.channel_name)
        self._access = (*credential_of(self.scope), user.pk, tenant_id)
        self._checked = self._renewed = CLOCK.monotonic()
        return True

    async def refuse(self, code: int, why: str, *args) -> None:
        """Close before accepting (the client sees HTTP 403) and say why in the log (never a credential)."""
        log.info("websocket refused (%s) %s: " + why, code, self.scope.get("path", "")[:200], *args)
        await self.close(code=code)

    async def start_streaming(self):
        self._wake = asyncio.Event()
        if live.enabled():
            self._bell = live_bell.bell()
            self._bell.subscribe(self.group, self._wake)
        self._task = asyncio.create_task(self._pump())

    async def disconnect(self, code):
        task = getattr(self, "_task", None)
        if task:
            task.cancel()
        if self._bell is not None:
            bell, self._bell = self._bell, None
            bell.unsubscribe(self.group, self._wake)
        if self.group and self.channel_layer is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)
        if self._slot is not None:
            slot, self._slot = self._slot, None
            await ws_release(*slot)

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        problem = _frame_problem(text_data, bytes_data)
        if problem is not None:
            await self.send_json({"code": "invalid_frame", "message": problem})
            await self.close(code=4400)
            return
        await self.receive_json(json.loads(text_data), **kwargs)

    async def receive_json(self, content, **kwargs):
        """Clients send nothing but an optional ping; anything is ignored."""

    async def _still_allowed(self) -> bool:
        now = CLOCK.monotonic()
        if now - self._checked < RECHECK_SECONDS:
            return True
        self._checked = now
        if not await _still_allowed(*self._access):
            return False
        if self._slot is not None and now - self._renewed >= RENEW_EVERY_SECONDS:
            self._renewed = now
            await ws_renew(*self._slot)
        return True

    async def run_wake(self, message):
        self._wake.set()

    async def _pump(self):
        poll = settings.AGENTRT_LIVE_POLL_SECONDS
        read_at = -poll  # read at once
        more = False
        try:
            while True:
                if not await self._still_allowed():
                    log.info(
                        "websocket closed (4401) %s: its login or token is no longer valid, or the access is lost",
                        self.scope.get("path", "")[:200],
                    )
                    await self.close(code=4401)  # logged out, token revoked, or access lost
                    return
                now = CLOCK.monotonic()
                if more or self._wake.is_set() or now - read_at >= poll:
                    # cleared before the read: a wake-up for a commit the read misses is kept for the next
                    self._wake.clear()
                    read_at = now
                    more = bool(await self.send_new())  # drain a backlog before sleeping
                    if more:
                        continue
                try:
                    await asyncio.wait_for(self._wake.wait(), min(RECHECK_SECONDS, max(0.0, read_at + poll - now)))
                except TimeoutError:
                    pass
        except asyncio.CancelledError:
            raise
        except Exception:
            await self.close(code=1011)


class RunEventsConsumer(_Streaming):
    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.refuse(4403, "%s", anonymous_reason(self.scope))
            return
        tenant_id = await _tenant_of(user)
        run_id = self.scope["url_route"]["kwargs"]["run_id"]
        query = parse_qs(self.scope.get("query_string", b"").decode())
        try:
            self.cursor = max(0, int((query.get("after") or ["0"])[0]))
        except ValueError:
            self.cursor = -1
        run = await self._run(user, run_id)
        if run is None:  # before any frame: the handshake is refused
            await self.refuse(4404, "no run %s that user %s can see", str(run_id)[:64], user.pk)
            return
        if self.cursor < 0:
            await self.refuse(4400, "`after` is not a number")
            return
        # What keeps the socket open is what let it open: membership of the
        # run's tenant, or else being a superuser (tenant None in the re-check).
        if not await self.admit(user, tenant_id if await _tenant_of_run(run.id) == tenant_id else None):
            return
        self.run_id = run.id
        self.group = run_group(run.id)
        if self.channel_layer is not None:
            await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.start_streaming()

    @database_sync_to_async
    def _run(self, user, run_id):
        # Reading a run's events is a view: a superuser may watch any tenant's run.
        return scoping.scoped_one(Run.objects.only("id", "tenant_id"), user, run_id)

    @database_sync_to_async
    def _fetch(self):
        close_old_connections()
        rows = list(Event.objects.filter(run_id=self.run_id, sequence__gt=self.cursor).order_by("sequence")[:BATCH])
        return [event_to_dict(e) for e in rows]

    async def send_new(self) -> int:
        events = await self._fetch()
        for event in events:
            if event["sequence"] <= self.cursor:
                continue
            await self.send_json(event)
            self.cursor = event["sequence"]
        return len(events)


class RunsConsumer(_Streaming):
    """Status changes of every run in the caller's tenant."""

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.refuse(4403, "%s", anonymous_reason(self.scope))
            return
        tenant_id = await _tenant_of(user)
        if tenant_id is None:
            await self.refuse(4403, "user %s is a member of no tenant", user.pk)
            return
        if not await self.admit(user, tenant_id):
            return
        self.tenant_id = tenant_id
        self.cursor = await self._start_cursor()
        self.group = tenant_group(tenant_id)
        if self.channel_layer is not None:
            await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.start_streaming()

    @database_sync_to_async
    def _start_cursor(self):
        last = (
            scoping.tenant_events(self.tenant_id)
            .filter(type__in=STATUS_EVENTS)  # what the socket streams, and what events_tenant_status_idx holds
            .order_by("-id")
            .values_list("id", flat=True)
            .first()
        )
        return last or 0

    @database_sync_to_async
    def _fetch(self):
        close_old_connections()
        rows = list(
            scoping.tenant_events(self.tenant_id)
            .filter(id__gt=self.cursor, type__in=STATUS_EVENTS)
            .select_related("run", "run__agent")
            .order_by("id")[:BATCH]
        )
        out = []
        for e in rows:
            frame = event_to_dict(e)
            if e.run is not None:
                frame["run_status"] = e.run.status
                frame["agent"] = e.run.agent.name
                frame["step_count"] = e.run.step_count
                frame["cost_usd"] = (e.run.usage or {}).get("cost_usd", 0)
            out.append((e.id, frame))
        return out

    async def send_new(self) -> int:
        rows = await self._fetch()
        for event_id, frame in rows:
            await self.send_json(frame)
            self.cursor = event_id
        return len(rows)
