"""Tools are registered in code: name, arguments (a pydantic model or raw JSON
Schema), schema version, read_only, side-effect class, timeout, and — for a
control tool — the suspension it causes.

A *typed* tool is a function whose first parameter is annotated with a
pydantic model:

    class Charge(BaseModel):
        customer: str
        amount_cents: int = Field(gt=0)

    @register(name="charge_card", read_only=False, side_effect="external_write")
    def charge_card(args: Charge, ctx: ToolExecutionContext) -> Receipt: ...

The JSON Schema the model is shown is derived from the model; the arguments
are validated by it in strict JSON mode (`"10"` is not `10`: a policy `when`
and the function see the same values), and the function receives the model
instance. A raw tool (`parameters=` JSON Schema) receives the arguments dict.
Either may be `async def`. A return value is made JSON (pydantic models,
dataclasses, datetimes, UUIDs included) before the pipeline bounds it.
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import json
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from django.db import connections
from jsonschema import Draft202012Validator
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError, to_jsonable_python

from runs.domain.errors import OutcomeUnknown, ToolFailure
from runs.domain.values import ToolSpec
from runs.tools.fastcheck import compile_accept

# The suspensions a control tool may declare — ask the user, or start child
# runs — and the arguments the runtime reads from its call.
CONTROLS: dict[str, tuple[str, ...]] = {"ask_user": ("question",), "delegate": ("agent", "input")}


class DuplicateTool(ValueError):
    """Two different functions were registered under one tool name."""


@dataclass(frozen=True)
class _Typed:
    """How a registered function is called."""

    model: type[BaseModel] | None  # the arguments model of a typed tool, else None (a dict is passed)
    takes_context: bool
    is_async: bool
    origin: str  # "module.qualname", for a duplicate's message
    reconciler: Callable | None = None


def _origin(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _inspect(fn: Callable) -> _Typed:
    target = inspect.unwrap(fn)
    params = list(inspect.signature(target).parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    model = None
    if positional:
        first = _annotation(target, positional[0])
        if isinstance(first, type) and issubclass(first, BaseModel):
            model = first
    takes_context = len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)
    return _Typed(
        model=model,
        takes_context=takes_context,
        is_async=inspect.iscoroutinefunction(target),
        origin=_origin(target),
    )


def _annotation(fn: Callable, param: inspect.Parameter) -> Any:
    """The first parameter's annotation, resolved (a string under `from
    __future__ import annotations`: in the function's globals and closure)."""
    annotation = param.annotation
    if not isinstance(annotation, str):
        return None if annotation is inspect.Parameter.empty else annotation
    try:
        names = dict(getattr(fn, "__globals__", {}))
        names.update(inspect.getclosurevars(fn).nonlocals)
        return eval(annotation, names)  # noqa: S307  (an annotation the project's own code wrote)
    except Exception:
        return None


def _field_errors(exc: ValidationError) -> list[str]:
    errors = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"]) or "(arguments)"
        errors.append(f"{where}: {str(err['msg'])[:200]}")
    return errors[:10]


def to_json(value: Any) -> Any:
    """A tool's return value as JSON data (pydantic models, dataclasses, dates, UUIDs...)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    try:
        return to_jsonable_python(value)
    except (PydanticSerializationError, TypeError, ValueError):
        raise ToolFailure(
            "unserialisable_result", f"the tool returned a {type(value).__name__}, which is not JSON"
        ) from None


class ToolRegistry:
    def __init__(self):
        # name -> (spec, fn, JSON Schema validator): the shape tests and callers rely on.
        self._tools: dict[str, tuple[ToolSpec, Callable, Draft202012Validator]] = {}
        self._typed: dict[str, _Typed] = {}
        # name -> (the validator it was compiled beside, a compiled accept-check of
        # a raw tool's schema: runs.tools.fastcheck); used only beside that validator.
        self._accept: dict[str, tuple[Draft202012Validator, Callable[[Any], bool]]] = {}
        self._lock = threading.RLock()

    def register(
        self,
        spec: ToolSpec,
        fn: Callable,
        *,
        model: type[BaseModel] | None = None,
        reconciler: Callable | None = None,
        replace: bool = True,
    ) -> None:
        """Register `fn` as `spec.name`. With `replace=False` (the decorator), a
        name already held by a *different* function is `DuplicateTool`; the
        same function registered again (a module imported twice) is not."""
        Draft202012Validator.check_schema(spec.parameters)
        if spec.control is not None:
            if spec.control not in CONTROLS:
                raise ValueError(f"tool {spec.name!r}: control must be one of {sorted(CONTROLS)}, not {spec.control!r}")
            properties = spec.parameters.get("properties") or {}
            missing = [arg for arg in CONTROLS[spec.control] if arg not in properties]
            if missing:
                raise ValueError(
                    f"tool {spec.name!r}: a control={spec.control!r} tool takes the arguments "
                    f"{', '.join(CONTROLS[spec.control])} (the runtime reads them); missing: {', '.join(missing)}"
                )
        found = _inspect(fn)  # `model` is explicit: a typed function given a raw schema receives a dict
        typed = _Typed(model, found.takes_context, found.is_async, found.origin, reconciler)
        accept = compile_accept(spec.parameters) if model is None else None
        with self._lock:
            held = self._typed.get(spec.name)
            if not replace and spec.name in self._tools and held is not None and held.origin != typed.origin:
                raise DuplicateTool(
                    f"two tools are named {spec.name!r}: {held.origin} and {typed.origin} (tool names are unique)"
                )
            validator = Draft202012Validator(spec.parameters)
            self._tools[spec.name] = (spec, fn, validator)
            self._typed[spec.name] = typed
            if accept is None:
                self._accept.pop(spec.name, None)
            else:
                self._accept[spec.name] = (validator, accept)

    def unregister(self, name: str) -> None:
        with self._lock:
            self._tools.pop(name, None)
            self._typed.pop(name, None)
            self._accept.pop(name, None)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def spec(self, name: str) -> ToolSpec | None:
        entry = self._tools.get(name)
        return entry[0] if entry else None

    def model(self, name: str) -> type[BaseModel] | None:
        typed = self._typed.get(name)
        return typed.model if typed else None

    def reconciler(self, name: str) -> Callable | None:
        typed = self._typed.get(name)
        return typed.reconciler if typed else None

    def snapshot(self) -> tuple[dict, dict, dict]:
        with self._lock:
            return dict(self._tools), dict(self._typed), dict(self._accept)

    def restore(self, snapshot: tuple[dict, dict, dict]) -> None:
        with self._lock:
            self._tools, self._typed, self._accept = dict(snapshot[0]), dict(snapshot[1]), dict(snapshot[2])

    def unavailable(self, name: str) -> tuple[str, str] | None:
        """A registered tool is there or not: nothing in between (a run's MCP pins say otherwise)."""
        return None

    def validate(self, name: str, arguments: Any) -> list[str]:
        entry = self._tools.get(name)
        if entry is None:
            return [f"unknown tool {name!r}"]
        model = self.model(name)
        if model is not None:
            try:
                self._instance(model, arguments)
            except ValidationError as exc:
                return _field_errors(exc)
            return []
        fast = self._accept.get(name)
        if fast is not None and fast[0] is entry[2] and fast[1](arguments):
            return []  # valid under 2020-12 too (runs.tools.fastcheck); jsonschema decides otherwise
        errors = []
        for err in sorted(entry[2].iter_errors(arguments), key=lambda e: list(e.absolute_path)):
            where = ".".join(str(p) for p in err.absolute_path) or "(arguments)"
            errors.append(f"{where}: {err.message[:200]}")
        return errors[:10]

    @staticmethod
    def _instance(model: type[BaseModel], arguments: Any) -> BaseModel:
        # Strict JSON mode: the arguments arrived as JSON, and a string is not
        # a number (a policy `when` reads the same values the function gets).
        return model.model_validate_json(json.dumps(arguments, ensure_ascii=False), strict=True)

    def _call(self, name: str, arguments: Any, context: Any) -> Any:
        fn = self._tools[name][1]
        typed = self._typed.get(name)
        if typed is None or typed.origin != _origin(inspect.unwrap(fn)):  # replaced in place (tests)
            found = _inspect(fn)
            typed = _Typed(typed.model if typed else None, found.takes_context, found.is_async, found.origin)
        if typed.model is not None:
            try:
                arguments = self._instance(typed.model, arguments)
            except ValidationError as exc:  # validated before; a spec changed underneath
                raise ToolFailure("schema_invalid", "; ".join(_field_errors(exc))[:1000]) from None
        call = (arguments, context) if typed.takes_context else (arguments,)
        value = fn(*call)
        if inspect.isawaitable(value):
            value = asyncio.run(_awaited(value, context, abandon_on_cancel=bool(self._tools[name][0].read_only)))
        return to_json(value) if typed.model is not None or not _plain(value) else value

    def execute(self, name: str, arguments: Any, context: Any) -> Any:
        """Run the tool, enforcing its `timeout_seconds`: the tool runs in its
        own thread and the runtime stops waiting when the timeout elapses.
        The call is then `uncertain` (`OutcomeUnknown("timeout")`): it may
        still take effect, and Python cannot stop the thread, which finishes
        (or not) on its own with nobody reading its result. A read-only async
        tool's task is cancelled when the run is cancelled; a side effect's
        runs on (`_awaited`)."""
        timeout = getattr(context, "timeout_seconds", None)
        if not timeout or timeout <= 0:
            return self._call(name, arguments, context)
        box: dict[str, Any] = {}
        done = Done()

        def target():
            try:
                box["value"] = self._call(name, arguments, context)
            except BaseException as exc:  # handed to the caller below
                box["error"] = exc
            finally:
                for opened in connections.all(initialized_only=True):
                    opened.close()  # this thread's own connections, if the tool used the ORM

        TOOL_THREADS.run(target, done)
        if not done.wait(float(timeout)):
            raise OutcomeUnknown(
                "timeout",
                f"the tool did not finish within its timeout ({float(timeout):g} s); whether it took effect is unknown",
            )
        if "error" in box:
            raise box["error"]
        return box.get("value")


def _cpu_finder() -> Callable[[], int] | None:
    """glibc's `sched_getcpu` (the CPU the calling thread runs on), or None."""
    try:
        found = ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError):
        return None
    found.restype = ctypes.c_int
    found.argtypes = []
    return cast(Callable[[], int], found)


_SCHED_GETCPU = _cpu_finder() if hasattr(os, "sched_setaffinity") else None


def _move_next_to_caller(native_id: int) -> None:
    """Ask the scheduler to run the thread `native_id` on the caller's CPU.

    The caller hands a call over and blocks until it is done, so its CPU is
    free for the tool thread; woken there, neither wake-up crosses CPUs. On
    the 2-vCPU VM of bench/RESULTS.md a wake-up on the other vCPU cost about
    70 us each way, and a hand-over there and back 95 us of a 2 ms step;
    on the caller's CPU it is about 20 us. A hint only: where the platform
    has no such call or refuses it, nothing changes."""
    if _SCHED_GETCPU is None:
        return
    cpu = _SCHED_GETCPU()
    if cpu < 0:
        return
    try:
        os.sched_setaffinity(native_id, {cpu})
    except OSError:  # not in this process's CPU set any more, or not allowed: leave it where it is
        pass


class Done:
    """Set once by the tool thread, awaited once by the caller: a lock held
    from birth and released by `set`. `threading.Event` does the same with
    a Condition built in Python per call (about 5 us more per call here)."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        self._lock.release()

    def wait(self, timeout: float) -> bool:
        """True once set (within `timeout` seconds); False otherwise."""
        return self._lock.acquire(timeout=min(timeout, threading.TIMEOUT_MAX))


class ToolThreads:
    """Threads for tool calls, reused: a call hands its function to an idle
    thread, or to a new one when none is idle (starting a thread per call
    cost about 0.15 ms of every step: bench/RESULTS.md). A thread whose tool
    outlives its timeout stays busy until the tool returns, if ever, and only
    then becomes idle again; the next call never waits for it. At most
    `keep` idle threads are kept; the rest end. An idle thread is moved to
    the caller's CPU before it is handed a call (`_move_next_to_caller`)."""

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._idle: list[tuple[queue.SimpleQueue, int]] = []

    def run(self, fn: Callable[[], None], done: Done) -> None:
        """Run `fn` on a tool thread and set `done` when it has returned (or
        raised: `fn` reports its own outcome)."""
        with self._lock:
            idle = self._idle.pop() if self._idle else None
        if idle is None:
            inbox: queue.SimpleQueue = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), name="tool", daemon=True).start()
        else:
            inbox, native_id = idle
            _move_next_to_caller(native_id)
        inbox.put((fn, done))

    def _serve(self, inbox: queue.SimpleQueue) -> None:
        me = threading.get_native_id()
        while True:
            fn, done = inbox.get()
            try:
                fn()
            finally:
                with self._lock:
                    stay = len(self._idle) < self.keep
                    if stay:
                        self._idle.append((inbox, me))
                # The caller's wake-up is the last thing before this thread
                # waits again, so the caller finds the interpreter free.
                done.set()
            if not stay:
                return

    def idle(self) -> int:
        with self._lock:
            return len(self._idle)

    def forget(self) -> None:
        """In a forked child: the parent's threads do not exist there."""
        self._lock = threading.Lock()
        self._idle = []


TOOL_THREADS = ToolThreads()
os.register_at_fork(after_in_child=TOOL_THREADS.forget)  # django-q2 forks its workers


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool, dict, list))


async def _awaited(awaitable: Any, context: Any, *, abandon_on_cancel: bool) -> Any:
    """Await a coroutine tool. A read-only tool's task (`abandon_on_cancel`)
    is cancelled when the run is; a side effect's never is: its watermark is
    committed before it starts, so it runs to completion (or the runtime's
    timeout) and its outcome is recorded however the run ends."""
    task = asyncio.ensure_future(awaitable)
    signal = getattr(context, "cancelled", None) if abandon_on_cancel else None
    while not task.done():
        done, _ = await asyncio.wait({task}, timeout=0.05)
        if not done and signal is not None and signal.is_set():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                raise OutcomeUnknown(
                    "cancelled", "the run was cancelled while the tool ran; whether it took effect is unknown"
                ) from None
    return task.result()


def _schema_of(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema()
    schema.setdefault("type", "object")
    return schema


REGISTRY = ToolRegistry()


def register(
    *,
    name: str,
    read_only: bool,
    parameters: dict[str, Any] | None = None,
    side_effect: str = "none",
    description: str = "",
    timeout_seconds: float = 30.0,
    schema_version: str = "1",
    control: str | None = None,
    reconciler: Callable | None = None,
):
    """Decorator: register `fn(arguments, context)` as a tool.

    With `parameters` (raw JSON Schema) `fn` receives the arguments dict.
    Without it, `fn`'s first parameter must be annotated with a pydantic
    model: the schema is derived from it and `fn` receives an instance.
    `control` names the suspension a control tool causes (`"ask_user"`: its
    `question` is asked and the run waits for the answer; `"delegate"`: a
    child run of `agent` on `input` starts and the run waits for it) — the
    function is then never called;
    `reconciler(view, invocation)` answers for an interrupted call of this
    tool (see `runs.tools.reconcile`). Registering a second function under a
    name already taken is `DuplicateTool`."""
    if control is True:  # the boolean form of before: the one control tool there was
        control = "ask_user" if name == "ask_user" else None
    if control is False:
        control = None

    def wrap(fn):
        model = _inspect(fn).model
        if parameters is None and model is None:
            raise TypeError(
                f"tool {name!r}: give parameters= (JSON Schema) or annotate the first parameter of "
                f"{_origin(fn)} with a pydantic model"
            )
        schema = parameters if parameters is not None else _schema_of(cast(type[BaseModel], model))
        doc = inspect.getdoc(fn) or (model.__doc__ if model is not None and parameters is None else None) or ""
        summary = (doc.strip().splitlines() or [""])[0]
        REGISTRY.register(
            ToolSpec(
                name=name,
                description=description or summary,
                parameters=schema,
                schema_version=schema_version,
                read_only=read_only,
                side_effect=side_effect,
                timeout_seconds=timeout_seconds,
                control=control,
            ),
            fn,
            model=model if parameters is None else None,
            reconciler=reconciler,
            replace=False,
        )
        return fn

    return wrap
