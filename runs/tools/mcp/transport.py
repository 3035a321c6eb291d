"""The two transports to an MCP server, and what a call needs to know of them:
whether its request left.

**Sent or not.** A `tools/call` runs with `SENDING` set to a `Sending` of its
own. The transports mark it `sent` once a byte of that request may have
reached the server: the stdio transport when the request's line was written
to the server's stdin, the HTTP transport when the first byte of its POST is
handed to the socket (the POST runs in the caller's context: the SDK copies
it, so the context variable travels with the request). A failure before that
is `failed` (nothing left); after it, `uncertain`.

**stdio** (`stdio_transport`): the server is started with the environment
the configuration names and nothing else (`ServerConfig.process_env`), in a
session of its own, through a launcher that asks the kernel to SIGKILL it
when this process dies (`PR_SET_PDEATHSIG`; Linux): a worker killed with
SIGKILL leaves no server behind. Stopping closes its stdin, then signals its
process group (SIGTERM, then SIGKILL). Its stderr goes to the `agentrt.mcp`
log, each line scrubbed and cut to `STDERR_LINE` characters, at most
`STDERR_LINES_PER_MINUTE` lines a minute (the rest counted). A line on
stdout longer than `MAX_LINE` ends the connection.

**Streamable HTTP** (`http_client`): the SDK's transport over an httpx2
client that never reads proxies from the environment, follows no redirect
off the endpoint's origin (the SDK's rule), resolves names with a bound and
connects only to addresses runs.net lets a request go to (an allow-listed
name that starts answering with a metadata or private address is refused:
DNS rebinding), sends the configured headers read from their environment
variables, and on a side effect's `tools/call` the `Idempotency-Key` header
(the same key as the request's `_meta`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
import httpcore2
import httpx2
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage

from runs import net
from runs.clock import CLOCK
from runs.domain.scrub import scrub_text
from runs.errors import AddressRefused
from runs.tools.mcp.config import ServerConfig

log = logging.getLogger("agentrt.mcp")

MAX_LINE = 8 * 1024 * 1024  # one JSON-RPC message on stdout
STDERR_LINE = 500
STDERR_LINES_PER_MINUTE = 120
STOP_GRACE = 2.0  # seconds for a server to exit after its stdin closes, then after SIGTERM
IDEMPOTENCY_META = "io.agentrt/idempotency-key"
HTTP_READ_GRACE = 60.0  # seconds an HTTP response may stay silent beyond the call's timeout


@dataclass
class Sending:
    """One `tools/call` on its way: its idempotency key (sent as a header over HTTP) and whether it left."""

    key: str | None = None
    sent: bool = False


SENDING: contextvars.ContextVar[Sending | None] = contextvars.ContextVar("agentrt_mcp_sending", default=None)


def _is_call(message: Any) -> bool:
    return isinstance(message, types.JSONRPCRequest) and message.method == "tools/call"


# -- stdio -------------------------------------------------------------------

# Run as `python -I -S -c LAUNCHER <parent pid> <names> <program> <args...>`: ask for SIGKILL when the parent
# dies, make sure it has not died already, then become the server (the setting survives execve) with only the
# variables `names` lists (comma-separated): not the LC_CTYPE the launcher's own interpreter may have added.
LAUNCHER = (
    "import ctypes,os,sys\n"
    "try:\n"
    " ctypes.CDLL(None).prctl(1, 9)\n"
    "except Exception:\n"
    " pass\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    " os._exit(70)\n"
    "keep = set(sys.argv[2].split(','))\n"
    "os.execve(sys.argv[3], sys.argv[3:], {k: v for k, v in os.environ.items() if k in keep})\n"
)


class _StdinStream:
    """The session's write stream: each message one line on the server's stdin, written in the sender's task."""

    def __init__(self, process: asyncio.subprocess.Process, closed: anyio.Event):
        self._process = process
        self._closed = closed
        self._lock = asyncio.Lock()

    async def send(self, item: SessionMessage, /) -> None:
        stdin = self._process.stdin
        if stdin is None or self._closed.is_set() or stdin.is_closing():
            raise anyio.BrokenResourceError("the MCP server's stdin is closed")
        line = item.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
        sending = SENDING.get() if _is_call(item.message) else None
        async with self._lock:
            try:
                stdin.write(line)
                await stdin.drain()
            except (ConnectionError, OSError, RuntimeError) as exc:
                raise anyio.BrokenResourceError(f"the MCP server's stdin failed ({type(exc).__name__})") from exc
        if sending is not None:
            sending.sent = True  # the whole line is in the pipe: the server may act on it

    async def aclose(self) -> None:
        stdin = self._process.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class StdioProcess:
    """A running stdio server: its process, streams and the tasks that pump them."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.process: asyncio.subprocess.Process | None = None
        self.closed = anyio.Event()  # stdout ended or the process exited: the connection is over
        self._tasks: list[asyncio.Task] = []
        self.read_send: MemoryObjectSendStream
        self.read_receive: MemoryObjectReceiveStream

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None and not self.closed.is_set()

    async def start(self) -> None:
        command = list(self.config.command)
        env = self.config.process_env()
        if sys.platform.startswith("linux"):
            command = [sys.executable, "-I", "-S", "-c", LAUNCHER, str(os.getpid()), ",".join(env), *command]
        self.process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=self.config.cwd,
            start_new_session=True,
            limit=MAX_LINE,
        )
        self.read_send, self.read_receive = anyio.create_memory_object_stream[SessionMessage | Exception](16)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._stdout()), loop.create_task(self._stderr())]
        log.info("MCP server %s started (pid %s)", self.config.name, self.process.pid)

    async def _stdout(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        try:
            while True:
                try:
                    line = await self.process.stdout.readline()
                except (ValueError, asyncio.LimitOverrunError):
                    log.warning("MCP server %s wrote a line longer than %d bytes; closing", self.config.name, MAX_LINE)
                    break
                if not line:
                    break
                text = line.decode("utf-8", "replace").strip()
                if not text:
                    continue
                try:
                    message = types.jsonrpc_message_adapter.validate_json(text, by_name=False)
                except ValueError:
                    log.warning("MCP server %s wrote a line that is not JSON-RPC; ignored", self.config.name)
                    continue
                try:
                    await self.read_send.send(SessionMessage(message))
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    break
        finally:
            self.closed.set()
            self.read_send.close()

    async def _stderr(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        window, shown, dropped = CLOCK.monotonic(), 0, 0
        while True:
            try:
                line = await self.process.stderr.readline()
            except (ValueError, asyncio.LimitOverrunError):
                line = b"(a line longer than the limit)\n"
            if not line:
                break
            now = CLOCK.monotonic()
            if now - window >= 60:
                if dropped:
                    log.warning("MCP server %s: %d lines of stderr not logged", self.config.name, dropped)
                window, shown, dropped = now, 0, 0
            if shown >= STDERR_LINES_PER_MINUTE:
                dropped += 1
                continue
            shown += 1
            text = scrub_text(line.decode("utf-8", "replace").rstrip())[:STDERR_LINE]
            log.info("MCP server %s stderr: %s", self.config.name, text)
        if dropped:
            log.warning("MCP server %s: %d lines of stderr not logged", self.config.name, dropped)

    async def stop(self) -> None:
        """Close stdin, wait; SIGTERM its process group, wait; SIGKILL. Every wait bounded."""
        process = self.process
        if process is None:
            return
        if process.stdin is not None and not process.stdin.is_closing():
            process.stdin.close()
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None and process.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, sig)
            try:
                await asyncio.wait_for(process.wait(), STOP_GRACE)
                break
            except TimeoutError:
                continue
        self.closed.set()
        self.read_send.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        log.info("MCP server %s stopped (pid %s, exit %s)", self.config.name, process.pid, process.returncode)


@contextlib.asynccontextmanager
async def stdio_transport(server: StdioProcess) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's `Transport` over a started `StdioProcess` (which its owner stops)."""
    assert server.process is not None
    yield server.read_receive, _StdinStream(server.process, server.closed)


