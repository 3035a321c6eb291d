"""Structured logs: `AGENTRT_LOG_FORMAT=json` gives one JSON object per line.

The executor sets the run's context (run, tenant, epoch, worker, and the step
as it advances) in contextvars around a run's slice; `RunContextFilter` puts
them on every record, whatever logger wrote it (ours, django-q2's, Django's).
Imported by the logging configuration: no Django imports here."""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
from datetime import UTC, datetime

FIELDS = ("run", "tenant", "step", "epoch", "worker")
_context: contextvars.ContextVar[dict] = contextvars.ContextVar("agentrt_log_context", default={})


@contextlib.contextmanager
def log_context(**values):
    """Add fields to every log record written inside the block."""
    token = _context.set({**_context.get(), **{k: v for k, v in values.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


def log_context_update(**values) -> None:
    """Change a field inside the current block (the step, as the run advances)."""
    current = _context.get()
    if current:
        current.update(values)


class RunContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        ctx = _context.get()
        for name in FIELDS:
            if not hasattr(record, name):
                setattr(record, name, ctx.get(name))
        return True


class JsonFormatter(logging.Formatter):
    """One object per line: time, level, logger, message, the run fields, and
    the exception (type and traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                out[name] = value if isinstance(value, (int, float)) else str(value)
        if record.exc_info:
            out["exc_type"] = record.exc_info[0].__name__ if record.exc_info[0] else None
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)
