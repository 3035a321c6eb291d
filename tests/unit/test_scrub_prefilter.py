"""`scrub_text` skips its passes for a text that contains none of what they
act on (runs/domain/scrub.py `_MAY_CHANGE`): the answer must be exactly the
full scrub's, for every secret shape and for texts built to sit on the edges
(prefixes cut short, secrets split by NUL or a lone surrogate, redactions
next to each other)."""

from __future__ import annotations

import random
import re

import pytest

from runs.domain import scrub
from tests.security.test_redaction_dump import canaries, shape_of

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
    "sk_live_",
    "sk_test_",
    "rk_live_",
    "sk_",
    "_live_",
    "github_pat_",
    "github_pa",
    "glpat-",
    "glpat",
    "AIza",
    "AIz",
    "xoxe-",
    "whsec_",
    "whsec",
    "Bearer ",
    "bearer\t",
    "Bearer",
    "BEARER ",
    "BeArEr ",
    "https://",
    "://",
    "deploy:pw@",
    ":",
    "@",
    "/",
    "+",
    "=",
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


SHAPES = {secret.name: secret for secret in scrub.SECRETS}


def test_every_shape_of_the_table_has_a_canary():
    assert {shape_of(key) for key in canaries("X")} == set(SHAPES)


@pytest.mark.parametrize("key", list(canaries("X")))
def test_each_secret_shape_passes_the_prefilter_and_is_redacted(key):
    value = canaries("X")[key]
    secret = SHAPES[shape_of(key)]
    assert scrub._MAY_CHANGE.search(value), key
    matches = list(secret.pattern.finditer(value))
    assert matches, key
    for match in matches:  # each match starts with a literal the prefilter looks for
        assert any(re.match(prefix, match.group(0)) for prefix in secret.prefixes), (key, match.group(0))
    clean = scrub.scrub_text(f"before {value} after")
    assert "CANARYX" not in clean and clean.startswith("before ") and clean.endswith(" after"), clean
    assert "[REDACTED]" in clean
    assert scrub.scrub_text(clean) == clean  # a redaction is not redacted again


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


def test_each_prefix_starts_with_a_plain_character():
    # What keeps the prefilter one fast scan: the engine skips every position that starts no prefix.
    for secret in scrub.SECRETS:
        for prefix in secret.prefixes:
            assert prefix[0].isalnum() or prefix[0] in "-:_", (secret.name, prefix)


def test_a_text_with_nothing_to_redact_comes_back_as_it_is():
    for text in (
        "",
        "echo",
        '{"text": "step 5"}',
        "ghost skeleton AKI xo eyj",
        "é ✓ \n",
        '{"url": "https://example.com/a?b=c"}',  # a URL without a password is no reason for the passes
        "the bearer of news; git hub; sk_ alive",
    ):
        assert scrub.scrub_text(text) is text
