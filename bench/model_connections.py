#!/usr/bin/env python
"""What a model attempt pays for its connection (issue 16 item 4), with the
connection kept between attempts and without.

    python bench/model_connections.py [--attempts 60] [--rtt-ms 0,20]

The attempts are the product's own (`OpenAIProvider.complete`, the worker's
code path) against a local chat-completions server that keeps connections
open as HTTP/1.1 servers do, over plain HTTP and over TLS (a self-signed
certificate made for the run, trusted through SSL_CERT_FILE), directly and
through a relay that holds every chunk for half the round-trip time each way
(what a provider some distance away adds to each round trip of the TLS
handshake; the relay accepts the TCP connection locally, so the TCP
handshake's own round trip is not simulated). Each case alternates
AGENTRT_MODEL_KEEPALIVE_SECONDS=0 (a fresh connection per attempt, the old
behaviour) and the default, and reports the median and p90 ms per attempt.

Needs no database. Prints one JSON object on stdout and a table on stderr.
Timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from uuid import uuid4

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
_certs = tempfile.mkdtemp(prefix="agentrt-bench-tls-")
_cert, _key = f"{_certs}/cert.pem", f"{_certs}/key.pem"
subprocess.run(
    [
        "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
        "-keyout", _key, "-out", _cert,
    ],
    check=True,
    capture_output=True,
)  # fmt: skip
os.environ["SSL_CERT_FILE"] = _cert  # read once, when the process's TLS context is built
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrt_site.settings")
os.environ.setdefault("AGENTRT_BENCH_OPENAI_KEY", "sk-bench")
os.environ.setdefault("AGENTRT_LOG_LEVEL", "WARNING")
os.environ.setdefault("DJANGO_SECRET_KEY", "bench-" + secrets.token_urlsafe(50))  # no database, no sessions

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402

from runs.domain.cancellation import Token  # noqa: E402
from runs.domain.values import ModelRequest  # noqa: E402
from runs.providers.endpoints import Endpoint  # noqa: E402
from runs.providers.openai import OpenAIProvider  # noqa: E402
from runs.providers.wire import pool  # noqa: E402
from tests.providers.fake_openai import FakeOpenAI, text_stream  # noqa: E402


class Relay:
    """A TCP relay that holds each chunk `one_way` seconds in each direction."""

    def __init__(self, target: tuple[str, int], one_way: float):
        self.target, self.one_way = target, one_way
        self.loop = asyncio.new_event_loop()
        self.port: int | None = None
        ready = threading.Event()
        threading.Thread(target=self._serve, args=(ready,), daemon=True).start()
        ready.wait(10)

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)

        async def pipe(reader, writer):
            # A delay line: each chunk leaves `one_way` after it arrived,
            # whatever else is in flight (latency, not a queue of sleeps).
            line: asyncio.Queue = asyncio.Queue()

            async def deliver():
                while (item := await line.get()) is not None:
                    due, data = item
                    await asyncio.sleep(max(0.0, due - self.loop.time()))
                    writer.write(data)
                    await writer.drain()

            sender = asyncio.ensure_future(deliver())
            try:
                while data := await reader.read(65536):
                    line.put_nowait((self.loop.time() + self.one_way, data))
            except (ConnectionError, OSError):
                pass
            finally:
                line.put_nowait(None)
                try:
                    await sender
                except (ConnectionError, OSError):
                    pass
                writer.close()

        async def handle(client_reader, client_writer):
            server_reader, server_writer = await asyncio.open_connection(*self.target)
            await asyncio.gather(pipe(client_reader, server_writer), pipe(server_reader, client_writer))

        async def start():
            server = await asyncio.start_server(handle, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            ready.set()
            await server.serve_forever()

        self.loop.run_until_complete(start())


def _server(tls: bool) -> FakeOpenAI:
    fake = FakeOpenAI(keep_alive=True)
    fake.push(text_stream("ok"))  # the last scripted answer repeats
    if tls:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(_cert, _key)
        fake.server.socket = context.wrap_socket(fake.server.socket, server_side=True)
    return fake.start()


def _attempts(base_url: str, n: int, keepalive: float) -> list[float]:
    settings.AGENTRT_MODEL_KEEPALIVE_SECONDS = keepalive
    pool._forget()
    provider = OpenAIProvider(
        Endpoint(name="bench", provider="openai", base_url=base_url, api_key_env="AGENTRT_BENCH_OPENAI_KEY"),
        "bench-model",
    )
    request = ModelRequest(
        run_id=uuid4(),
        step_number=1,
        attempt_number=1,
        instructions="",
        messages=[{"role": "user", "content": "hi"}],
        tools=[],
        tool_choice="auto",
    )
    provider.complete(request, Token())  # the first call of the process builds the TLS context; not timed
    out = []
    for _ in range(n):
        started = time.perf_counter()
        turn = provider.complete(request, Token())
        out.append((time.perf_counter() - started) * 1000)
        assert turn.text == "ok", turn
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attempts", type=int, default=60, help="timed attempts per slot")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the two settings per case")
    parser.add_argument("--rtt-ms", default="0,20", help="simulated round-trip times, comma-separated")
    args = parser.parse_args()
    settings.AGENTRT_MODEL_PRICES = {"bench-model": {"input_per_mtok": 1.0, "output_per_mtok": 1.0}}
    random.seed(1)
    results = []
    for tls in (False, True):
        fake = _server(tls)
        port = fake.server.server_address[1]
        for rtt in [float(x) for x in args.rtt_ms.split(",")]:
            target_port = port if rtt == 0 else Relay(("127.0.0.1", port), rtt / 2000).port
            base_url = f"{'https' if tls else 'http'}://127.0.0.1:{target_port}/v1"
            slots: dict[str, list[float]] = {"fresh": [], "kept": []}
            for _ in range(args.rounds):
                before = fake.connections
                slots["fresh"] += _attempts(base_url, args.attempts, 0)
                fresh_conns = fake.connections - before
                before = fake.connections
                slots["kept"] += _attempts(base_url, args.attempts, 15)
                kept_conns = fake.connections - before
            row = {
                "tls": tls,
                "rtt_ms": rtt,
                "connections_per_slot": {"fresh": fresh_conns, "kept": kept_conns},
                **{
                    k: {
                        "median_ms": round(statistics.median(v), 3),
                        "p90_ms": round(statistics.quantiles(v, n=10)[-1], 3),
                        "n": len(v),
                    }
                    for k, v in slots.items()
                },
            }
            row["saved_ms"] = round(row["fresh"]["median_ms"] - row["kept"]["median_ms"], 3)
            results.append(row)
            print(
                f"{'TLS ' if tls else 'HTTP'} rtt {rtt:>4.0f} ms: fresh {row['fresh']['median_ms']:.2f} ms "
                f"(p90 {row['fresh']['p90_ms']:.2f}), kept {row['kept']['median_ms']:.2f} ms "
                f"(p90 {row['kept']['p90_ms']:.2f}); connections per {args.attempts + 1} attempts: "
                f"{fresh_conns} / {kept_conns}",
                file=sys.stderr,
            )
        fake.close()
    print(
        json.dumps({"bench": "model_connections", "attempts": args.attempts, "rounds": args.rounds, "results": results})
    )


if __name__ == "__main__":
    main()
