"""Typed tools (issue 13, item 2) and control tools by declaration (item 3):
the registry derives the schema from a pydantic model, validates arguments by
it (strict: the values a policy reads are the values the function gets),
calls the function with the instance and the context, awaits async
functions, and makes the return value JSON."""

from __future__ import annotations

import asyncio
import os
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from uuid import UUID, uuid4

import pytest
from pydantic import BaseModel, Field

from runs.domain.cancellation import Token
from runs.domain.errors import OutcomeUnknown, ToolFailure
from runs.domain.pipeline import ToolExecutionContext
from runs.domain.scrub import MAX_RESULT_BYTES, bound
from runs.domain.values import CancelReason, ToolSpec
from runs.tools import REGISTRY, DuplicateTool, register
from tests.conftest import wait_for


class Address(BaseModel):
    city: str
    zip: str = Field(pattern=r"^[0-9]{5}$")


class Ship(BaseModel):
    """Ship a parcel."""

    sku: str = Field(min_length=1)
    quantity: int = Field(gt=0, le=10)
    to: Address


@dataclass
class Shipped:
    sku: str
    at: datetime
    tracking: UUID


def context(token: Token | None = None, timeout: float = 5.0) -> ToolExecutionContext:
    return ToolExecutionContext(
        run_id=uuid4(),
        step_number=3,
        call_id="c1",
        invocation_id=uuid4(),
        idempotency_key="key-123",
        attempt=2,
        timeout_seconds=timeout,
        token=token or Token(),
    )


@pytest.fixture
def registered():
    names: list[str] = []

    def add(name: str, **kwargs):
        def wrap(fn):
            names.append(name)
            return register(name=name, **kwargs)(fn)

        return wrap

    yield add
    for name in names:
        REGISTRY.unregister(name)


GOOD = {"sku": "A-1", "quantity": 2, "to": {"city": "Lyon", "zip": "69001"}}


def test_the_schema_is_derived_from_the_model_and_the_function_gets_the_instance(registered):
    seen = []

    @registered("ship", read_only=False, side_effect="external_write", timeout_seconds=7)
    def ship(args: Ship, ctx: ToolExecutionContext) -> Shipped:
        seen.append((args, ctx.idempotency_key, ctx.attempt, ctx.step, ctx.cancelled.is_set()))
        return Shipped(sku=args.sku, at=datetime(2026, 1, 2, tzinfo=UTC), tracking=UUID(int=7))

    spec = REGISTRY.spec("ship")
    assert spec.parameters["required"] == ["sku", "quantity", "to"]
    assert spec.parameters["properties"]["quantity"] == {
        "exclusiveMinimum": 0,
        "maximum": 10,
        "title": "Quantity",
        "type": "integer",
    }
    assert spec.description == "Ship a parcel."  # no docstring on the function: the model's
    assert (spec.read_only, spec.side_effect, spec.timeout_seconds, spec.control) == (False, "external_write", 7, None)
    assert REGISTRY.validate("ship", GOOD) == []
    value = REGISTRY.execute("ship", GOOD, context())
    (args, key, attempt, step, cancelled) = seen[0]
    assert isinstance(args, Ship) and isinstance(args.to, Address) and args.to.city == "Lyon"
    assert (key, attempt, step, cancelled) == ("key-123", 2, 3, False)
    assert value == {"sku": "A-1", "at": "2026-01-02T00:00:00Z", "tracking": str(UUID(int=7))}


@pytest.mark.parametrize(
    "arguments, named",
    [
        ({**GOOD, "quantity": "2"}, "quantity: Input should be a valid integer"),  # strict: "2" is not 2
        ({**GOOD, "quantity": 11}, "quantity: Input should be less than or equal to 10"),
        ({k: v for k, v in GOOD.items() if k != "sku"}, "sku: Field required"),
        ({**GOOD, "to": {"city": "Lyon", "zip": "6900"}}, "to.zip: String should match pattern"),
        ("not an object", "(arguments): Input should be an object"),
    ],
)
def test_invalid_arguments_name_the_field_and_the_function_does_not_run(registered, arguments, named):
    calls = []

    @registered("ship", read_only=False, side_effect="external_write")
    def ship(args: Ship, ctx) -> str:
        calls.append(args)
        return "shipped"

    errors = REGISTRY.validate("ship", arguments)
    assert any(e.startswith(named) for e in errors), errors
    with pytest.raises(ToolFailure) as info:  # even if asked to run them anyway
        REGISTRY.execute("ship", arguments, context())
    assert info.value.code == "schema_invalid"
    assert calls == []


