"""`make mutants`: apply each curated mutant to a scratch copy of the
repository, run the tests that guard it, and fail unless every one is killed.

A mutant is data, one TOML file in this directory:

    claim   = "what the mutant breaks, in words"
    guards  = ["tests/...::test_...", ...]    # run in this order, -x
    pending = "why it is not run yet"         # optional: listed, not run
    [[edit]]
    file    = "path/in/the/repository.py"
    find    = '''exact snippet'''             # must occur exactly `count` times (default 1)
    replace = '''its replacement'''

The working tree is never touched: the tracked and untracked (not ignored)
files are copied into a temporary directory, each mutant gets its own copy of
that, and its guards run there — real `qcluster`/daphne processes started by
the tests run the mutated code too. Each mutant uses its own test database
(`<DATABASE_URL's name>_m<N>`), so mutants run in parallel (`--jobs`).

KILLED: a guard failed (the first failing test is named). SURVIVED: every
guard passed. ERROR: the guards could not run (collection error, timeout) —
which is not a kill. A snippet that is not found stops everything before any
test runs: a refactor must update the mutant.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


class SpecError(Exception):
    pass


@dataclass
class Mutant:
    name: str
    claim: str
    guards: list[str]
    edits: list[dict]
    pending: str = ""


@dataclass
class Result:
    mutant: Mutant
    verdict: str  # KILLED | SURVIVED | ERROR | PENDING
    killer: str = ""
    seconds: float = 0.0
    detail: str = ""
    ran: list[str] = field(default_factory=list)


def load(only: list[str] | None = None) -> list[Mutant]:
    mutants = []
    for path in sorted(HERE.glob("*.toml")):
        data = tomllib.loads(path.read_text())
        unknown = set(data) - {"claim", "guards", "edit", "pending"}
        if unknown:
            raise SpecError(f"{path.name}: unknown keys {sorted(unknown)}")
        m = Mutant(
            name=path.stem,
            claim=data.get("claim", ""),
            guards=list(data.get("guards", [])),
            edits=list(data.get("edit", [])),
            pending=data.get("pending", ""),
        )
        if not m.claim or (not m.pending and (not m.edits or not m.guards)):
            raise SpecError(f'{path.name}: needs claim, at least one [[edit]] and guards (or pending = "why")')
        for e in m.edits:
            if set(e) - {"file", "find", "replace", "count"} or not {"file", "find", "replace"} <= set(e):
                raise SpecError(f"{path.name}: an [[edit]] needs exactly file, find, replace (and optional count)")
            if e["find"] == e["replace"]:
                raise SpecError(f"{path.name}: an edit that changes nothing ({e['file']})")
        for g in m.guards:
            if not (ROOT / g.split("::")[0]).is_file():
                raise SpecError(f"{path.name}: guard {g!r} names no file")
        if only is None or m.name in only:
            mutants.append(m)
    if only:
        missing = set(only) - {m.name for m in mutants}
        if missing:
            raise SpecError(f"no such mutant: {sorted(missing)}")
    return mutants


def mutated(root: Path, mutant: Mutant) -> dict[Path, str]:
    """The mutated text of each edited file; SpecError if a snippet is not
    found exactly as often as the spec says."""
    texts: dict[Path, str] = {}
    if mutant.pending:
        return texts
    for e in mutant.edits:
        path = root / e["file"]
        if not path.is_file():
            raise SpecError(f"{mutant.name}: {e['file']} does not exist")
        text = texts.get(path, path.read_text())
        want = int(e.get("count", 1))
        found = text.count(e["find"])
        if found != want:
            raise SpecError(
                f"{mutant.name}: the snippet to mutate occurs {found} time(s) in {e['file']}, expected {want} — "
                f"the code moved: update tests/mutants/{mutant.name}.toml\n--- snippet ---\n{e['find']}"
            )
        texts[path] = text.replace(e["find"], e["replace"])
    return texts


def scratch_copy(dest: Path) -> None:
    """The working tree as it is (tracked + untracked, not ignored files)."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    for name in filter(None, out.decode().split("\0")):
        src = ROOT / name
        if src.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)


def database_url(base: str, index: int) -> str:
    parts = urlsplit(base)
    name = parts.path.lstrip("/") or "agentrt"
    return urlunsplit(parts._replace(path=f"/{name}_m{index}"))


def first_failure(junit: Path) -> tuple[str, str]:
    """The node id of the first failed or errored test, and its message."""
    if not junit.exists():
        return "", ""
    for case in ET.parse(junit).getroot().iter("testcase"):
        for kind in ("failure", "error"):
            found = case.find(kind)
            if found is not None:
                message = " ".join((found.get("message") or kind).split())
                kind = (message[:157] + "...") if len(message) > 160 else message
                module = case.get("classname", "")
                parts = module.split(".")
                # classname is the dotted module (plus a class, if any)
                for cut in range(len(parts), 0, -1):
                    candidate = "/".join(parts[:cut]) + ".py"
                    if (ROOT / candidate).is_file():
                        node = "::".join([candidate, *parts[cut:], case.get("name", "")])
                        return node, kind
                return f"{module}::{case.get('name')}", kind
    return "", ""


