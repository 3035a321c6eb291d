"""One MCP client per server in each process, on an event loop of its own.

`HUB` holds, per process, a thread running an asyncio loop and a
`Connection` per configured server, opened on first use and reused: a stdio
server is started then (never at import, never in a process that does not
call it), and started again when it has died; a Streamable HTTP connection
that failed is opened again on the next call. Each connection is owned by a
task of that loop (the SDK's task groups are entered and left there), and
speaks whichever protocol the server answers (`Client(mode="auto")`:
`server/discover`, 2026-07-28, else the 2025-11-25 handshake; `protocol`
in the configuration forces one).

The loop is this process's: a forked child (django-q2 forks its workers)
starts with none and opens its own connections; the parent's servers are not
the child's to stop. Servers stop when the process exits normally (`atexit`,
and multiprocessing's finalizers for a forked worker, which skip `atexit`);
a process killed outright takes its stdio servers with it (the launcher's
PR_SET_PDEATHSIG, runs/tools/mcp/transport.py).

Only the SDK's session API is used to call a tool (`send_request` with a
`tools/call`), not `Client.call_tool`: that one sends a call again after a
`HEADER_MISMATCH` with a listing fetched anew — a second request with what
the server now says, where we fail `tool_changed` — and answers a server's
questions by itself. A request is never sent twice from here; `call` reports
whether it left (`Sending.sent`).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import multiprocessing.util
import os
import threading
from collections.abc import Coroutine
from typing import Any

import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import TypeAdapter

from runs.tools.mcp.config import ServerConfig
from runs.tools.mcp.long import GetTask, TasksExtension
from runs.tools.mcp.transport import SENDING, Sending, StdioProcess, http_client, stdio_transport

log = logging.getLogger("agentrt.mcp")

MAX_PAGES = 20  # of a tools/list
LIST_TIMEOUT = 10.0  # at most, of a call's time, for the listing it is checked against
START_TIMEOUT = 30.0  # for a server to start and answer the handshake (or discover), whatever its call timeout
# A call's result is read raw and told apart by its `resultType` (runs.tools.mcp.tools.answer_of): a task
# (`"task"`, the Tasks extension) must never be read as an empty complete result.
_RAW: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])
CLIENT_INFO = types.Implementation(name="agentrt", version="1")


class Unavailable(Exception):
    """The server could not be reached or started: nothing was sent."""


class Connection:
    """One server's session in this process, owned by one task of the hub's loop."""

    def __init__(self, config: ServerConfig, internal_names: tuple[str, ...]):
        self.config = config
        self.internal_names = internal_names
        self.client: Client | None = None
        self.process: StdioProcess | None = None
        self.ready = asyncio.Event()
        self.stopping = asyncio.Event()
        self.ended = asyncio.Event()
        self.error: BaseException | None = None
        self.task: asyncio.Task | None = None

    def usable(self) -> bool:
        if self.client is None or self.ended.is_set() or self.stopping.is_set():
            return False
        return self.process is None or self.process.alive()

    async def _own(self) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                if self.config.transport == "stdio":
                    self.process = StdioProcess(self.config)
                    stack.push_async_callback(self.process.stop)
                    await self.process.start()
                    transport: Any = stdio_transport(self.process)
                else:
                    http = http_client(self.config, internal_names=self.internal_names)
                    await stack.enter_async_context(http)
                    transport = streamable_http_client(str(self.config.url), http_client=http)
                mode = {"auto": "auto", "2025-11-25": "legacy"}.get(self.config.protocol, self.config.protocol)
                client = Client(
                    transport, mode=mode, cache=None, client_info=CLIENT_INFO, extensions=[TasksExtension()]
                )
                await stack.enter_async_context(client)
                self.client = client
                self.ready.set()
                waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(self.stopping.wait())]
                if self.process is not None:
                    waits.append(asyncio.ensure_future(self.process.closed.wait()))
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()
                if self.process is not None and not self.stopping.is_set():
                    log.warning(
                        "MCP server %s (pid %s) ended (exit %s); it is started again on the next call",
                        self.config.name,
                        self.process.pid,
                        self.process.process.returncode if self.process.process else None,
                    )
        except BaseException as exc:  # reported to whoever waits for `ready`; the task itself ends quietly
            self.error = exc
            if not isinstance(exc, (Exception, asyncio.CancelledError)):
                raise
        finally:
            self.client = None
            self.ended.set()
            self.ready.set()

    async def open(self, timeout: float) -> None:
        self.task = asyncio.get_running_loop().create_task(self._own())
        try:
            await asyncio.wait_for(self.ready.wait(), timeout)
        except TimeoutError:
            self.stopping.set()
            raise Unavailable(f"MCP server {self.config.name!r} did not answer within {timeout:g} s") from None
        if self.client is None:
            error = self.error
            reason = f"{type(error).__name__}: {str(error)[:300]}" if error is not None else "it ended"
            raise Unavailable(f"could not connect to MCP server {self.config.name!r} ({reason})")

    async def close(self) -> None:
        self.stopping.set()
        if self.task is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(self.task), 10)


class Hub:
    """This process's loop thread and connections."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self.thread = threading.Thread(target=self._run, name="agentrt-mcp", daemon=True)
        self.thread.start()
        self._started.wait()
        self.connections: dict[str, Connection] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.stopped = False

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._started.set)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
        """Run `coro` on the loop and wait at most `timeout` seconds (TimeoutError: cancelled)."""
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no answer within {timeout:g} s") from None

    async def connection(
        self, config: ServerConfig, timeout: float, internal_names: tuple[str, ...] = ()
    ) -> Connection:
        lock = self._locks.setdefault(config.name, asyncio.Lock())
        async with lock:
            current = self.connections.get(config.name)
            if current is not None and current.usable() and current.config == config:
                return current
            if current is not None:
                self.connections.pop(config.name, None)
                await current.close()
            if self.stopped:
                raise Unavailable("this process is stopping")
            fresh = Connection(config, internal_names)
            await fresh.open(timeout)
            self.connections[config.name] = fresh
            return fresh

    async def drop(self, name: str, connection: Connection) -> None:
        """Close `connection` (a call found it broken); the next call opens another."""
        if self.connections.get(name) is connection:
            self.connections.pop(name, None)
        await connection.close()

    async def list_tools(self, config: ServerConfig, timeout: float, internal_names: tuple[str, ...] = ()) -> list:
        """Every tool the server lists now (all pages, at most MAX_PAGES, each page within `timeout`), as the
        SDK's `Tool` models; a server not running yet gets START_TIMEOUT to start."""
        conn = await self.connection(config, START_TIMEOUT, internal_names)
        assert conn.client is not None
        tools: list = []
        cursor = None
        try:
            for _ in range(MAX_PAGES):
                page = await asyncio.wait_for(
                    conn.client.session.list_tools(
                        params=types.PaginatedRequestParams(cursor=cursor) if cursor else None
                    ),
                    timeout,
                )
                tools.extend(page.tools)
                cursor = page.next_cursor
                if not cursor:
                    break
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED or (
                exc.code == types.INVALID_REQUEST and "session" in str(exc).lower()
            ):
                await self.drop(config.name, conn)  # a dead process or an expired session: a new one next time
            raise
        return tools

    async def call(
        self,
        config: ServerConfig,
        tool: str,
        arguments: dict[str, Any],
        *,
        meta: dict[str, Any],
        sending: Sending,
        read_timeout: float | None,
        internal_names: tuple[str, ...] = (),
        progress: Any = None,
        input_responses: dict[str, Any] | None = None,
        request_state: str | None = None,
    ) -> dict[str, Any]:
        """One `tools/call`, sent once; its result raw. `sending.sent` says whether it left; `progress`
        gets its progress notifications; `input_responses` and `request_state` answer a server's question."""
        conn = await self.connection(config, START_TIMEOUT, internal_names)
        assert conn.client is not None
        request = types.CallToolRequest(
            params=types.CallToolRequestParams(
                name=tool,
                arguments=arguments,
                _meta=meta,
                input_responses=input_responses,
                request_state=request_state,
            )
        )
        token = SENDING.set(sending)
        try:
            return await conn.client.session.send_request(
                request,
                _RAW,  # type: ignore[type-var]
                request_read_timeout_seconds=read_timeout,
                progress_callback=progress,
            )
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED:
                await self.drop(config.name, conn)
            raise
        finally:
            SENDING.reset(token)

    async def get_task(
        self, config: ServerConfig, task_id: str, timeout: float, internal_names: tuple[str, ...] = ()
    ) -> dict[str, Any]:
        """One `tasks/get` (the Tasks extension), raw: what the server says of the task now."""
        conn = await self.connection(config, START_TIMEOUT, internal_names)
        assert conn.client is not None
        try:
            return await conn.client.session.send_request(
                GetTask(params={"taskId": task_id}),
                _RAW,  # type: ignore[type-var]
                request_read_timeout_seconds=timeout,
            )
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED:
                await self.drop(config.name, conn)
            raise

    async def _stop_all(self) -> None:
        self.stopped = True
        connections = list(self.connections.values())
        self.connections.clear()
        await asyncio.gather(*(c.close() for c in connections), return_exceptions=True)

    def stop(self) -> None:
        """Stop every server this process started (idempotent); the loop thread ends."""
        if self.stopped or os.getpid() != self.pid or not self.thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._stop_all(), self.loop).result(30)
        except Exception:  # at exit: log, never raise
            log.exception("stopping the MCP servers")
        self.loop.call_soon_threadsafe(self.loop.stop)


_HUB: dict[str, Hub] = {}
_HUB_LOCK = threading.Lock()


def hub() -> Hub:
    """This process's hub, started on first use."""
    current = _HUB.get("hub")
    if current is not None and current.pid == os.getpid():
        return current
    with _HUB_LOCK:
        current = _HUB.get("hub")
        if current is None or current.pid != os.getpid():
            current = Hub()
            _HUB["hub"] = current
            atexit.register(current.stop)
            multiprocessing.util.Finalize(current, current.stop, exitpriority=100)
        return current


def stop() -> None:
    """Stop this process's servers (tests; the exit handlers do it otherwise)."""
    current = _HUB.pop("hub", None)
    if current is not None:
        current.stop()


def _forget() -> None:
    """In a forked child: the parent's loop thread and servers are not ours."""
    global _HUB_LOCK
    _HUB_LOCK = threading.Lock()
    _HUB.clear()


os.register_at_fork(after_in_child=_forget)