def test_a_function_of_one_parameter_and_a_pydantic_return_value(registered):
    class Out(BaseModel):
        n: int

    @registered("count", read_only=True)
    def count(args: Ship) -> Out:
        return Out(n=args.quantity)

    assert REGISTRY.execute("count", GOOD, context()) == {"n": 2}


def test_async_functions_are_awaited(registered):
    @registered("ship_async", read_only=True)
    async def ship_async(args: Ship, ctx: ToolExecutionContext) -> dict:
        await asyncio.sleep(0.01)
        return {"sku": args.sku, "key": ctx.idempotency_key}

    assert REGISTRY.execute("ship_async", GOOD, context()) == {"sku": "A-1", "key": "key-123"}


def test_a_read_only_async_tool_is_cancelled_when_the_run_is(registered):
    started = threading.Event()
    finished = []

    @registered("slow_lookup", read_only=True, timeout_seconds=30)
    async def slow_lookup(args: Ship, ctx) -> str:
        started.set()
        await asyncio.sleep(30)
        finished.append(True)
        return "late"

    token = Token()
    threading.Thread(target=lambda: (started.wait(10), token.cancel(CancelReason.REQUESTED)), daemon=True).start()
    with pytest.raises(OutcomeUnknown) as info:
        REGISTRY.execute("slow_lookup", GOOD, context(token, timeout=30))
    assert info.value.code == "cancelled" and finished == []


def test_a_side_effect_async_tool_runs_to_completion_when_the_run_is_cancelled(registered):
    """Its watermark is committed before it starts: a cancel does not cut it
    short, its answer is what the runtime records."""
    started, release = threading.Event(), threading.Event()

    @registered("ship_async_effect", read_only=False, side_effect="external_write", timeout_seconds=30)
    async def ship_async_effect(args: Ship, ctx) -> dict:
        started.set()
        while not release.is_set():
            await asyncio.sleep(0.01)
        return {"shipped": args.sku, "cancelled_seen": ctx.cancelled.is_set()}

    token = Token()

    def cancel_then_release():
        started.wait(10)
        token.cancel(CancelReason.REQUESTED)
        release.set()  # the answer comes only after the cancel was set

    threading.Thread(target=cancel_then_release, daemon=True).start()
    assert REGISTRY.execute("ship_async_effect", GOOD, context(token, timeout=30)) == {
        "shipped": "A-1",
        "cancelled_seen": True,
    }


def test_a_value_that_is_not_json_is_a_failed_result(registered):
    @registered("weird", read_only=True)
    def weird(args: Ship, ctx):
        return object()

    with pytest.raises(ToolFailure) as info:
        REGISTRY.execute("weird", GOOD, context())
    assert info.value.code == "unserialisable_result"


