"""MCP tools in the registry, in a run, and at publish.

**Registered.** Each configured `<server>.tools.<tool>` is a registry tool
`mcp__<server>__<tool>`, so agents list it in `tools`, policies and the
tenant's `allowed_tools` name it like any other. Its registry spec is the
operator's: `read_only` only when the configuration says `"read_only"`,
otherwise a side effect (`external_write`) that takes the whole pipeline —
its watermark committed before anything is sent — whatever the server's
annotations say. Its parameters there are only `{"type": "object"}`: the
real schema is the version's pin.

**Pinned.** `pins_for` (called by `agent_load`) fetches each named tool's
entry from its server and returns the `mcp_tools` block of the version
(runs/tools/mcp/pin.py). A run of that version sees its MCP tools through
`PinnedTools` (the run's `tools` port): the spec from the pin (description,
input schema — validated by jsonschema, never compiled to code: a server's
schema is not ours — and `schema_version` carrying the pin's digest, so the
request hash covers it), the class from the configuration. Once per slice
(the first time a run's context asks) it compares the pins with what each
server lists now: a tool that changed or disappeared has no spec any more —
the rules of a changed spec, unchanged: a new call fails `tool_changed`, a
pending approval is invalidated, an interrupted call's re-run is a
`reconcile_conflict` — and every call compares again right before it is
sent (`call_pinned`), so nothing reaches a server whose tool no longer is
what was pinned.

**Called** (`call_pinned`), every outcome classified by where it happened:
nothing sent (no connection, the listing failed or changed, the deadline
passed, a read-only call cancelled first): `failed`. Sent: the server's
answer is the result (its `isError` a failed result the model sees); a JSON-RPC
error saying the request was refused before it ran (`REFUSED`) is
`failed`; anything else after the send — a broken stream, a server process
that died, a timeout, any other error — is `uncertain` for a side effect
(`OutcomeUnknown`: the reconciler or an operator decides) and never sent
again here. A read-only call is sent again once, as a new request, when its
connection broke (the 2026-07-28 rule), and one still running when the run
is cancelled is abandoned with `notifications/cancelled`; a side effect
already sent runs to its answer or its timeout, however the run ends.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any

import mcp_types as types
from jsonschema import Draft202012Validator
from mcp.shared.exceptions import MCPError

from runs.clock import CLOCK
from runs.domain.errors import InputRequired, OutcomeUnknown, ToolFailure
from runs.domain.scrub import scrub_text
from runs.domain.values import ToolSpec
from runs.tools.mcp import client as mcp_client
from runs.tools.mcp.config import ServerConfig, split_name, tool_name
from runs.tools.mcp.long import Progress, poll, question_of, responses, task_handle, task_result
from runs.tools.mcp.pin import PinFailed, digest, entry_of, pin_of, valid_pin
from runs.tools.mcp.transport import IDEMPOTENCY_META, Sending
from runs.tools.registry import REGISTRY, ToolRegistry

DEFINITION_KEY = "mcp_tools"
GRACE_SECONDS = 5.0  # the registry's timeout over the configured one: our own classification comes first
POLL = 0.05  # how often a waiting read-only call looks at the run's cancellation
MAX_CONTENT_TEXT = 32 * 1024
# JSON-RPC errors that say the request was refused before the tool ran: nothing took effect.
REFUSED = frozenset(
    {
        types.METHOD_NOT_FOUND,
        types.INVALID_PARAMS,
        types.HEADER_MISMATCH,
        types.UNSUPPORTED_PROTOCOL_VERSION,
        types.MISSING_REQUIRED_CLIENT_CAPABILITY,
    }
)

SERVERS: dict[str, ServerConfig] = {}  # the configured servers (runs.tools.mcp.load)
INTERNAL_NAMES: list[tuple[str, ...]] = [()]  # AGENTRT_OUTBOUND_INTERNAL_NAMES, as load() read it


def base_spec(config: ServerConfig, tool: str) -> ToolSpec:
    read_only = config.tools[tool]
    return ToolSpec(
        name=tool_name(config.name, tool),
        description=f"Tool {tool!r} of the MCP server {config.name!r} (its description is pinned at publish).",
        parameters={"type": "object"},
        schema_version="mcp",
        read_only=read_only,
        side_effect="none" if read_only else "external_write",
        timeout_seconds=config.timeout_seconds + GRACE_SECONDS,
    )


def _unpinned(arguments: Any, context: Any) -> Any:
    raise ToolFailure(
        "tool_changed", "an MCP tool runs only under the pin of an agent version that lists it; nothing was sent"
    )


def server_of(name: str) -> tuple[ServerConfig, str] | None:
    """The configured server and tool of an `mcp__` name, or None."""
    parts = split_name(name)
    if parts is None:
        return None
    config = SERVERS.get(parts[0])
    if config is None or parts[1] not in config.tools:
        return None
    return config, parts[1]


# -- at publish --------------------------------------------------------------


def pins_for(tools: list[str]) -> dict[str, Any]:
    """The `mcp_tools` block for the MCP tools among `tools` (empty when none)."""
    wanted: dict[str, list[str]] = {}
    for name in tools:
        found = server_of(name)
        if found is not None:
            wanted.setdefault(found[0].name, []).append(found[1])
    pins: dict[str, Any] = {}
    for server, names in wanted.items():
        config = SERVERS[server]
        listed = list_now(config)
        by_name = {t.name: t for t in listed}
        for tool in names:
            entry = by_name.get(tool)
            full = tool_name(server, tool)
            if entry is None:
                raise PinFailed(f"{full}: the MCP server {server!r} does not list a tool named {tool!r}")
            try:
                pins[full] = pin_of(server, tool, entry)
            except PinFailed as exc:
                raise PinFailed(f"{full}: {exc}") from None
    return pins


def list_now(config: ServerConfig) -> list:
    """The server's listing now; PinFailed naming the server when it cannot be had."""
    hub = mcp_client.hub()
    timeout = min(config.timeout_seconds, mcp_client.LIST_TIMEOUT)
    try:
        return hub.run(hub.list_tools(config, timeout, INTERNAL_NAMES[0]), mcp_client.START_TIMEOUT + timeout)
    except (mcp_client.Unavailable, MCPError, TimeoutError, OSError) as exc:
        raise PinFailed(f"the MCP server {config.name!r} could not be listed: {_reason(exc)}") from None


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return scrub_text(text)[:300]


