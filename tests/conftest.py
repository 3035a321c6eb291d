"""Suite-wide fixtures. `make test` runs on PostgreSQL and fails if it is
unreachable: there is no silent fallback to SQLite (the embedded default has
its own named smoke test, tests/smoke)."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config):
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        raise pytest.UsageError(
            "the suite runs on PostgreSQL: set DATABASE_URL=postgres://... (make test does); "
            "there is no SQLite fallback — tests/smoke covers the embedded default"
        )
    import psycopg

    try:
        from urllib.parse import urlsplit, urlunsplit

        server = urlunsplit(urlsplit(url)._replace(path="/postgres"))  # the named DB may not exist yet
        psycopg.connect(server, connect_timeout=5).close()
    except Exception as exc:  # fail loudly, never skip
        raise pytest.UsageError(f"PostgreSQL is unreachable at {url}: {exc}") from None


SERVER_TIMEOUTS = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")


def _server_options(restore: str | None = None) -> str | None:
    """Drop the runtime's server-side timeouts from the default database's
    connection options (returning what they were), or put `restore` back.
    New connections take the change: every open one is closed."""
    from django.db import connections

    options = connections["default"].settings_dict.setdefault("OPTIONS", {})
    before = options.get("options")
    if restore is not None:
        options["options"] = restore
    elif before:
        kept = [o for o in before.split("-c ") if o.strip() and o.split("=")[0].strip() not in SERVER_TIMEOUTS]
        options["options"] = " ".join(f"-c {o.strip()}" for o in kept)
    connections.close_all()
    return before


@pytest.fixture(scope="session")
def _setup_without_timeouts(django_db_blocker):
    """CREATE DATABASE, the migrations and DROP DATABASE are the suite's
    set-up, not the runtime: on a loaded machine they can outlast the 5 s
    statement timeout the runtime's connections carry. They run without it;
    every test runs with it."""
    with django_db_blocker.unblock():
        saved = _server_options()
    yield saved


@pytest.fixture(scope="session")
def django_db_setup(_setup_without_timeouts, django_db_setup, django_db_blocker):
    """pytest-django's test database (created without the server timeouts),
    then the timeouts back on for the tests; before it is dropped: end the
    sessions that child processes (qcluster, daphne, a tool's thread) left
    on it, so DROP DATABASE neither finds other users nor waits for them."""
    with django_db_blocker.unblock():
        _server_options(restore=_setup_without_timeouts)
    yield
    from django.db import connection

    with django_db_blocker.unblock():
        _server_options()
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        connection.close()


def wait_for(condition, timeout: float = 30.0, interval: float = 0.02, message: str = "condition"):
    """Await a condition by polling it; fail with `message` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


@pytest.fixture
def tenant(db):
    from runs.services import tenant_create

    tenant, _ = tenant_create(name="acme", username="alice", password="pw")
    return tenant


@pytest.fixture
def load_agent(tenant):
    from runs.services import agent_load

    def load(name="bot", turns=None, tools=("echo",), policy=None, limits=None, model=None, **extra):
        definition = {
            "name": name,
            "instructions": "test agent",
            "model": model or {"provider": "scripted", "turns": turns or [{"text": "done"}]},
            "tools": list(tools),
        }
        if policy is not None:
            definition["policy"] = policy
        if limits is not None:
            definition["limits"] = limits
        definition.update(extra)
        return agent_load(tenant=tenant, definition=definition)

    return load


@pytest.fixture
def submit(tenant):
    from runs.services import run_submit

    def go(agent="bot", text="hello", **kw):
        run, _ = run_submit(tenant=tenant, agent=agent, input=text, **kw)
        return run

    return go


def subprocess_env(**overrides) -> dict:
    """Environment for a child process that uses this test database."""
    from django.db import connection

    s = connection.settings_dict
    env = dict(os.environ)
    env["DATABASE_URL"] = (
        f"postgres://{s['USER'] or 'postgres'}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
    )
    env.setdefault("AGENTRT_LOG_LEVEL", "WARNING")
    env["PYTHONUNBUFFERED"] = "1"
    env.update({k: str(v) for k, v in overrides.items()})
    return env


class Cluster:
    """A real `manage.py qcluster` process group."""

    def __init__(self, env: dict, log_path: Path):
        self.log_path = log_path
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def signal(self, sig) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)  # the sentinel drains its workers
            try:
                self.proc.wait(timeout=8)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.signal(signal.SIGKILL)  # children left behind
        self.log.close()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def cluster(transactional_db, tmp_path):
    started: list[Cluster] = []

    def start(**env) -> Cluster:
        c = Cluster(subprocess_env(**env), tmp_path / f"qcluster-{len(started)}.log")
        started.append(c)
        return c

    yield start
    for c in started:
        c.stop()