def run_one(mutant: Mutant, index: int, base: Path, work: Path, db_url: str, timeout: float) -> Result:
    if mutant.pending:
        return Result(mutant, "PENDING", detail=mutant.pending)
    folder = work / mutant.name
    shutil.copytree(base, folder, symlinks=True)
    for path, text in mutated(folder, mutant).items():
        path.write_text(text)
    env = dict(os.environ, DATABASE_URL=database_url(db_url, index), PYTHONDONTWRITEBYTECODE="1")
    junit = folder / "junit.xml"
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *mutant.guards]
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Result(
            mutant, "ERROR", seconds=time.monotonic() - started, detail=f"guards did not finish in {timeout:.0f}s"
        )
    seconds = time.monotonic() - started
    output = proc.stdout + proc.stderr
    if proc.returncode == 0:
        return Result(mutant, "SURVIVED", seconds=seconds, detail=output[-2000:])
    if proc.returncode == 1:
        killer, kind = first_failure(junit)
        if killer:
            return Result(mutant, "KILLED", killer=killer, seconds=seconds, detail=kind)
    return Result(mutant, "ERROR", seconds=seconds, detail=f"pytest exit {proc.returncode}\n{output[-3000:]}")


def main(argv=None) -> int:
    # The MCP tests' servers (tests/mcptools/servers.py) live under the ignored var/, which scratch copies lack:
    # every copy uses this checkout's venv (installed there once if it is not).
    os.environ.setdefault("AGENTRT_TEST_MCP_VENV", str(ROOT / "var" / "mcp-servers"))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="only these mutants (file stems)")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("MUTANTS_JOBS", "2")))
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant")
    parser.add_argument("--keep", action="store_true", help="keep the scratch copies")
    parser.add_argument("--check", action="store_true", help="only check that every snippet applies")
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="first run every guard on the unmutated copy (a kill means something only if the guards pass "
        "without the mutant; .ci/run gets that from the `make test` just before)",
    )
    args = parser.parse_args(argv)
    db_url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/agentrt")
    if not db_url.startswith(("postgres://", "postgresql://")):
        print("make mutants: DATABASE_URL must be a PostgreSQL URL", file=sys.stderr)
        return 2
    try:
        mutants = load(args.names or None)
        for m in mutants:  # every snippet applies before anything runs
            mutated(ROOT, m)
    except SpecError as exc:
        print(f"make mutants: {exc}", file=sys.stderr)
        return 2
    if args.check:
        print(f"{len(mutants)} mutants, every snippet found")
        return 0
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="agentrt-mutants-"))
    try:
        base = work / "_base"
        scratch_copy(base)
        guards = sorted({g for m in mutants for g in m.guards})
        if guards:  # every guard names a test that exists (a renamed test must update its mutant)
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *guards],
                cwd=base,
                env=dict(os.environ, DATABASE_URL=db_url),
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                print(
                    f"make mutants: a guard does not name a test\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}",
                    file=sys.stderr,
                )
                return 2
        if guards and args.baseline:
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *guards],
                cwd=base,
                env=dict(os.environ, DATABASE_URL=database_url(db_url, len(mutants))),
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                print(
                    f"make mutants: the guards fail WITHOUT any mutant\n{proc.stdout[-4000:]}{proc.stderr[-2000:]}",
                    file=sys.stderr,
                )
                return 2
            print(f"baseline: every guard passes unmutated ({time.monotonic() - started:.0f}s)", flush=True)
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = [pool.submit(run_one, m, i, base, work, db_url, args.timeout) for i, m in enumerate(mutants)]
            results = []
            for f in futures:
                r = f.result()
                results.append(r)
                print(
                    f"{r.verdict:8} {r.mutant.name}"
                    + (f"  <- {r.killer}\n         {r.detail}" if r.killer else "")
                    + f"  ({r.seconds:.0f}s)",
                    flush=True,
                )
    finally:
        if args.keep:
            print(f"scratch copies kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    total = time.monotonic() - started
    report = render(results, total, args.jobs)
    print("\n" + report)
    (ROOT / "artifacts").mkdir(exist_ok=True)
    (ROOT / "artifacts" / "mutants.md").write_text(report)
    for r in results:
        if r.verdict in ("SURVIVED", "ERROR"):
            print(f"\n--- {r.mutant.name}: {r.verdict} ---\n{r.detail}", file=sys.stderr)
    bad = [r for r in results if r.verdict in ("SURVIVED", "ERROR")]
    if bad:
        print(f"make mutants: FAILED — {', '.join(r.mutant.name + ' ' + r.verdict for r in bad)}", file=sys.stderr)
        return 1
    return 0


def render(results: list[Result], total: float, jobs: int) -> str:
    lines = ["| mutant | claim | result | killed by (its failure) | s |", "|---|---|---|---|---|"]
    for r in results:
        if r.killer:
            by = f"`{r.killer}` ({r.detail.replace('|', '/')})"
        else:
            by = f"pending: {r.detail}" if r.verdict == "PENDING" else ""
        lines.append(f"| {r.mutant.name} | {r.mutant.claim} | {r.verdict} | {by} | {r.seconds:.0f} |")
    killed = sum(r.verdict == "KILLED" for r in results)
    run = sum(r.verdict != "PENDING" for r in results)
    lines.append("")
    lines.append(
        f"{killed}/{run} mutants killed ({len(results) - run} pending), {total:.0f}s wall clock with --jobs {jobs}"
    )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