# -- in a run ----------------------------------------------------------------


class PinnedTools:
    """The `tools` port of a run whose version pins MCP tools; everything else is the registry's."""

    def __init__(self, base: ToolRegistry, pins: dict[str, Any], listing: Callable[[ServerConfig], list] = list_now):
        self._base = base
        self._pins = {name: pin for name, pin in pins.items() if valid_pin(pin)}
        self._listing = listing
        self._current: dict[str, dict[str, str] | None] = {}  # server -> {tool: digest}, None: not reachable
        self._specs: dict[str, ToolSpec] = {}
        self._validators: dict[str, Draft202012Validator] = {}

    def __getattr__(self, name: str) -> Any:  # names, model, reconciler...: the registry's
        return getattr(self._base, name)

    def _pinned(self, name: str) -> tuple[dict[str, Any], ServerConfig, str] | None:
        pin = self._pins.get(name)
        found = server_of(name) if pin is not None else None
        if pin is None or found is None:
            return None
        return pin, found[0], found[1]

    def _now(self, config: ServerConfig) -> dict[str, str] | None:
        if config.name not in self._current:
            try:
                listed = self._listing(config)
                self._current[config.name] = {t.name: digest(entry_of(t)) for t in listed}
            except PinFailed:
                self._current[config.name] = None  # not reachable now: the call's own check decides
        return self._current[config.name]

    def changed(self, name: str) -> bool:
        found = self._pinned(name)
        if found is None:
            return False
        pin, config, tool = found
        now = self._now(config)
        return now is not None and now.get(tool) != pin["digest"]

    def spec(self, name: str) -> ToolSpec | None:
        base = self._base.spec(name)
        if base is None or split_name(name) is None:
            return base
        found = self._pinned(name)
        if found is None or self.changed(name):
            return None  # not pinned by this version, or no longer what was pinned
        pin, config, tool = found
        spec = self._specs.get(name)
        if spec is None:
            spec = base.model_copy(
                update={
                    "description": pin["description"],
                    "parameters": pin["input_schema"],
                    "schema_version": f"mcp:{pin['digest']}",
                }
            )
            self._specs[name] = spec
        return spec

    def unavailable(self, name: str) -> tuple[str, str] | None:
        """Why a tool the agent lists has no spec, when it is an MCP tool."""
        found = server_of(name)
        if found is None:
            return None
        if name not in self._pins:
            return "tool_changed", f"the agent version has no pin for {name!r}; publish it again"
        if self.changed(name):
            return (
                "tool_changed",
                f"the MCP server {found[0].name!r} no longer lists {found[1]!r} as it was when this agent version "
                "was published (it is gone, or its description, input schema or annotations changed); "
                "it was not called",
            )
        return None

    def validate(self, name: str, arguments: Any) -> list[str]:
        if split_name(name) is None or name not in self._pins:
            return self._base.validate(name, arguments)
        if self.spec(name) is None:
            return [f"tool {name!r} changed since the agent version was published"]
        validator = self._validators.get(name)
        if validator is None:
            validator = self._validators[name] = Draft202012Validator(self._pins[name]["input_schema"])
        errors = []
        try:
            found = sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
        except Exception as exc:  # a server's schema that cannot be applied refuses the call, never the run
            return [f"(arguments): the pinned input schema could not be applied ({type(exc).__name__})"]
        for err in found:
            where = ".".join(str(p) for p in err.absolute_path) or "(arguments)"
            errors.append(f"{where}: {scrub_text(err.message)[:200]}")
        return errors[:10]

    def shown(self, name: str) -> dict[str, Any]:
        """`shown` for this version's pins."""
        return shown(name, {DEFINITION_KEY: self._pins})

    def execute(self, name: str, arguments: Any, context: Any) -> Any:
        found = self._pinned(name)
        if found is None:
            return self._base.execute(name, arguments, context)
        pin, config, tool = found
        return call_pinned(config, tool, pin, arguments, context)


