"""A soak's artifacts as one small compressed file, from which its report is re-derived.

    python -m tests.chaos.bundle ARTIFACT_DIR BUNDLE.tar.xz   # pack (checks that it re-derives the same report)
    python -m tests.chaos.report --from BUNDLE.tar.xz         # re-check it and render the report again

The bundle holds what the checker (tests/chaos/checker.py) reads, and only that: the snapshot with each
event's payload cut down to the keys the checker looks at (SLIM_KEYS; every row is kept, so sequences,
epochs and transaction ids are all there), the sink's log without the request bodies (their SHA-256 is
kept: effects are compared by it), the fault log, the operator's decisions, the reconcilers' answers, and
the configuration the soak recorded (report.json's `config`, `planned`, `baseline`, `logs`). `pack`
re-derives the report from the bundle and refuses to write one whose report differs from the one the full
artifacts give.
"""

from __future__ import annotations

import io
import json
import lzma
import sys
import tarfile
import tempfile
from pathlib import Path

from tests.chaos.checker import ARTIFACTS, check, load_artifacts

# the event payload keys the checker reads (and of `error` / `failure` only their code / reason)
SLIM_KEYS = {
    "lease_epoch",
    "previous_epoch",
    "via",
    "previous_owner",
    "lease_owner",
    "phase",
    "read_only",
    "invocation",
    "outcome",
    "awaiting_decision",
    "attempt",
    "tool",
    "approval",
    "reason",
}
SINK_KEYS = ("key", "attempt", "path", "body_sha256", "t_ns", "mono_ns", "behaviour", "held_for_restart")
CONFIG = "report-config.json"
REPORT_KEYS = ("config", "planned", "baseline", "logs")


def slim_payload(p: dict | None) -> dict:
    if not isinstance(p, dict):
        return {}
    out = {k: v for k, v in p.items() if k in SLIM_KEYS}
    if isinstance(p.get("error"), dict):
        out["error"] = {"error": p["error"].get("error")}
    if isinstance(p.get("failure"), dict):
        out["failure"] = {"reason": p["failure"].get("reason")}
    return out


def slim_snapshot(snap: dict) -> dict:
    return {**snap, "events": [{**e, "payload": slim_payload(e.get("payload"))} for e in snap["events"]]}


def slim_sink(sink: list[dict]) -> list[dict]:
    return [{k: s[k] for k in SINK_KEYS if k in s} for s in sink]


def _jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r, separators=(",", ":"), default=str) + "\n" for r in rows).encode()


def pack(folder: Path, dest: Path) -> dict:
    """Write the bundle of a soak's artifact folder to `dest`; returns {bytes, members}."""
    from tests.chaos.report import rerender

    snap, sink, faults, decisions, reconciles = load_artifacts(folder)
    old = json.loads((folder / "report.json").read_text())
    members = {
        "snapshot.json": json.dumps(slim_snapshot(snap), separators=(",", ":"), default=str).encode(),
        "sink.jsonl": _jsonl(slim_sink(sink)),
        "faults.jsonl": _jsonl(faults),
        "decisions.jsonl": _jsonl(decisions),
        "reconcile.jsonl": _jsonl(reconciles),
        CONFIG: json.dumps({k: old[k] for k in REPORT_KEYS if k in old}, separators=(",", ":")).encode(),
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644  # the same artifacts give the same bytes
            tar.addfile(info, io.BytesIO(data))
    data = lzma.compress(buf.getvalue(), preset=9 | lzma.PRESET_EXTREME)
    full, _ = rerender(folder)
    with tempfile.TemporaryDirectory() as tmp:
        candidate = Path(tmp) / "bundle.tar.xz"
        candidate.write_bytes(data)
        slim, _ = rerender(unpack(candidate, Path(tmp) / "x"))
    for key in ("config", "logs"):
        full.pop(key, None), slim.pop(key, None)
    if json.dumps(full, sort_keys=True, default=str) != json.dumps(slim, sort_keys=True, default=str):
        raise SystemExit("the bundle does not re-derive the report the full artifacts give; not written")
    dest.write_bytes(data)
    return {"bytes": len(data), "members": {k: len(v) for k, v in members.items()}}


def unpack(bundle: Path, into: Path) -> Path:
    """Extract a bundle into the folder `into` (the checker's artifact layout); returns it."""
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(bundle.read_bytes())), mode="r") as tar:
        for m in tar.getmembers():
            if m.name not in ARTIFACTS + (CONFIG,) or not m.isfile():
                raise SystemExit(f"unexpected member {m.name!r} in {bundle}")
            (into / m.name).write_bytes(tar.extractfile(m).read())  # type: ignore[union-attr]
    config = json.loads((into / CONFIG).read_text())
    (into / "report.json").write_text(json.dumps(config))  # what rerender reads the soak's configuration from
    return into


def check_bundle(bundle: Path) -> dict:
    """The checker's report of a bundle (without rendering)."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = unpack(bundle, Path(tmp))
        return check(*load_artifacts(folder))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m tests.chaos.bundle ARTIFACT_DIR BUNDLE.tar.xz", file=sys.stderr)
        return 2
    info = pack(Path(argv[0]), Path(argv[1]))
    print(json.dumps(info, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
