"""Live wake-ups leave the step's path: a commit hands the run's and the
tenant's group to runs.runtime.wake's thread, which sends them over the channel layer
(real Redis here). A stuck layer never holds a step up."""

from __future__ import annotations

import asyncio
import threading

import pytest
from django.test import override_settings

from agentrt_site.settings import redis_channel_layer
from runs.models import Run
from runs.runtime.executor import run_drive
from runs.runtime.wake import run_group, tenant_group, waker
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

REDIS = {"default": redis_channel_layer("redis://127.0.0.1:6379/0")}
GATE = threading.Event()
SENT: list[str] = []


class BlockingLayer:
    """A channel layer whose sends hang until the test opens the gate."""

    def __init__(self, **kwargs):
        pass

    async def group_send(self, group, message):
        await asyncio.get_running_loop().run_in_executor(None, GATE.wait, 30)
        SENT.append(group)


def echo(text):
    return {"tool_calls": [{"name": "echo", "arguments": {"text": text}}]}


def test_a_run_wakes_its_group_and_its_tenants_group_over_redis(load_agent, submit, tenant):
    from channels.layers import get_channel_layer

    load_agent(turns=[echo("a"), echo("b"), {"text": "done"}])
    run = submit()
    with override_settings(CHANNEL_LAYERS=REDIS, AGENTRT_NOTIFY_LIVE=True):
        layer = get_channel_layer()

        async def listen():
            channel = await layer.new_channel()
            await layer.group_add(run_group(run.id), channel)
            await layer.group_add(tenant_group(tenant.id), channel)
            return channel

        loop = asyncio.new_event_loop()
        try:
            channel = loop.run_until_complete(listen())
            sent_before = waker.sent
            assert run_drive(run_id=run.id).kind.value == "completed"
            message = loop.run_until_complete(asyncio.wait_for(layer.receive(channel), 10))
            assert message == {"type": "run.wake"}
            # Both groups were woken (the hints of many commits coalesce into few sends).
            wait_for(lambda: waker.sent - sent_before >= 2, timeout=10, message="the run's and the tenant's wake-ups")
        finally:
            loop.run_until_complete(layer.group_discard(run_group(run.id), channel))
            loop.run_until_complete(layer.group_discard(tenant_group(tenant.id), channel))
            loop.close()


def test_a_stuck_channel_layer_never_holds_up_a_step(load_agent, submit):
    layers = {"default": {"BACKEND": f"{__name__}.BlockingLayer"}}
    load_agent(turns=[echo("a"), echo("b"), echo("c"), {"text": "done"}])
    run = submit()
    GATE.clear()
    SENT.clear()
    with override_settings(CHANNEL_LAYERS=layers, AGENTRT_NOTIFY_LIVE=True):
        try:
            # Every commit of the run happens while the layer's first send hangs.
            assert run_drive(run_id=run.id).kind.value == "completed"
            assert Run.objects.get(id=run.id).status == "COMPLETED"
            assert SENT == []
        finally:
            GATE.set()
        wait_for(lambda: run_group(run.id) in SENT, timeout=10, message="the delayed wake-up")