# -- Streamable HTTP ---------------------------------------------------------


class _Stream(httpcore2.AsyncNetworkStream):
    """A connection's stream; the first write of a `tools/call` POST marks it sent."""

    def __init__(self, inner: httpcore2.AsyncNetworkStream):
        self._inner = inner

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        sending = SENDING.get()
        if sending is not None and buffer:
            sending.sent = True  # from here on the server may have the request
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(self, ssl_context, server_hostname=None, timeout=None) -> httpcore2.AsyncNetworkStream:
        return _Stream(await self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class GuardedBackend(httpcore2.AsyncNetworkBackend):
    """httpcore2's network backend, connecting only where runs.net allows."""

    def __init__(self, resolve_seconds: float, internal_names: tuple[str, ...]):
        self._inner = httpcore2.AnyIOBackend()
        self._resolve_seconds = resolve_seconds
        self._internal = internal_names

    async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        try:
            found = await anyio.to_thread.run_sync(net.resolve_within, host, port, self._resolve_seconds)
            addresses = net.routable(host, found, internal_names=self._internal)
        except AddressRefused as exc:
            raise httpcore2.ConnectError(str(exc)) from exc
        except OSError as exc:
            raise httpcore2.ConnectError(f"cannot resolve {host!r}: {exc}") from exc
        last: Exception | None = None
        for *_, address in addresses:
            try:
                stream = await self._inner.connect_tcp(str(address[0]), port, timeout, local_address, socket_options)
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                last = exc
            else:
                return _Stream(stream)
        raise last or httpcore2.ConnectError(f"no address for {host!r}")

    async def connect_unix_socket(self, path, timeout=None, socket_options=None):
        raise httpcore2.ConnectError("MCP servers are reached over TCP only")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


async def _idempotency_header(request: httpx2.Request) -> None:
    sending = SENDING.get()
    if sending is not None and sending.key:
        request.headers["Idempotency-Key"] = sending.key


def http_client(config: ServerConfig, *, internal_names: tuple[str, ...] = ()) -> httpx2.AsyncClient:
    """The httpx2 client the SDK's Streamable HTTP transport uses for `config`."""
    timeout = config.timeout_seconds
    transport = httpx2.AsyncHTTPTransport(trust_env=False, retries=0)
    pool = transport._pool  # noqa: SLF001  (the only way to give httpx2's pool a network backend)
    pool._network_backend = GuardedBackend(min(timeout, 10.0) / 2, internal_names)  # noqa: SLF001
    return httpx2.AsyncClient(
        headers=config.headers(),
        # A side effect's stream is held past its call's timeout, then closed (at 2026-07-28 closing it is the
        # cancellation, which the server may ignore): its outcome is already unknown by then.
        timeout=httpx2.Timeout(timeout, read=timeout + HTTP_READ_GRACE),
        trust_env=False,
        follow_redirects=False,
        transport=transport,
        event_hooks={"request": [_idempotency_header]},
    )