def shown_by(tools: Any, name: str) -> dict[str, Any]:
    """`shown` of a run's `tools` port (`{}` unless it pins MCP tools)."""
    return tools.shown(name) if isinstance(tools, PinnedTools) else {}


def tools_for(definition: dict[str, Any] | None, base: ToolRegistry = REGISTRY) -> Any:
    """The `tools` port for a run of `definition`: the registry, or `PinnedTools` when it pins MCP tools."""
    pins = (definition or {}).get(DEFINITION_KEY)
    if not isinstance(pins, dict) or not pins:
        return base
    return PinnedTools(base, pins)


# -- the call ----------------------------------------------------------------


TIMED_OUT, CANCELLED = object(), object()


def _wait(future: concurrent.futures.Future, seconds: float, signal: Any, progress: Progress | None = None) -> Any:
    """The call's answer (or its exception), or TIMED_OUT after `seconds`, or CANCELLED once `signal` (a
    read-only call's cancellation; None for a side effect) is set. Meanwhile `progress` is written (here,
    on the caller's thread: its store is this thread's)."""
    deadline = CLOCK.monotonic() + seconds
    watch = signal is not None or (progress is not None and progress.report is not None)
    while True:
        left = deadline - CLOCK.monotonic()
        if left <= 0:
            return TIMED_OUT
        try:
            return future.result(min(left, POLL) if watch else left)
        except concurrent.futures.TimeoutError:
            if progress is not None:
                progress.drain()
            if signal is not None and signal.is_set():
                return CANCELLED


def _room(context: Any) -> float:
    """What is left of the run's deadline (infinity without one)."""
    left = context.seconds_left() if hasattr(context, "seconds_left") else None
    return float("inf") if left is None else left


def _limit(config: ServerConfig, context: Any) -> float:
    left = context.seconds_left() if hasattr(context, "seconds_left") else None
    return config.timeout_seconds if left is None else min(config.timeout_seconds, left)


