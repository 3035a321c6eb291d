"""Bound and scrub what a tool, a model or a person supplies before it is persisted.

Every string a run persists comes from one of a few sources, each scrubbed
where it enters: the run input (`run_submit`), a user's
answer (`run_input`), the model's turn (`scrub_turn`, in the loop, before the
turn reaches an event, the conversation/checkpoint, the final message or an
invocation row), streamed deltas (the executor's batcher), tool arguments and
results (the pipeline: `scrub`, `bound`) and error messages (`scrub_text`).
Everything derived from those (checkpoints, compaction summaries, approvals)
is then clean by construction.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runs.domain.values import ModelTurn

MAX_RESULT_BYTES = 64 * 1024
MAX_DEPTH = 32


@dataclass(frozen=True)
class Secret:
    """One shape of secret: `pattern` finds it, `replacement` takes its place
    (the secret part only: `Bearer [REDACTED]`, `https://user:[REDACTED]@`),
    and `prefixes` are the regexes of the literals every match starts with,
    which `scrub_text`'s one prefilter search looks for (so a shape added here
    is in the prefilter by construction; tests/unit/test_scrub_prefilter.py
    checks each shape's canaries against both). Each prefix starts with a
    plain character, which lets the regex engine skip every position that
    starts none of them: the prefilter stays one fast scan."""

    name: str
    prefixes: tuple[str, ...]
    pattern: re.Pattern[str]
    replacement: str = "[REDACTED]"


def _secret(name: str, prefixes: str | tuple[str, ...], pattern: str, replacement: str = "[REDACTED]") -> Secret:
    return Secret(name, (prefixes,) if isinstance(prefixes, str) else prefixes, re.compile(pattern), replacement)


# The one table of the secret shapes redacted everywhere (README "Agents", redaction). Order matters where shapes
# nest: a private-key block or a bearer token first, whatever shape is inside it.
SECRETS: tuple[Secret, ...] = (
    _secret(
        "private_key",
        "-----BEGIN ",
        r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(-----END [A-Z ]*PRIVATE KEY-----|$)",
    ),
    # RFC 6750 `Authorization: Bearer <b64token>` (the scheme as Bearer, bearer or BEARER); 16 characters or more.
    _secret(
        "bearer",
        (r"Bearer\s", r"bearer\s", r"BEARER\s"),
        r"(Bearer|bearer|BEARER)\s+[A-Za-z0-9\-._~+/]{16,}=*",
        r"\1 [REDACTED]",
    ),
    # A URL's userinfo password (`https://user:password@host`): the user kept, the password redacted.
    _secret("url_password", r"://[^/?#\s@:]+:[^/?#\s@]+@", r"(://[^/?#\s@:]+):[^/?#\s@]+@", r"\1:[REDACTED]@"),
    _secret("openai", "sk-", r"sk-[A-Za-z0-9_\-]{16,}"),
    # Stripe secret and restricted keys, live and test.
    _secret("stripe", ("sk_live_", "sk_test_", "rk_live_", "rk_test_"), r"[sr]k_(?:live|test)_[A-Za-z0-9]{16,}"),
    _secret("aws", "AKIA", r"AKIA[0-9A-Z]{16}"),
    # GitHub's classic tokens (ghp_ personal, gho_ OAuth, ghu_/ghs_ apps, ghr_ refresh) and fine-grained ones.
    _secret("github", "gh[pousr]_", r"gh[pousr]_[A-Za-z0-9]{30,}"),
    _secret("github_pat", "github_pat_", r"github_pat_[A-Za-z0-9_]{22,}"),
    _secret("gitlab", "glpat-", r"glpat-[A-Za-z0-9_\-]{20,}"),
    _secret("google", "AIza", r"AIza[0-9A-Za-z_\-]{35}"),
    # Slack: xoxb-, xoxp-, xoxa-, xoxe-, ... (every letter).
    _secret("slack", "xox[A-Za-z]-", r"xox[A-Za-z]-[A-Za-z0-9\-]{10,}"),
    # Our own webhook signing secrets (webhooks/secrets.py: whsec_ + 43 characters), and Stripe's of the same shape.
    _secret("webhook_secret", "whsec_", r"whsec_[A-Za-z0-9_\-]{16,}"),
    _secret("jwt", "eyJ", r"eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"),
)
SECRET_PATTERNS = [secret.pattern for secret in SECRETS]
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")
# What a text must contain for `scrub_text` to change it: NUL or a lone
# surrogate (`_ODD`), or a prefix a secret shape starts with. Most strings a
# step scrubs (names, arguments, results) contain none, and these two scans
# replace every pass.
_ODD = re.compile(r"[\x00\ud800-\udfff]")
_MAY_CHANGE = re.compile("|".join(prefix for secret in SECRETS for prefix in secret.prefixes))


def scrub_text(text: str) -> str:
    if _MAY_CHANGE.search(text) is None and _ODD.search(text) is None:
        return text
    return _scrub_all(text)


def _scrub_all(text: str) -> str:
    text = text.replace("\x00", "\ufffd")
    text = _LONE_SURROGATE.sub("\ufffd", text)
    for secret in SECRETS:
        text = secret.pattern.sub(secret.replacement, text)
    return text


def scrub_raw_arguments(raw: str) -> str:
    """Raw JSON arguments scrubbed as text, and — when they hold a `\\u`
    escape, which hides a secret from the text patterns (`sk-\\u0041...`) —
    as the value they decode to: if that value holds a secret, the raw text
    becomes the scrubbed value re-encoded (the call's meaning is kept, the
    model's spelling is not)."""
    raw = scrub_text(raw)
    if "\\u" not in raw:
        return raw
    try:
        parsed = json.loads(raw)
    except (ValueError, RecursionError):
        return raw
    clean = scrub(parsed)
    return raw if clean == parsed else json.dumps(clean, ensure_ascii=False)


def scrub_turn(turn: ModelTurn) -> ModelTurn:
    """A model turn with its text, call names and raw arguments scrubbed.

    Raw arguments stay JSON text: a redaction replaces characters inside a
    JSON string with `[REDACTED]`, which is valid in the same place."""
    calls = []
    changed = False
    for c in turn.tool_calls:
        name, raw = scrub_text(c.name), scrub_raw_arguments(c.raw_arguments)
        if name != c.name or raw != c.raw_arguments:
            c = c.model_copy(update={"name": name, "raw_arguments": raw})
            changed = True
        calls.append(c)
    text = scrub_text(turn.text) if turn.text is not None else None
    if not changed and text == turn.text:
        return turn  # nothing to redact (frozen models: the same turn is the scrubbed one)
    return turn.model_copy(update={"text": text, "tool_calls": calls})


# What a secret's last characters may be: letters, digits, `_.-`, and `+/=~` for a bearer token.
_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-+/=~")
_KEY_HEADER = 100  # longest "-----BEGIN ... PRIVATE KEY-----" header still arriving


def scrub_stream(raw: str) -> str:
    """The scrubbed part of a text still being streamed that later text
    cannot change: the trailing run of token characters (a secret may be
    half-arrived there), an unfinished private-key header and a URL whose
    authority has not ended yet (`https://user:pa`: its password may still be
    arriving) are held back. Deltas shown as they stream are cut from this,
    so a secret split across two deltas is redacted whole."""
    clean = scrub_text(raw)
    cut = len(clean)
    while cut and clean[cut - 1] in _TOKEN_CHARS:
        cut -= 1
    header = clean.rfind("-----BEGIN", max(0, len(clean) - _KEY_HEADER))
    if header != -1:
        cut = min(cut, header)
    authority = clean.rfind("://")
    if authority != -1 and not any(c in "/?#" or c.isspace() for c in clean[authority + 3 :]):
        cut = min(cut, authority)
    return clean[:cut]


def scrub(value: Any, depth: int = 0) -> Any:
    """Replace NUL and lone surrogates, redact secrets, cap nesting."""
    if depth > MAX_DEPTH:
        return "[TRUNCATED: too deeply nested]"
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, dict):
        return {scrub_text(str(k)): scrub(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub(v, depth + 1) for v in value]
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    return value


def bound(value: Any) -> tuple[Any, bool]:
    """Scrub, then cap the serialised size; return (value, truncated)."""
    value = scrub(value)
    text = json.dumps(value, ensure_ascii=False)
    if len(text.encode()) <= MAX_RESULT_BYTES:
        return value, False
    return {"truncated": True, "preview": text[: MAX_RESULT_BYTES // 2]}, True
