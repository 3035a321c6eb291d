"""The signature scheme as the README documents it (issue 17 item 5)."""

from __future__ import annotations

import hashlib
import hmac
import re
from pathlib import Path

from webhooks.outbound import body_bytes, signature

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_verifier():
    """The README's verification snippet, executed as written (five lines)."""
    found = re.search(r"<!-- verify-signature -->\n\n((?:    .*\n)+)", README.read_text())
    block = "".join(line[4:] + "\n" for line in found.group(1).splitlines())
    assert len(block.strip().splitlines()) == 5, block
    namespace: dict = {}
    exec(block, namespace)  # noqa: S102 - our own README's code
    return namespace["verify"]


def test_the_readme_snippet_verifies_our_signature_and_refuses_a_forgery():
    verify = readme_verifier()
    body = body_bytes({"id": "d1", "type": "run.completed", "data": {"run": {"id": "r1"}}})
    import time

    now = int(time.time())
    header = signature("whsec_abc", now, body)
    assert re.fullmatch(r"t=\d+,v1=[0-9a-f]{64}", header)
    assert verify("whsec_abc", header, body)
    assert not verify("whsec_other", header, body)
    assert not verify("whsec_abc", header, body + b" ")
    stale = signature("whsec_abc", now - 3600, body)
    assert not verify("whsec_abc", stale, body)  # a replay an hour later
    t = now
    expected = hmac.new(b"whsec_abc", f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    assert header == f"t={t},v1={expected}"
