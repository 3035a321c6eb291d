"""A tool for `bench/steps.py --long`, loaded with
`AGENTRT_TOOL_MODULES=bench.bench_tools`: a read-only call whose result is
`size` characters of text (words drawn from a fixed list, seeded by the
call), so every step of a long run returns kilobytes as a real tool would."""

from __future__ import annotations

import random

from pydantic import BaseModel, Field

from runs.tools import ToolExecutionContext, register

WORDS = (
    "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega order invoice refund status "
    "pending shipped customer account balance total item price quantity region north south east west "
    "report summary detail note error warning ok true false null id date time value result page next"
).split()


class Blob(BaseModel):
    """Return `size` characters of text."""

    size: int = Field(ge=1, le=65_536)
    seed: int = 0


def _corpus(size: int) -> str:
    rnd = random.Random(0)
    words: list[str] = []
    length = 0
    while length < size:
        word = rnd.choice(WORDS)
        words.append(word)
        length += len(word) + 1
    return " ".join(words)


# Drawn once: a slice of it per call. Drawing 8 KiB of words per call cost
# 0.33 ms of the tool's own time a step, which `--long` then charged to the
# runtime (bench/RESULTS.md, session 14).
CORPUS = _corpus(3 * 65_536)


@register(name="bench_blob", read_only=True)
def bench_blob(args: Blob, ctx: ToolExecutionContext) -> str:
    """Text of the asked size, the same for the same seed, different seeds
    starting at different words."""
    start = (args.seed * 7919) % (len(CORPUS) - args.size)
    start = CORPUS.index(" ", start) + 1
    return CORPUS[start : start + args.size]
