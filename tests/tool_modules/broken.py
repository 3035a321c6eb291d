"""A tool module that registers one tool and then fails to import."""

from runs.tools import register


@register(name="half_registered", read_only=True, parameters={"type": "object"})
def half_registered(arguments, context):
    return "never"


raise RuntimeError("the refunds backend is not configured")
