"""Django conventions an operator expects (issue 38 item 7), in process: a
login without `?next=` lands on the runs list, `manage.py demo` creates its
runs once and starts on its own without `make run`'s environment."""

from __future__ import annotations

import importlib.util
import io
import os
import stat

import pytest
from django.core.management import call_command
from django.test import Client

from runs.models import Run
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_login_without_next_lands_on_the_runs_list(tenant):
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.get(username="alice")
    user.set_password("correct-Horse-battery-9")
    user.save()
    client = Client()
    answer = client.post("/accounts/login/", {"username": "alice", "password": "correct-Horse-battery-9"})
    assert answer.status_code == 302 and answer["Location"] == "/runs/"
    assert client.get(answer["Location"]).status_code == 200


def test_the_demo_submits_its_runs_once_however_often_it_starts():
    first, second = io.StringIO(), io.StringIO()
    call_command("demo", "--no-serve", "--port", "8123", stdout=first)
    ids = set(Run.objects.values_list("id", flat=True))
    assert len(ids) == 2
    call_command("demo", "--no-serve", "--port", "8123", stdout=second)
    assert set(Run.objects.values_list("id", flat=True)) == ids  # the same two runs, none added
    for out in (first.getvalue(), second.getvalue()):
        assert all(str(run_id) in out for run_id in ids)


def _manage():
    spec = importlib.util.spec_from_file_location("agentrt_manage", ROOT / "manage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_manage_py_demo_on_its_own_takes_the_demos_key_as_make_run_does(monkeypatch, tmp_path):
    manage = _manage()
    monkeypatch.delenv("DJANGO_SECRET_KEY")
    monkeypatch.delenv("AGENTRT_DEMO", raising=False)
    manage.demo_environment(["manage.py", "migrate"], var=tmp_path)  # any other command: nothing
    assert "DJANGO_SECRET_KEY" not in os.environ and not (tmp_path / "secret_key").exists()

    manage.demo_environment(["manage.py", "demo", "--port", "8123"], var=tmp_path)
    key = (tmp_path / "secret_key").read_text().strip()
    assert os.environ["DJANGO_SECRET_KEY"] == key and len(key) >= 50 and os.environ["AGENTRT_DEMO"] == "1"
    assert stat.S_IMODE((tmp_path / "secret_key").stat().st_mode) == 0o600  # owner-only, as the Makefile's
    monkeypatch.delenv("DJANGO_SECRET_KEY")
    manage.demo_environment(["manage.py", "demo"], var=tmp_path)
    assert os.environ["DJANGO_SECRET_KEY"] == key  # kept across starts: sessions survive a restart
