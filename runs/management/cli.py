"""What the operator commands (`manage.py runs`, `manage.py approvals`) share:
acting as a named user, exit codes, JSON or text output, and text that is
safe to print on a terminal.

A command acts as the user `--as USER` names, through the same services and
scoping as REST and the pages: a member sees and acts in its own tenant; a
superuser sees every tenant and acts only in its own.

Exit codes (scripts can rely on them):

    0  done
    1  an error not listed below
    2  usage: a bad option or value, an unknown or inactive --as user, an ambiguous short id
    3  not found: no such run or approval the user may see (another tenant's is not found too)
    4  conflict: the object's state refuses it (run_terminal, approval_decided, approval_stale,
       run_deadline_passed, ...); the code is printed
    5  forbidden: the user lacks the permission (approvals.resolve_approval) or belongs to no tenant
"""

from __future__ import annotations

import argparse
import json
import sys
import unicodedata
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from runs.errors import RunError
from runs.services import scoping

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_CONFLICT = 4
EXIT_FORBIDDEN = 5
EXIT_CODES_HELP = (
    "exit codes: 0 done, 1 error, 2 usage (bad option or value, unknown --as user), 3 not found, "
    "4 conflict (the code is printed, e.g. run_terminal, approval_stale, run_deadline_passed), "
    "5 forbidden (permission, no tenant)"
)
_BY_STATUS = {400: EXIT_USAGE, 403: EXIT_FORBIDDEN, 404: EXIT_NOT_FOUND, 409: EXIT_CONFLICT, 429: EXIT_CONFLICT}


def cli_error(code: str, message: str, *, exit_code: int = EXIT_ERROR, fields: dict | None = None) -> CommandError:
    """A refusal as Django's CommandError (printed `code: message`, exiting `exit_code`), carrying its
    stable code (the API's) for --json."""
    error = CommandError(f"{code}: {message}", returncode=exit_code)
    error.code, error.message, error.fields = code, message, fields or {}
    return error


def refusal(exc: RunError, *, options: dict[str, str] | None = None) -> CommandError:
    """A service's error as the CLI's: its code, its message, the exit code of its HTTP status; a field the
    message names is the option the operator typed (`options`: field -> option)."""
    message = exc.message
    for field, option in (options or {}).items():
        if field in exc.fields:
            message = f"{option}: {exc.fields[field][0]}"
            break
    return cli_error(exc.code, message, exit_code=_BY_STATUS.get(exc.status, EXIT_ERROR), fields=exc.fields)


def common_options() -> argparse.ArgumentParser:
    """The options every subcommand takes (a parent parser)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--as",
        dest="as_user",
        required=True,
        metavar="USER",
        help="act as this user: a member sees and acts in its own tenant; a superuser sees every tenant "
        "and acts in its own",
    )
    parent.add_argument("--json", action="store_true", help="print JSON (the REST shapes) instead of text")
    return parent


def acting_user(username: str):
    """The active user `--as` names, who must belong to a tenant unless a superuser."""
    user = get_user_model().objects.filter(username=username).first()
    if user is None or not user.is_active:
        raise cli_error("unknown_user", f"no active user {username!r} (--as)", exit_code=EXIT_USAGE)
    if scoping.tenant_for(user) is None and not scoping.sees_every_tenant(user):
        raise cli_error("no_tenant", f"{username} is a member of no tenant", exit_code=EXIT_FORBIDDEN)
    return user


def safe(value: Any, *, multiline: bool = False) -> str:
    """Text a tenant, a model or a tool wrote, made safe for a terminal: control characters (escape
    sequences among them) are shown as escapes, never sent; newlines too unless `multiline`."""
    text = value if isinstance(value, str) else "" if value is None else str(value)
    out = []
    for ch in text:
        if multiline and ch in "\n\t":
            out.append(ch)
        elif unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp"):
            out.append(ch.encode("unicode_escape").decode("ascii"))
        else:
            out.append(ch)
    return "".join(out)


def emit_json(stream, value: Any) -> None:
    stream.write(json.dumps(value, indent=2, sort_keys=True, default=str))


def emit_error_json(error: CommandError) -> None:
    """With --json, a refusal is also a JSON object on stdout: `{"error": {"code", "message", "exit"}}`."""
    body: dict[str, Any] = {
        "code": getattr(error, "code", "error"),
        "message": getattr(error, "message", str(error)),
        "exit": error.returncode,
    }
    if getattr(error, "fields", None):
        body["fields"] = error.fields
    sys.stdout.write(json.dumps({"error": body}, sort_keys=True) + "\n")


def table(rows: list[list[str]], headers: list[str]) -> str:
    """Columns padded to their widest cell (cells already made safe)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def card_lines(card: dict[str, Any]) -> list[str]:
    """An approval as a person sees it before deciding (the live page's card, as text)."""
    lines = [
        f"approval   {card['id']} ({card['kind']}, {card['status']})",
        f"tool       {safe(card['tool'])}"
        + (f" — side effect: {safe(card['side_effect'])}" if card["side_effect"] else ""),
    ]
    if card["notice"]:
        lines.append(f"notice     {safe(card['notice'])}")
    if card["arguments"] is not None:
        args = json.dumps(card["arguments"], indent=2, sort_keys=True, ensure_ascii=False)
        lines.append("arguments  " + safe(args, multiline=True).replace("\n", "\n           "))
    lines.append(f"hash       {card['request_hash']}")
    if card["status"] == "pending":
        lines.append(
            f"waiting    since {card['created_at']}" + (f", expires {card['expires_at']}" if card["expires_at"] else "")
        )
        if card["ends_run"] or card["deadline_passed"]:
            lines.append(
                "note       "
                + ("the run's deadline has passed; " if card["deadline_passed"] else "")
                + (
                    f"approve is refused: confirm or reject, and the run ends {card['ends_run']}"
                    if card["ends_run"]
                    else ""
                )
            )
        lines.append("decide     " + ", ".join(card["decisions"]))
    else:
        lines.append(
            f"decided    {card['status']} by {safe(card['decided_by'] or '?')} via {card['decided_via'] or '?'}"
            f" at {card['decided_at']}" + (f": {safe(card['reason'])}" if card["reason"] else "")
        )
    return lines