def _check_pin(config: ServerConfig, tool: str, pin: dict[str, Any], seconds: float, bound: float) -> None:
    """Nothing is sent unless the server lists the tool exactly as pinned, now (the listing within `seconds`,
    starting the server too within `bound`)."""
    hub = mcp_client.hub()
    try:
        listed = hub.run(hub.list_tools(config, seconds, INTERNAL_NAMES[0]), bound)
    except (mcp_client.Unavailable, MCPError, TimeoutError, OSError) as exc:
        raise ToolFailure(
            "mcp_unavailable", f"the MCP server {config.name!r} could not be reached ({_reason(exc)}); nothing was sent"
        ) from None
    current = next((t for t in listed if t.name == tool), None)
    if current is None:
        raise ToolFailure("tool_changed", f"the MCP server {config.name!r} no longer lists {tool!r}; nothing was sent")
    if digest(entry_of(current)) != pin["digest"]:
        raise ToolFailure(
            "tool_changed",
            f"the MCP server {config.name!r} lists {tool!r} differently since this agent version was published "
            "(its description, input schema or annotations changed); nothing was sent. Publish the agent again "
            "to pin what the server lists now.",
        )


def call_pinned(config: ServerConfig, tool: str, pin: dict[str, Any], arguments: Any, context: Any) -> Any:
    """Call `tool` as pinned; classified as the module's docstring says."""
    read_only = config.tools[tool]
    signal = getattr(context, "cancelled", None) if read_only else None
    attempts = 2 if read_only else 1  # never a second request for a side effect
    for attempt in range(1, attempts + 1):
        limit = _limit(config, context)
        if limit <= 0:
            raise ToolFailure("deadline_exceeded", "the run's deadline has passed; nothing was sent")
        if signal is not None and signal.is_set():
            raise ToolFailure("cancelled", "the run was cancelled; nothing was sent")
        # The listing (and the server's start, if it is not running) is bounded apart; the call gets its own time.
        _check_pin(
            config,
            tool,
            pin,
            min(limit, mcp_client.LIST_TIMEOUT),
            min(_room(context), mcp_client.START_TIMEOUT + limit),
        )
        left = _limit(config, context)
        if left <= 0:
            raise ToolFailure(
                "deadline_exceeded", "the run's deadline passed while the listing was checked; nothing was sent"
            )
        sending = Sending(key=None if read_only else context.idempotency_key)
        hub = mcp_client.hub()
        progress = Progress(getattr(context, "report", None))
        answer = _answer(getattr(context, "continued", None))
        until = CLOCK.monotonic() + left
        future = hub.submit(
            hub.call(
                config,
                tool,
                dict(arguments or {}),
                meta={IDEMPOTENCY_META: context.idempotency_key},
                sending=sending,
                read_timeout=left if read_only else None,  # a side effect's request is never abandoned by the SDK
                internal_names=INTERNAL_NAMES[0],
                progress=progress.callback,
                **answer,
            )
        )
        try:
            result = _wait(future, left, signal, progress)
        except Exception as exc:
            if not sending.sent:
                raise ToolFailure(
                    "mcp_unavailable",
                    f"the MCP server {config.name!r} could not be reached ({_reason(exc)}); nothing was sent",
                ) from None
            code = exc.code if isinstance(exc, MCPError) else None
            if code in REFUSED:
                raise ToolFailure(
                    "mcp_refused", f"the MCP server refused the call before running it ({code}: {_reason(exc)})"
                ) from None
            lost = code == types.CONNECTION_CLOSED
            if read_only and lost and attempt < attempts:
                continue  # read-only: sent again once, as a new request, on a fresh connection
            if read_only:
                raise ToolFailure("mcp_error", f"the call failed after it was sent ({_reason(exc)})") from None
            raise OutcomeUnknown(
                "connection_lost" if lost else "mcp_error",
                f"the call to the MCP server {config.name!r} failed after it was sent ({_reason(exc)}); "
                "whether it took effect is unknown",
            ) from None
        if result is TIMED_OUT:
            if read_only:
                future.cancel()  # notifications/cancelled: a read-only call may be abandoned
                raise ToolFailure("timeout", f"no answer within {left:.3g} s")
            # Left in flight, never cancelled: the server may still be acting on it.
            raise OutcomeUnknown(
                "timeout",
                f"no answer from the MCP server {config.name!r} within {left:.3g} s after the call was sent; "
                "whether it took effect is unknown",
            )
        if result is CANCELLED:
            future.cancel()  # notifications/cancelled
            raise OutcomeUnknown("cancelled", "the run was cancelled while the read-only call ran; it was abandoned")
        try:
            return answer_of(config, tool, result, context, until=until, signal=signal, progress=progress)
        finally:
            progress.drain(final=True)
    raise AssertionError("unreachable")  # pragma: no cover


