"""What validating a tool call's arguments costs: a typed tool (pydantic,
strict JSON mode) against the same schema checked by jsonschema (a raw
`parameters=` tool), per call, in-process.

    DJANGO_SECRET_KEY=x .venv/bin/python bench/tool_validation.py [--calls 20000]

The schema is a small nested object (three fields, one a nested model with a
pattern), the shape of a typical side-effect tool's arguments. Prints the
median of 5 rounds, in microseconds per call. No database is touched.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrt_site.settings")

import django  # noqa: E402

django.setup()

from pydantic import BaseModel, Field  # noqa: E402

from runs.tools import REGISTRY, register  # noqa: E402
from runs.tools.registry import _schema_of  # noqa: E402


class Address(BaseModel):
    city: str
    zip: str = Field(pattern=r"^[0-9]{5}$")


class Ship(BaseModel):
    sku: str = Field(min_length=1)
    quantity: int = Field(gt=0, le=10)
    to: Address


ARGUMENTS = {"sku": "A-1", "quantity": 2, "to": {"city": "Lyon", "zip": "69001"}}


def typed(args: Ship, ctx):
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    options = parser.parse_args()
    register(name="bench_typed", read_only=True)(typed)
    register(name="bench_raw", read_only=True, parameters=_schema_of(Ship))(lambda arguments, context: None)
    for name in ("bench_typed", "bench_raw"):
        assert REGISTRY.validate(name, ARGUMENTS) == []
        check = functools.partial(REGISTRY.validate, name, ARGUMENTS)
        rounds = [timeit.timeit(check, number=options.calls) for _ in range(5)]
        print(f"{name}: {statistics.median(rounds) / options.calls * 1e6:.1f} us per validation")


if __name__ == "__main__":
    main()