@pytest.fixture
def procs(tmp_path):
    """Start `python <args>` (e.g. `manage.py run_maintenance`) on the test database, logged to
    `<name>.log`; every process started is stopped at teardown (SIGTERM, then SIGKILL)."""
    started: list[tuple[subprocess.Popen, object]] = []

    def start(args, name, **env) -> subprocess.Popen:
        log = open(tmp_path / f"{name}.log", "wb")
        p = subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env=subprocess_env(**env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        started.append((p, log))
        return p

    yield start
    for p, log in started:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)
        log.close()


@pytest.fixture
def sink(settings, tmp_path):
    from tests.sink import Sink

    s = Sink(tmp_path / "sink.jsonl")
    settings.AGENTRT_HTTP_TOOL_ALLOWED_HOSTS = [s.host]
    yield s
    s.close()


@pytest.fixture
def operator(tenant):
    from django.contrib.auth.models import Permission

    from runs.services import tenant_create

    _, user = tenant_create(name=tenant.name, username="op", password="pw", operator=True)
    user.user_permissions.add(Permission.objects.get(codename="publish_agent"))
    return type(user).objects.get(pk=user.pk)


def race(*fns):
    """Call each of `fns` on a thread of its own (so on its own database
    connection), all released at once by a barrier; return what each returned
    or raised, in order."""
    barrier = threading.Barrier(len(fns))
    results: list = [None] * len(fns)

    def go(i, fn):
        barrier.wait()
        try:
            results[i] = fn()
        except Exception as exc:  # the loser's answer
            results[i] = exc
        finally:
            from django.db import connections

            connections.close_all()

    threads = [threading.Thread(target=go, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _port_band() -> range:
    """This test process's ports: below the kernel's ephemeral range (so no
    outgoing connection of any process is handed one of them between the
    moment a test picks it and the moment its server binds it), one band per
    xdist worker (so two workers never pick the same one)."""
    low, _ = _ephemeral_range()
    base = 10000 if low > 12000 else 1024
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), index + 1)
    width = (low - base) // count
    return range(base + index * width, base + (index + 1) * width)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture
def silent_name_server(monkeypatch):
    """The system's resolver — outside the project, the one thing these tests
    replace — gives no answer for the names a test silences until the test
    ends (then it fails them EAI_NONAME); other names resolve as usual.
    `silent_name_server(*names)` silences them and returns the record:
    `.asked` the silenced lookups made, `.answered` those that returned."""
    release = threading.Event()
    record = SimpleNamespace(names=set(), asked=[], answered=[])
    system_resolver = socket.getaddrinfo

    def resolver(host, *args, **kwargs):
        if host not in record.names:
            return system_resolver(host, *args, **kwargs)
        record.asked.append(host)
        release.wait(30)
        record.answered.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    def silence(*names: str) -> SimpleNamespace:
        record.names.update(names)
        return record

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    yield silence
    release.set()


def free_port(count: int = 1) -> int:
    """The first of `count` consecutive local TCP ports nothing holds (now),
    from this process's band (see `_port_band`): a port taken from the
    ephemeral range could be handed to another process's outgoing connection
    before the server meant for it listens (CI saw `Address already in use`
    for the second port of a two-node cluster)."""
    band = _port_band()
    rng = random.Random()
    for _ in range(1000):
        first = rng.randrange(band.start, band.stop - count + 1)
        if all(_bindable(first + i) for i in range(count)):
            return first
    raise RuntimeError(f"no {count} free consecutive ports in {band}")


def start_daphne(env: dict, log, flags: tuple[str, ...] = ()) -> tuple[int, subprocess.Popen]:
    """A real daphne on a free port with `env` (and daphne's `flags`), its output
    to `log`; returns (port, process) once it listens. The caller terminates it."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), *flags, "agentrt_site.asgi:application"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def up():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return False

    try:
        wait_for(up, timeout=30, message="daphne to listen")
    except BaseException:
        proc.terminate()
        proc.wait(timeout=10)
        raise
    return port, proc
