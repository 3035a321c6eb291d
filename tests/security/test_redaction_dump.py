"""Issue 10, item 6: no secret reaches the database, whatever source it comes from.

Canaries of every secret shape `runs/domain/scrub.py` knows are planted in
each source of persisted text — the run input, the answer to `ask_user`, the
model's streamed text (split across deltas), the model's tool-call arguments
(and the `ask_user` question), a tool's result — and a run is driven through
a real qcluster against a local OpenAI-protocol server. Then the whole test
database is dumped with `pg_dump` and searched: no canary may be there. A
plain marker beside each source's canaries must be there, which proves each
source was persisted (and searched) at all.
"""

from __future__ import annotations

import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import connection

from runs.domain.scrub import SECRETS
from runs.models import Run
from tests.conftest import wait_for
from tests.providers.conftest import PRICES
from tests.providers.fake_openai import chunk, stream, text_stream, tool_delta, usage_chunk
from tests.security.conftest import token_client

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

MARK = "CANARY"  # every canary carries it; nothing else in the test does


def canaries(tag: str) -> dict[str, str]:
    """Canaries of every secret shape (runs/domain/scrub.py SECRETS), tagged
    with their source: keyed `<shape>` or `<shape>:<variant>`, at least one
    per shape. Only the secret part of each carries MARK (a bearer token's
    scheme and a URL's user stay, and must)."""
    word = f"{MARK}{tag}"
    return {
        "openai": f"sk-{word}{'0' * 12}",
        "aws": "AKIA" + (word + "0" * 16)[:16],
        "github": f"ghp_{word}{'0' * 30}",
        "github:oauth": f"gho_{word}{'0' * 30}",
        "github_pat": f"github_pat_11{word}{'0' * 12}_{'0' * 40}",
        "stripe:sk_live": f"sk_live_{word}{'0' * 16}",
        "stripe:sk_test": f"sk_test_{word}{'0' * 16}",
        "stripe:rk_live": f"rk_live_{word}{'0' * 16}",
        "gitlab": f"glpat-{word}{'0' * 14}",
        "google": "AIza" + (word + "0" * 35)[:35],
        "slack": f"xoxb-{word}-0000",
        "slack:xoxe": f"xoxe-{word}-0000",
        "slack:xoxp": f"xoxp-{word}-0000",
        "bearer": f"Authorization: Bearer {word}{'0' * 16}",
        "bearer:lower": f"authorization: bearer {word}0000+/0000000000==",
        "url_password": f"https://deploy:{word}p%40ss!@hooks.example.com/x",  # a password's `%` and `!` too
        "webhook_secret": f"whsec_{word}{'0' * 30}",
        "private_key": f"-----BEGIN RSA PRIVATE KEY-----\n{word}KEYBODY\n-----END RSA PRIVATE KEY-----",
        "jwt": f"eyJ{word}HDR.{word}PAYLOAD.{word}SIG",
    }


def shape_of(key: str) -> str:
    return key.split(":", 1)[0]


def planted(tag: str) -> str:
    """The source's text: a plain marker, then every canary."""
    return f"plain-marker-{tag.lower()} " + " ".join(canaries(tag).values())


def test_every_shape_matches_a_scrub_pattern():
    # The canaries are real instances of the shapes (else the dump test proves nothing), one shape at least each.
    patterns = {secret.name: secret.pattern for secret in SECRETS}
    for key, value in canaries("X").items():
        assert patterns[shape_of(key)].search(value), key
    assert {shape_of(key) for key in canaries("X")} == set(patterns)


class SecretServer:
    """An allowed host whose answer is full of secrets (the tool-result source)."""

    def __init__(self, body: str):
        data = body.encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def secret_server():
    server = SecretServer(planted("RES"))
    yield server
    server.close()