def test_a_result_over_the_cap_is_truncated_as_before(registered):
    @registered("big", read_only=True)
    def big(args: Ship, ctx) -> list[str]:
        return ["x" * 1000] * (MAX_RESULT_BYTES // 500)

    value, truncated = bound(REGISTRY.execute("big", GOOD, context()))
    assert truncated and value["truncated"] is True


def test_raw_json_schema_tools_still_receive_the_dict(registered):
    @registered("raw", read_only=True, parameters={"type": "object", "properties": {"n": {"type": "integer"}}})
    def raw(arguments, context):
        return {"got": type(arguments).__name__, "n": arguments["n"]}

    assert REGISTRY.validate("raw", {"n": "1"}) == ["n: '1' is not of type 'integer'"]
    assert REGISTRY.execute("raw", {"n": 1}, context()) == {"got": "dict", "n": 1}


def test_a_function_without_a_model_or_a_schema_is_refused():
    with pytest.raises(TypeError, match="pydantic model"):

        @register(name="untyped", read_only=True)
        def untyped(arguments, context):
            return None

    assert REGISTRY.spec("untyped") is None


def test_two_functions_with_one_name_are_an_error_and_the_first_stays(registered):
    @registered("dup", read_only=True)
    def first(args: Ship, ctx):
        return "first"

    with pytest.raises(DuplicateTool, match=r"two tools are named 'dup': .*first and .*second"):

        @register(name="dup", read_only=True)
        def second(args: Ship, ctx):
            return "second"

    assert REGISTRY.execute("dup", GOOD, context()) == "first"
    register(name="dup", read_only=True)(first)  # the same function again (a module imported twice) is not


def test_control_is_declared_and_checked(registered):
    assert REGISTRY.spec("ask_user").control == "ask_user"
    assert REGISTRY.spec("echo").control is None
    with pytest.raises(ValueError, match="control must be one of"):
        REGISTRY.register(
            ToolSpec(name="later", parameters={"type": "object"}, read_only=True, control="teleport"), print
        )
    assert REGISTRY.spec("later") is None


def test_a_tool_past_its_timeout_holds_its_thread_and_the_next_call_does_not_wait_for_it(registered):
    """Tool threads are reused (one per call cost a thread start per step):
    a call past its timeout is unknown and keeps its thread; the next call
    gets another thread and returns; once the stuck tool returns, its thread
    is idle again and serves the following call."""
    from runs.tools.registry import TOOL_THREADS

    release, seen = threading.Event(), []

    @registered("stuck", read_only=False, side_effect="external", parameters={"type": "object"})
    def stuck(arguments, ctx):
        release.wait(30)
        return {"late": True}

    @registered("quick", read_only=True, parameters={"type": "object"})
    def quick(arguments, ctx):
        seen.append(threading.current_thread().ident)
        return {"ok": True}

    with pytest.raises(OutcomeUnknown) as info:
        REGISTRY.execute("stuck", {}, context(timeout=0.2))
    assert info.value.code == "timeout"
    assert REGISTRY.execute("quick", {}, context()) == {"ok": True}
    before = TOOL_THREADS.idle()
    release.set()
    wait_for(lambda: TOOL_THREADS.idle() == before + 1, timeout=10, message="the stuck thread to become idle")
    assert REGISTRY.execute("quick", {}, context()) == {"ok": True}
    assert REGISTRY.execute("quick", {}, context()) == {"ok": True}
    assert len(seen) == 3 and seen[1] == seen[2]  # reused, not one thread per call


def test_a_forked_child_starts_its_own_tool_threads(registered):
    """After a fork the parent's idle threads do not exist in the child: a
    call there must not be handed to one of them (it would wait out its
    timeout and be reported unknown)."""
    from runs.tools.registry import TOOL_THREADS

    @registered("pid", read_only=True, parameters={"type": "object"})
    def pid(arguments, ctx):
        return {"pid": os.getpid()}

    REGISTRY.execute("pid", {}, context())
    assert TOOL_THREADS.idle() >= 1  # the parent has an idle thread to (wrongly) inherit
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through its exit status
        try:
            ok = TOOL_THREADS.idle() == 0 and REGISTRY.execute("pid", {}, context(timeout=5))["pid"] == os.getpid()
        except BaseException:
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_reused_tool_thread_runs_on_the_callers_cpu(registered):
    """An idle tool thread is moved to the CPU its caller is on before it is
    handed a call (the caller blocks meanwhile): the call's two wake-ups do
    not cross CPUs. The tool sees its own thread pinned to one CPU of the
    process's set."""
    if not hasattr(os, "sched_getaffinity"):
        pytest.fail("this suite runs on Linux")
    allowed = os.sched_getaffinity(0)
    placed = []

    @registered("where", read_only=True, parameters={"type": "object"})
    def where(arguments, ctx):
        placed.append((threading.get_native_id(), os.sched_getaffinity(0)))
        return {}

    for _ in range(3):
        REGISTRY.execute("where", {}, context())
    reused = [cpus for tid, cpus in placed[1:] if tid in {t for t, _ in placed[:-1]}]
    assert reused, placed  # the later calls went to a thread that had served before
    assert all(len(cpus) == 1 and cpus <= allowed for cpus in reused), placed
