"""Django conventions an operator expects (issue 38 item 7), in process: a
login without `?next=` lands on the runs list."""

from __future__ import annotations

import pytest
from django.test import Client

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