def _answer(continued: Any) -> dict[str, Any]:
    """The `inputResponses` and `requestState` of a call issued again with the user's answer to its question."""
    remote = continued.get("remote") if isinstance(continued, dict) else None
    if not isinstance(remote, dict) or remote.get("kind") != "mcp_input":
        return {}
    try:
        given = responses(remote, str(continued.get("answer", "")))
    except ValueError as exc:
        raise ToolFailure(
            "mcp_input_invalid", f"the answer cannot be given to the MCP server (it needs {exc}); nothing was sent"
        ) from None
    return {"input_responses": given, "request_state": remote.get("request_state")}


def answer_of(
    config: ServerConfig,
    tool: str,
    raw: dict[str, Any],
    context: Any,
    *,
    until: float,
    signal: Any = None,
    progress: Progress | None = None,
) -> Any:
    """A `tools/call`'s answer, told apart by its `resultType`: a task (polled to its end, its id recorded
    first for a side effect), a question (`InputRequired`: the run asks its user), or the result."""
    kind = raw.get("resultType") if isinstance(raw, dict) else None
    if kind == "task":
        return _task(config, tool, raw, context, until=until, signal=signal, progress=progress)
    if kind == "input_required":
        question, handle, shown = question_of(config.name, tool, raw)
        raise InputRequired(question, handle, {"server": config.name, "mcp_tool": tool, "questions": shown})
    if kind not in (None, "complete"):
        raise ToolFailure(
            "mcp_error",
            f"the MCP server answered with a result agentrt does not know ({str(kind)[:40]})",
            uncertain=not config.tools[tool],
        )
    try:
        parsed = types.CallToolResult.model_validate(raw, by_name=False)
    except ValueError:
        raise ToolFailure(
            "mcp_error", "the MCP server's answer is not a tool result", uncertain=not config.tools[tool]
        ) from None
    return result_of(parsed)


def get_task(config: ServerConfig, task_id: str) -> Any:
    """`tasks/get` for `task_id` on `config`'s server, as a function of a timeout (`long.poll`'s `get`)."""

    def get(timeout: float) -> dict[str, Any]:
        hub = mcp_client.hub()
        return hub.run(hub.get_task(config, task_id, timeout, INTERNAL_NAMES[0]), mcp_client.START_TIMEOUT + timeout)

    return get


POLL_ERRORS = (mcp_client.Unavailable, MCPError, TimeoutError, OSError, ValueError)


def _task(
    config: ServerConfig,
    tool: str,
    raw: dict[str, Any],
    context: Any,
    *,
    until: float,
    signal: Any,
    progress: Progress | None,
) -> Any:
    """The server made the call a task: a side effect's task id is committed to the call's record before
    anything else (`context.record`; a lost lease stops here), then `tasks/get` is polled until the task
    ends (its result is the call's) or the call's time runs out (unknown, the id kept for the takeover)."""
    read_only = config.tools[tool]
    handle = task_handle(config.name, tool, raw)
    record = getattr(context, "record", None)
    if record is not None:
        record(handle)
    try:
        task = poll(
            get_task(config, handle["task_id"]),
            handle,
            until - CLOCK.monotonic(),
            stop=(lambda: signal.is_set()) if signal is not None else (lambda: False),
            tick=progress.drain if progress is not None else (lambda: None),
        )
    except POLL_ERRORS as exc:
        if read_only:
            raise ToolFailure("mcp_error", f"the MCP server's task could not be polled ({_reason(exc)})") from None
        raise OutcomeUnknown(
            "mcp_task_unknown",
            f"the MCP server's task {handle['task_id']} could not be polled ({_reason(exc)}); whether it took "
            "effect is unknown until the server answers for it",
        ) from None
    if task is None:
        if read_only:
            raise ToolFailure("timeout", f"the MCP server's task {handle['task_id']} did not end in time")
        raise OutcomeUnknown(
            "timeout",
            f"the MCP server's task {handle['task_id']} was still running when the call's time ran out; its id is "
            "kept, and whether it took effect is known once the server says the task ended",
        )
    return result_of(task_result(task))