def dump_database() -> str:
    s = connection.settings_dict
    done = subprocess.run(
        [
            "pg_dump",
            "-h",
            s["HOST"] or "127.0.0.1",
            "-p",
            str(s["PORT"] or 5432),
            "-U",
            s["USER"] or "postgres",
            "--no-owner",
            s["NAME"],
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout


def status(run_id) -> str:
    return Run.objects.filter(id=run_id).values_list("status", flat=True).get()


def test_no_canary_of_any_source_survives_in_a_pg_dump(member, fake, secret_server, settings, cluster):
    endpoints = {"local": {"provider": "openai", "base_url": fake.base_url, "api_key_env": "AGENTRT_DUMP_KEY"}}
    settings.AGENTRT_MODEL_ENDPOINTS = endpoints
    settings.AGENTRT_MODEL_PRICES = PRICES
    settings.AGENTRT_HTTP_TOOL_ALLOWED_HOSTS = [secret_server.host]
    client = token_client(member)
    created = client.post(
        "/api/agents/",
        {
            "name": "leaky",
            "instructions": "test",
            "model": {"provider": "openai", "endpoint": "local", "model": "test-model"},
            "tools": ["echo", "http_get", "ask_user"],
            "policy": {"default": "allow"},
        },
        format="json",
    )
    assert created.status_code == 201, created.content

    text = planted("TXT")
    split = text.index("sk-") + len(
        "sk-CANARYTX"
    )  # one canary arrives in two deltas (the first part too short to match)
    fake.push(
        # Step 1: streamed text (one secret split across two deltas, a pause
        # between so each is its own flush) and two tool calls.
        stream(
            [
                chunk("", role="assistant"),
                chunk(text[:split]),
                chunk(text[split:] + " "),
                chunk(
                    tool_calls=[
                        tool_delta(0, id="c1", name="echo", arguments=json.dumps({"text": planted("ARG")})),
                        tool_delta(
                            1,
                            id="c2",
                            name="http_get",
                            arguments=json.dumps({"url": f"http://{secret_server.host}/secrets"}),
                        ),
                    ]
                ),
                chunk(finish="tool_calls"),
                usage_chunk(40, 8),
            ],
            delay=0.4,
        ),
        # Step 2: a question that itself carries secrets.
        stream(
            [
                chunk("", role="assistant"),
                chunk(
                    tool_calls=[
                        tool_delta(0, id="c3", name="ask_user", arguments=json.dumps({"question": planted("QST")}))
                    ]
                ),
                chunk(finish="tool_calls"),
                usage_chunk(50, 8),
            ]
        ),
        # Step 3, after the answer: the final message.
        text_stream(planted("FIN"), usage=(60, 8)),
    )
    cluster(
        AGENTRT_MODEL_ENDPOINTS=json.dumps(endpoints),
        AGENTRT_MODEL_PRICES=json.dumps(PRICES),
        AGENTRT_HTTP_TOOL_ALLOWED_HOSTS=secret_server.host,
        AGENTRT_DUMP_KEY="local-key",
        AGENTRT_LEASE_SECONDS=5,
    )

    run = client.post("/api/runs/", {"agent": "leaky", "input": planted("IN")}, format="json")
    assert run.status_code == 201, run.content
    run_id = run.json()["id"]
    wait_for(lambda: status(run_id) in ("WAITING_FOR_USER", "FAILED", "COMPLETED"), timeout=60, message="the question")
    assert status(run_id) == "WAITING_FOR_USER", Run.objects.get(id=run_id).failure
    answered = client.post(f"/api/runs/{run_id}/input/", {"text": planted("ANS")}, format="json")
    assert answered.status_code == 202, answered.content
    wait_for(lambda: status(run_id) in ("COMPLETED", "FAILED"), timeout=60, message="the run to end")
    row = Run.objects.get(id=run_id)
    assert row.status == "COMPLETED", row.failure
    assert len(fake.requests) == 3

    dump = dump_database()
    sources = ("IN", "TXT", "ARG", "RES", "QST", "ANS", "FIN")
    # Each source was persisted (so it was searched) ...
    missing = [tag for tag in sources if f"plain-marker-{tag.lower()}" not in dump]
    assert missing == [], f"sources never persisted: {missing}"
    # ... and none of its secrets was.
    leaks = [
        (tag, shape)
        for tag in sources
        for shape, value in canaries(tag).items()
        if value in dump or value.replace("\n", "\\n") in dump
    ]
    assert leaks == [], f"secrets in the database dump: {leaks}"
    lines = [line[:200] for line in dump.splitlines() if MARK in line]
    assert lines == [], "a fragment of a secret is in the database dump:\n" + "\n".join(lines)
    assert "[REDACTED]" in dump


# -- the pieces, without a database ---------------------------------------------------------------------


def test_streamed_text_holds_back_a_secret_until_it_is_whole():
    from runs.domain.scrub import scrub_stream

    secret = canaries("U")["openai"]
    assert scrub_stream("hello " + secret[:9]) == "hello "  # could still become a secret: held back
    assert scrub_stream("hello " + secret + " and") == "hello [REDACTED] "
    assert scrub_stream("key: -----BEGIN RSA PRIV") == "key: "
    assert MARK not in scrub_stream("key: " + canaries("U")["private_key"][:45])
    # A bearer token and a URL's password arrive in pieces too: whatever is shown of a prefix is a prefix of
    # the whole text's redaction (nothing of the secret is ever shown, nothing shown is taken back).
    for text, whole in (
        (canaries("U")["bearer:lower"] + " ok", "authorization: bearer [REDACTED] "),
        ("see " + canaries("U")["url_password"] + " ok", "see https://deploy:[REDACTED]@hooks.example.com/x "),
    ):
        assert scrub_stream(text) == whole
        for end in range(len(text)):
            assert whole.startswith(scrub_stream(text[:end])), text[:end]


def test_a_model_turn_is_scrubbed_before_anything_of_it_is_kept():
    from runs.domain.scrub import scrub_turn
    from runs.domain.values import ModelTurn, ToolCallRequest

    turn = ModelTurn(
        text=planted("T"),
        tool_calls=[ToolCallRequest(call_id="c", name="echo", raw_arguments=json.dumps({"text": planted("A")}))],
    )
    clean = scrub_turn(turn)
    assert MARK not in clean.model_dump_json()
    assert json.loads(clean.tool_calls[0].raw_arguments)["text"].startswith("plain-marker-a [REDACTED]")
