"""Where the tests find the documentation's executable blocks: the page of docs/ (or README.md) that holds a
`<!-- marker -->` line. A block moved from one page to another is still found; a block gone fails loudly."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def page_with(marker: str) -> str:
    """The text of the first page (README.md, then docs/*.md by name) that holds `<!-- marker -->`."""
    tag = f"<!-- {marker} -->"
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        if tag in text:
            return text
    raise AssertionError(f"no page of README.md or docs/ holds {tag}")
