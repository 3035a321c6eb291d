"""A local server that speaks OpenAI chat completions, scripted per request.

Each POST to `/v1/chat/completions` takes the next scripted answer (the last
one repeats) and is recorded (`method`, `path`, lower-cased `headers`, parsed
`body`). Answers:

* `stream(events, ...)`: HTTP/1.1 chunked `text/event-stream`; a dict event
  is sent as `data: <json>`, a str event verbatim; `delay` between events;
  `cut_after=n` drops the connection after n events (no final chunk);
  `stall_after=n` goes silent after n events for `stall_for` seconds (60) or until the server stops;
  `stall_at_end` goes silent likewise after the last event, before the closing chunk;
  `done` appends `data: [DONE]`.
* `answer(status, body, headers)`: a plain response (JSON or text body).
* `hang(seconds)`: reads the request and sends nothing for `seconds`.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def stream(
    events: list[Any],
    *,
    delay: float = 0.0,
    cut_after: int | None = None,
    stall_after: int | None = None,
    stall_for: float = 60.0,
    stall_at_end: bool = False,
    done: bool = True,
    content_type: str = "text/event-stream",
) -> dict:
    return {
        "kind": "stream",
        "events": list(events),
        "delay": delay,
        "cut_after": cut_after,
        "stall_after": stall_after,
        "stall_for": stall_for,
        "stall_at_end": stall_at_end,
        "done": done,
        "content_type": content_type,
    }


def answer(status: int = 200, body: Any = None, headers: dict | None = None) -> dict:
    return {"kind": "answer", "status": status, "body": body, "headers": headers or {}}


def hang(seconds: float) -> dict:
    return {"kind": "hang", "seconds": seconds}


def chunk(
    content: str | None = None, *, tool_calls: list | None = None, finish: str | None = None, role: str | None = None
) -> dict:
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def tool_delta(
    index: int | None, *, id: str | None = None, name: str | None = None, arguments: str | None = None
) -> dict:
    call: dict[str, Any] = {}
    if index is not None:
        call["index"] = index
    if id is not None:
        call["id"] = id
        call["type"] = "function"
    function: dict[str, Any] = {}
    if name is not None:
        function["name"] = name
    if arguments is not None:
        function["arguments"] = arguments
    if function:
        call["function"] = function
    return call


def usage_chunk(prompt: int, completion: int, *, cached: int = 0, reasoning: int = 0, **extra: Any) -> dict:
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }
    usage.update(extra)
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m", "choices": [], "usage": usage}


def text_stream(*pieces: str, finish: str = "stop", usage: tuple[int, int] | None = (10, 5), **kwargs: Any) -> dict:
    events: list[Any] = [chunk("", role="assistant")]
    events += [chunk(p) for p in pieces]
    events.append(chunk(finish=finish))
    if usage is not None:
        events.append(usage_chunk(*usage))
    return stream(events, **kwargs)


class FakeOpenAI:
    def __init__(self, *, keep_alive: bool = False, drop_after: bool = False, port: int = 0):
        self.keep_alive = keep_alive  # answer as HTTP/1.1 servers do: the connection stays open for the next request
        self.drop_after = drop_after  # ... but close it once the answer is sent, as an idle timeout would
        self.connections = 0  # TCP connections accepted
        self.closed = 0  # ... and closed by the server
        self.requests: list[dict] = []
        self.script: list[dict] = []
        self.aborted: list[int] = []  # request numbers whose client went away mid-answer
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # as production servers do: no write waits for the client's delayed ACK

            def log_message(self, *args):  # quiet
                pass

            def setup(self):
                with fake._lock:
                    fake.connections += 1
                super().setup()

            def do_POST(self):
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                with fake._lock:
                    number = len(fake.requests)
                    fake.requests.append(
                        {
                            "method": "POST",
                            "path": self.path,
                            "headers": {k.lower(): v for k, v in self.headers.items()},
                            "body": body,
                        }
                    )
                    if not fake.script:
                        plan = answer(500, {"error": {"message": "nothing scripted"}})
                    else:
                        plan = fake.script[min(number, len(fake.script) - 1)]
                self.close_connection = not fake.keep_alive or fake.drop_after
                try:
                    getattr(self, "_" + plan["kind"])(plan)
                except (BrokenPipeError, ConnectionResetError, OSError):
                    fake.aborted.append(number)

            def _answer(self, plan):
                body = plan["body"]
                if isinstance(body, (dict, list)):
                    data, ctype = json.dumps(body).encode(), "application/json"
                else:
                    data, ctype = str(body or "").encode(), "text/plain"
                self.send_response(plan["status"])
                headers = {"Content-Type": ctype, **plan["headers"]}
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                if not fake.keep_alive:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)

            def _hang(self, plan):
                fake.stopping.wait(plan["seconds"])

            def _write_chunk(self, text: str):
                data = text.encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _stream(self, plan):
                self.send_response(200)
                self.send_header("Content-Type", plan["content_type"])
                self.send_header("Transfer-Encoding", "chunked")
                if not fake.keep_alive:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.flush()
                events = list(plan["events"]) + (["data: [DONE]\n\n"] if plan["done"] else [])
                for i, event in enumerate(events):
                    if plan["cut_after"] is not None and i >= plan["cut_after"]:
                        self.connection.shutdown(socket.SHUT_RDWR)  # no terminating chunk
                        return
                    if plan["stall_after"] is not None and i >= plan["stall_after"]:
                        fake.stopping.wait(plan["stall_for"])
                        return
                    if i and plan["delay"]:
                        if fake.stopping.wait(plan["delay"]):
                            return
                    text = f"data: {json.dumps(event)}\n\n" if isinstance(event, dict) else event
                    self._write_chunk(text)
                if plan["stall_at_end"]:  # every event sent, the closing chunk held back
                    fake.stopping.wait(plan["stall_for"])
                    return
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):  # a client that left is not an error
                pass

            def shutdown_request(self, request):
                super().shutdown_request(request)
                with fake._lock:
                    fake.closed += 1

        self.server = Server(("127.0.0.1", port), Handler)  # a given port: the same server address again, later
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def push(self, *plans: dict) -> FakeOpenAI:
        self.script.extend(plans)
        return self

    def start(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def close(self) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()