def _content(item: Any) -> dict[str, Any]:
    data = item.model_dump(by_alias=True, mode="json", exclude_none=True) if hasattr(item, "model_dump") else item
    if not isinstance(data, dict):
        return {"type": "unknown"}
    kind = data.get("type")
    if kind == "text":
        return {"type": "text", "text": str(data.get("text", ""))[:MAX_CONTENT_TEXT]}
    if kind in ("image", "audio"):
        size = len(str(data.get("data", "")))
        return {"type": kind, "mimeType": str(data.get("mimeType", ""))[:100], "omitted_base64_chars": size}
    if kind == "resource":
        resource: dict[str, Any] = data["resource"] if isinstance(data.get("resource"), dict) else {}
        shown = {"uri": str(resource.get("uri", ""))[:2000]}
        if "text" in resource:
            shown["text"] = str(resource["text"])[:MAX_CONTENT_TEXT]
        return {"type": "resource", "resource": shown}
    if kind == "resource_link":
        return {
            "type": "resource_link",
            "uri": str(data.get("uri", ""))[:2000],
            "name": str(data.get("name", ""))[:200],
        }
    return {"type": str(kind)[:50]}


def result_of(result: Any) -> Any:
    """A server's answer as the call's result (the pipeline scrubs and bounds it)."""
    content = [_content(c) for c in (result.content or [])[:100]]
    out: dict[str, Any] = {"content": content}
    if result.structured_content is not None:
        out["structured"] = result.structured_content
    if result.is_error:
        text = " ".join(c.get("text", "") for c in content if c.get("type") == "text")
        raise ToolFailure("mcp_tool_error", text[:2000] or "the MCP tool reported an error")
    return out


# -- registration --------------------------------------------------------------

_REGISTERED: set[str] = set()


def register(servers: dict[str, ServerConfig], registry: ToolRegistry = REGISTRY) -> list[str]:
    """Register every configured tool (replacing what an earlier `register` did); return their names."""
    taken = [
        tool_name(c.name, t) for c in servers.values() for t in c.tools if tool_name(c.name, t) in registry.names()
    ]
    foreign = [name for name in taken if name not in _REGISTERED]
    if foreign:
        raise ValueError(f"{foreign[0]!r} is already a registered tool; an MCP server's tool cannot take its name")
    for name in list(_REGISTERED):
        registry.unregister(name)
    _REGISTERED.clear()
    SERVERS.clear()
    SERVERS.update(servers)
    for config in servers.values():
        for tool in config.tools:
            spec = base_spec(config, tool)
            registry.register(spec, _unpinned)
            _REGISTERED.add(spec.name)
    return sorted(_REGISTERED)


HINTS_NOTE = (
    "The server's annotations are hints, not trusted: whether this tool has a side effect is the operator's "
    "classification (AGENTRT_MCP_SERVERS), shown as side_effect."
)


def shown(name: str, definition: Any) -> dict[str, Any]:
    """What an approval shows of an MCP tool beyond any call's: its server, its tool and the server's hints
    as pinned, labelled as hints (`{}` for any other tool)."""
    parts = split_name(name)
    pins = definition.get(DEFINITION_KEY) if isinstance(definition, dict) else None
    pin = pins.get(name) if isinstance(pins, dict) else None
    if parts is None or not isinstance(pin, dict) or not valid_pin(pin):
        return {}
    return {"mcp": {"server": parts[0], "tool": parts[1], "server_hints": dict(pin["annotations"]), "note": HINTS_NOTE}}
