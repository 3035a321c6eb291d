"""App errors carry structured fields (issue 12 item 5): every `RunError` of every app exposes code, status,
message and fields, and the API maps each from those alone."""

from __future__ import annotations

import pytest

import approvals.errors
import runs.errors
from runs.api.errors import exception_handler
from runs.errors import InvalidInput, RunError

MODULES = (runs.errors, approvals.errors)  # the error-homes gate keeps every app error in one of these


def app_errors() -> list[type[RunError]]:
    found, todo = [], [RunError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return sorted((c for c in found if c.__module__.split(".")[0] in {"runs", "approvals"}), key=lambda c: c.__name__)


def test_every_app_error_is_found_in_its_module():
    names = {c.__module__ for c in app_errors()}

    assert names == {m.__name__ for m in MODULES}
    assert len(app_errors()) >= 20


@pytest.mark.parametrize("cls", app_errors(), ids=lambda c: c.__name__)
def test_an_app_error_exposes_code_status_message_and_fields(cls):
    exc = cls("something is wrong", fields={"session": ["unknown session"]})

    assert isinstance(cls.code, str) and cls.code and cls.code == cls.code.lower()
    assert isinstance(cls.status, int) and 400 <= cls.status < 600
    assert (exc.message, exc.fields) == ("something is wrong", {"session": ["unknown session"]})
    assert cls("no field").fields == {}


@pytest.mark.parametrize("cls", app_errors(), ids=lambda c: c.__name__)
def test_the_api_maps_every_app_error_from_its_fields_alone(cls):
    response = exception_handler(cls("a message", fields={"a.b": ["bad"]}), {"request": None})

    assert response.status_code == cls.status
    assert {k: v for k, v in response.data.items() if k != "request_id"} == {
        "code": cls.code,
        "message": "a message",
        "fields": {"a.b": ["bad"]},
    }


def test_an_error_takes_no_untyped_extras():
    with pytest.raises(TypeError):
        InvalidInput("x", detail="not a field")  # type: ignore[call-arg]
