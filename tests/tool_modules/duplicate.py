"""A tool module whose tool takes a name a built-in already has."""

from runs.tools import register


@register(name="echo", read_only=True, parameters={"type": "object"})
def another_echo(arguments, context):
    return "shadowed"
