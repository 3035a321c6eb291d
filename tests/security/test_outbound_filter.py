"""Issue 34 item 7a: the outbound filter (runs/net.py) behind the HTTP tools
and the webhook sender.

The review (N6) found a name on an allow-list could still send a request to
AWS's IPv6 metadata service (`fd00:ec2::254`), Alibaba's (`100.100.100.200`),
the 6to4 form of 169.254.169.254, loopback and RFC 1918 addresses, and that a
bare `host` entry admitted every port of that host (`localhost` let
`http_post` reach `localhost:18084`, a webhook `localhost:6379`).

Now: link-local and metadata addresses are refused in every form, even as an
IP literal the operator listed; loopback and private addresses only when the
allow-list names them explicitly (an IP literal entry, or a name also listed
in AGENTRT_OUTBOUND_INTERNAL_NAMES); a bare `host` entry admits ports 80 and
443 only. The name's owner is played by the system's resolver (the one thing
replaced); real listeners on 127.0.0.1 stand in for the places a request must
or must not reach."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from runs import net
from runs.domain.errors import ToolFailure
from runs.errors import AddressRefused
from runs.runtime.queue import db_now
from runs.services import tenant_create
from runs.tools import builtin
from tests.conftest import ROOT
from tests.integration.test_uncertain import context
from tests.security.test_settings import SETUP, base_env
from tests.webhooks.conftest import completed_delivery, subscribe
from tests.webhooks.receiver import Receiver
from webhooks.delivery import deliver
from webhooks.models import Delivery
from webhooks.outbound import UrlRefused, check_url

# Each form of the link-local and metadata addresses the review planted, and the other ways to write them.
NEVER = [
    "169.254.169.254",  # the metadata service (AWS, GCP, Azure, OpenStack)
    "169.254.170.2",  # ECS task credentials: link-local
    "fe80::1",
    "::ffff:169.254.169.254",  # IPv4-mapped
    "2002:a9fe:a9fe::",  # 6to4 of 169.254.169.254
    "2002:a9fe:a9fe::1",
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    "64:ff9b:1::a9fe:a9fe",  # local-use NAT64
    "100.100.100.200",  # Alibaba's metadata service
    "fd00:ec2::254",  # AWS's over IPv6
    "0.0.0.0",
    "::",
    "224.0.0.1",
    "255.255.255.255",
    "240.0.0.1",
]
INTERNAL = [
    "127.0.0.1",
    "127.1.2.3",
    "::1",
    "::ffff:127.0.0.1",
    "10.0.0.5",
    "172.17.0.1",
    "192.168.1.1",
    "100.64.0.1",  # shared address space (CGNAT)
    "fd12:3456::1",  # unique local
    "2002:7f00:1::",  # 6to4 of 127.0.0.1
    "2002:a00:5::",  # 6to4 of 10.0.0.5
    "64:ff9b::a00:5",  # NAT64 of 10.0.0.5
]
PUBLIC = ["93.184.216.34", "2606:2800:220:1::1", "::ffff:93.184.216.34", "64:ff9b::5db8:d822", "2002:5db8:d822::"]


def addrinfo(address: str, port: int = 443) -> tuple:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sockaddr = (address, port, 0, 0) if family == socket.AF_INET6 else (address, port)
    return (family, socket.SOCK_STREAM, 6, "", sockaddr)


@pytest.mark.parametrize("address", NEVER)
def test_link_local_and_metadata_addresses_are_refused_in_every_form(address):
    assert net.address_class(address) == net.NEVER
    with pytest.raises(AddressRefused, match="never sent to"):
        net.routable("hooks.tenant.example", [addrinfo(address)])
    # ... even named in AGENTRT_OUTBOUND_INTERNAL_NAMES, and even as an IP literal the operator listed
    with pytest.raises(AddressRefused):
        net.routable("hooks.tenant.example", [addrinfo(address)], internal_names=["hooks.tenant.example"])
    with pytest.raises(AddressRefused):
        net.refuse_literal(address)


@pytest.mark.parametrize("address", INTERNAL)
def test_loopback_and_private_addresses_of_a_name_need_the_operators_word(address):
    assert net.address_class(address) == net.INTERNAL
    with pytest.raises(AddressRefused, match="AGENTRT_OUTBOUND_INTERNAL_NAMES"):
        net.routable("hooks.tenant.example", [addrinfo(address)])
    kept = net.routable("hooks.tenant.example", [addrinfo(address)], internal_names=["Hooks.Tenant.Example"])
    assert kept == [addrinfo(address)]
    assert net.routable(address, [addrinfo(address)]) == [addrinfo(address)]  # a literal matched a literal entry
    net.refuse_literal(address)


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_pass(address):
    assert net.address_class(address) == net.PUBLIC
    assert net.routable("hooks.tenant.example", [addrinfo(address)]) == [addrinfo(address)]


def test_only_the_addresses_a_request_may_go_to_are_kept():
    answers = [addrinfo(a) for a in ("fd00:ec2::254", "10.0.0.5", "93.184.216.34", "100.100.100.200")]
    assert net.routable("hooks.tenant.example", answers) == [addrinfo("93.184.216.34")]


@pytest.mark.parametrize(
    "entries, host, port, admitted",
    [
        (["hooks.example.com"], "hooks.example.com", 443, True),
        (["hooks.example.com"], "hooks.example.com", 80, True),
        (["hooks.example.com"], "hooks.example.com", 6379, False),  # a bare host: 80 and 443 only
        (["hooks.example.com:8443"], "hooks.example.com", 8443, True),
        (["hooks.example.com:8443"], "hooks.example.com", 443, False),
        (["HOOKS.example.com:8443"], "hooks.example.com", 8443, True),
        (["[::1]:9000"], "::1", 9000, True),
        (["[0:0::1]:9000"], "::1", 9000, True),
        (["[::1]:9000"], "::1", 9001, False),
        (["::1"], "::1", 443, True),
        (["127.0.0.1"], "127.0.0.1", 18084, False),
        (["hooks.example.com"], "hooks.example.com.evil.net", 443, False),
    ],
)
def test_allow_list_entries_carry_a_port_and_a_bare_host_means_80_and_443(entries, host, port, admitted):
    assert net.listed(host, port, entries) is admitted


@pytest.mark.parametrize("entry", ["hooks.example.com:x", "hooks.example.com:0", "host:99999", "[::1", "[::1]x", "a/b"])
def test_an_entry_that_does_not_parse_stops_the_process_naming_it(entry):
    env = base_env(DJANGO_DEBUG="1", AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=f"ok.example.com,{entry}")
    out = subprocess.run([sys.executable, "-c", SETUP], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "ImproperlyConfigured: AGENTRT_HTTP_TOOL_ALLOWED_HOSTS: allow-list entry" in out.stderr, out.stderr
    assert repr(entry) in out.stderr


# --- through the HTTP tool and the webhook sender ------------------------------------------------------------------

DB = pytest.mark.django_db(transaction=True)


@pytest.fixture
def owned_name(monkeypatch):
    """`rebound.example` resolves to what the test puts in `answers` (IPv4 or IPv6)."""
    answers: list[str] = []
    asked: list[str] = []
    system_resolver = socket.getaddrinfo

    def resolver(host, port, *args, **kwargs):
        if host != "rebound.example":
            return system_resolver(host, port, *args, **kwargs)
        asked.append(host)
        return [addrinfo(address, port) for address in answers]

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    return answers, asked


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.mark.parametrize("address", ["fd00:ec2::254", "100.100.100.200", "2002:a9fe:a9fe::", "64:ff9b::a9fe:a9fe"])
def test_an_http_tool_call_to_a_name_pointed_at_a_metadata_form_is_refused_unsent(settings, sink, owned_name, address):
    answers, asked = owned_name
    answers[:] = [address]
    settings.AGENTRT_HTTP_TOOL_ALLOWED_HOSTS = [f"rebound.example:{sink.port}"]
    settings.AGENTRT_OUTBOUND_INTERNAL_NAMES = ["rebound.example"]  # not even the operator's word opens these
    with pytest.raises(ToolFailure) as err:
        builtin.http_post({"url": f"http://rebound.example:{sink.port}/effect", "json": {}}, context())
    assert err.value.code == "address_not_allowed" and err.value.uncertain is False, err.value
    assert address in str(err.value) and "not sent" in str(err.value)
    assert asked == ["rebound.example"] and sink.count() == 0


def test_an_http_tool_call_to_a_name_pointed_at_loopback_is_refused_unless_the_operator_listed_it(
    settings, sink, owned_name
):
    answers, _ = owned_name
    answers[:] = ["127.0.0.1"]  # where the sink listens: the internal service the tenant's name points at
    settings.AGENTRT_HTTP_TOOL_ALLOWED_HOSTS = [f"rebound.example:{sink.port}"]
    url = f"http://rebound.example:{sink.port}/effect"
    with pytest.raises(ToolFailure) as err:
        builtin.http_post({"url": url, "json": {}}, context())
    assert err.value.code == "address_not_allowed" and "AGENTRT_OUTBOUND_INTERNAL_NAMES" in str(err.value)
    assert sink.count() == 0
    settings.AGENTRT_OUTBOUND_INTERNAL_NAMES = ["rebound.example"]
    assert builtin.http_post({"url": url, "json": {}}, context())["status"] == 200
    assert sink.count() == 1


def test_a_private_address_of_a_name_is_refused_before_connecting(settings, owned_name):
    answers, _ = owned_name
    answers[:] = ["10.0.0.5", "192.168.1.1"]
    settings.AGENTRT_HTTP_TOOL_ALLOWED_HOSTS = ["rebound.example"]
    with pytest.raises(ToolFailure) as err:
        builtin.http_get({"url": "http://rebound.example/"}, context())
    assert err.value.code == "address_not_allowed", err.value


def test_a_listed_ip_literal_of_loopback_is_the_operators_choice(sink):
    # The suite's own sink: `127.0.0.1:<port>` on the list, exactly as written.
    assert builtin.http_post({"url": sink.url, "json": {}}, context())["status"] == 200


def test_a_listed_metadata_literal_is_refused_anyway(settings):
    settings.AGENTRT_HTTP_TOOL_ALLOWED_HOSTS = ["169.254.169.254", "[fd00:ec2::254]"]
    for url in ("http://169.254.169.254/latest/meta-data/", "http://[fd00:ec2::254]/latest/meta-data/"):
        with pytest.raises(ToolFailure) as err:
            builtin.http_get({"url": url}, context())
        assert err.value.code == "address_not_allowed", err.value
    settings.AGENTRT_WEBHOOK_ALLOWED_HOSTS = ["169.254.169.254"]
    with pytest.raises(UrlRefused, match="never sent to"):
        check_url("http://169.254.169.254/hook")


def test_a_bare_host_entry_does_not_open_every_port(settings, sink):
    # The review's `localhost` entry reached localhost:18084; `127.0.0.1` alone now admits 80 and 443 only.
    settings.AGENTRT_HTTP_TOOL_ALLOWED_HOSTS = ["127.0.0.1"]
    with pytest.raises(ToolFailure) as err:
        builtin.http_post({"url": sink.url, "json": {}}, context())
    assert err.value.code == "host_not_allowed" and "80 and 443" in str(err.value)
    assert sink.count() == 0
    settings.AGENTRT_HTTP_TOOL_ALLOWED_HOSTS = [f"127.0.0.1:{sink.port + 1}"]  # another port named: not this one
    with pytest.raises(ToolFailure) as err:
        builtin.http_post({"url": sink.url, "json": {}}, context())
    assert err.value.code == "host_not_allowed"
    assert sink.count() == 0


@DB
def test_a_webhook_on_a_port_a_bare_host_entry_does_not_name_is_refused_when_saved(settings, tenant):
    settings.AGENTRT_WEBHOOK_ALLOWED_HOSTS = ["localhost"]
    from django.test import Client

    _, manager = tenant_create(name=tenant.name, username="hookop", password="pw", operator=True)
    client = Client()
    client.force_login(manager)
    response = client.post(
        "/api/webhooks/", {"url": "http://localhost:6379/", "event_types": ["run.completed"]}, "application/json"
    )
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "invalid"
    assert "80 and 443" in response.json()["fields"]["url"][0]
    ok = client.post(
        "/api/webhooks/", {"url": "https://localhost/hook", "event_types": ["run.completed"]}, "application/json"
    )
    assert ok.status_code == 201, ok.content


@DB
def test_a_webhook_to_a_name_pointed_at_loopback_is_not_sent_unless_the_operator_listed_it(
    tenant, load_agent, submit, settings, owned_name, receiver
):
    answers, asked = owned_name
    answers[:] = ["127.0.0.1"]  # where the receiver listens
    settings.AGENTRT_WEBHOOK_ALLOWED_HOSTS = [f"rebound.example:{receiver.port}"]
    settings.AGENTRT_DELIVERY_BACKOFF_SECONDS = 60
    _, manager = tenant_create(name=tenant.name, username="hookop", password="pw", operator=True)
    subscribe(manager, f"http://rebound.example:{receiver.port}/hook", ["run.completed"])
    _, d = completed_delivery(load_agent, submit)
    assert deliver(d.id) == "retry"
    row = Delivery.objects.get(id=d.id)
    assert (row.status, row.attempts, row.last_status_code) == ("pending", 1, None)
    assert "127.0.0.1" in row.last_error and "AGENTRT_OUTBOUND_INTERNAL_NAMES" in row.last_error, row.last_error
    assert receiver.requests == [] and asked == ["rebound.example"]
    settings.AGENTRT_OUTBOUND_INTERNAL_NAMES = ["rebound.example"]
    Delivery.objects.filter(id=d.id).update(due_at=db_now())
    assert deliver(d.id) == "succeeded"
    assert len(receiver.requests) == 1


@DB
@pytest.mark.parametrize("address", ["fd00:ec2::254", "100.100.100.200", "2002:a9fe:a9fe::1"])
def test_a_webhook_to_a_name_pointed_at_a_metadata_form_is_not_sent(
    tenant, load_agent, submit, settings, owned_name, address
):
    answers, _ = owned_name
    answers[:] = [address]
    settings.AGENTRT_WEBHOOK_ALLOWED_HOSTS = ["rebound.example:8080"]
    settings.AGENTRT_OUTBOUND_INTERNAL_NAMES = ["rebound.example"]
    settings.AGENTRT_DELIVERY_BACKOFF_SECONDS = 60
    _, manager = tenant_create(name=tenant.name, username="hookop", password="pw", operator=True)
    subscribe(manager, "http://rebound.example:8080/hook", ["run.completed"])
    _, d = completed_delivery(load_agent, submit)
    assert deliver(d.id) == "retry"
    row = Delivery.objects.get(id=d.id)
    assert address in row.last_error and "never sent to" in row.last_error, row.last_error
