"""Tools are registered in code: name, JSON Schema for arguments, schema
version, read_only, side-effect class, timeout."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connections
from jsonschema import Draft202012Validator

from runs.domain.errors import OutcomeUnknown
from runs.domain.values import ToolSpec


class ToolRegistry:
    def __init__(self):
        self._tools: dict[str, tuple[ToolSpec, Callable, Draft202012Validator]] = {}

    def register(self, spec: ToolSpec, fn: Callable[[dict[str, Any], Any], Any]) -> None:
        Draft202012Validator.check_schema(spec.parameters)
        self._tools[spec.name] = (spec, fn, Draft202012Validator(spec.parameters))

    def unregister(self, name: str) -> None:
        self._tools.pop(name, None)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def spec(self, name: str) -> ToolSpec | None:
        entry = self._tools.get(name)
        return entry[0] if entry else None

    def validate(self, name: str, arguments: Any) -> list[str]:
        entry = self._tools.get(name)
        if entry is None:
            return [f"unknown tool {name!r}"]
        errors = []
        for err in sorted(entry[2].iter_errors(arguments), key=lambda e: list(e.absolute_path)):
            where = ".".join(str(p) for p in err.absolute_path) or "(arguments)"
            errors.append(f"{where}: {err.message[:200]}")
        return errors[:10]

    def execute(self, name: str, arguments: Any, context: Any) -> Any:
        """Run the tool, enforcing its `timeout_seconds`: the tool runs in its
        own thread and the runtime stops waiting when the timeout elapses.
        The call is then `uncertain` (`OutcomeUnknown("timeout")`): it may
        still take effect, and Python cannot stop the thread, which finishes
        (or not) on its own with nobody reading its result."""
        fn = self._tools[name][1]
        timeout = getattr(context, "timeout_seconds", None)
        if not timeout or timeout <= 0:
            return fn(arguments, context)
        box: dict[str, Any] = {}
        done = threading.Event()

        def target():
            try:
                box["value"] = fn(arguments, context)
            except BaseException as exc:  # handed to the caller below
                box["error"] = exc
            finally:
                connections.close_all()  # this thread's own connections, if the tool used the ORM
                done.set()

        threading.Thread(target=target, name=f"tool:{name}", daemon=True).start()
        if not done.wait(float(timeout)):
            raise OutcomeUnknown(
                "timeout",
                f"the tool did not finish within its timeout ({float(timeout):g} s); whether it took effect is unknown",
            )
        if "error" in box:
            raise box["error"]
        return box.get("value")


REGISTRY = ToolRegistry()


def register(
    *,
    name: str,
    parameters: dict[str, Any],
    read_only: bool,
    side_effect: str = "none",
    description: str = "",
    timeout_seconds: float = 30.0,
    schema_version: str = "1",
    control: bool = False,
):
    """Decorator: register a function `fn(arguments, context)` as a tool."""

    def wrap(fn):
        REGISTRY.register(
            ToolSpec(
                name=name,
                description=description or ((fn.__doc__ or "").strip().splitlines() or [""])[0],
                parameters=parameters,
                schema_version=schema_version,
                read_only=read_only,
                side_effect=side_effect,
                timeout_seconds=timeout_seconds,
                control=control,
            ),
            fn,
        )
        return fn

    return wrap
