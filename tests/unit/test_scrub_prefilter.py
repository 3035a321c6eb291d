"""`scrub_text` skips its passes for a text that contains none of what they
act on (runs/domain/scrub.py `_MAY_CHANGE`): the answer must be exactly the
full scrub's, for every secret shape and for texts built to sit on the edges
(prefixes cut short, secrets split by NUL or a lone surrogate, redactions
next to each other)."""

from __future__ import annotations

import random

import pytest

from runs.domain import scrub
from tests.security.test_redaction_dump import canaries

PIECES = [
    "sk-",
    "sk",
    "-",
    "AKIA",
    "AKI",
    "gh",
    "ghp_",
    "gho_",
    "ghx_",
    "xoxb-",
    "xox",
    "xoxz-",
    "-----BEGIN ",
    "-----BEGIN",
    "RSA PRIVATE KEY-----",
    "-----END RSA PRIVATE KEY-----",
    "eyJ",
    "eyj",
    "ABCDEFGHIJKLMNOP",
    "abcdefgh12345678",
    "0" * 16,
    "0" * 30,
    ".",
    "_",
    " ",
    "\n",
    "\x00",
    "\ud800",
    "\udfff",
    "é",
    "[REDACTED]",
    '{"text": "',
    '"}',
]


def test_every_secret_shape_passes_the_prefilter_and_is_redacted():
    for shape, value in canaries("X").items():
        assert scrub._MAY_CHANGE.search(value), shape
        assert "CANARYX" not in scrub.scrub_text(f"before {value} after"), shape
    assert len(canaries("X")) == len(scrub.SECRET_PATTERNS)


@pytest.mark.parametrize("seed", range(20))
def test_the_prefiltered_scrub_equals_the_full_one(seed):
    rnd = random.Random(7000 + seed)
    changed = 0
    for _ in range(300):
        text = "".join(rnd.choice(PIECES) for _ in range(rnd.randint(0, 12)))
        full = scrub._scrub_all(text)
        assert scrub.scrub_text(text) == full, repr(text)
        changed += full != text
    assert changed > 0  # the corpus reaches the passes, not only the shortcut


def test_a_text_with_nothing_to_redact_comes_back_as_it_is():
    for text in ("", "echo", '{"text": "step 5"}', "ghost skeleton AKI xo eyj", "é ✓ \n"):
        assert scrub.scrub_text(text) is text
