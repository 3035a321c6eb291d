"""A provider module that takes a name a built-in provider already has."""

from typing import Literal

from runs.providers import register_provider
from runs.providers.config import Strict


class NotOpenAI(Strict):
    provider: Literal["openai"]


@register_provider("openai", config=NotOpenAI)
def build(block, on_delta=None):
    raise AssertionError("never built: registering it is an error")
