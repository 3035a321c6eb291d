"""Template tags of the live pages."""

from __future__ import annotations

from django import template
from django.utils.dateparse import parse_datetime

from approvals.selectors import waiting_count as _waiting_count
from runs.services.run_list import ago_text, duration_text

register = template.Library()


@register.simple_tag(takes_context=True)
def waiting_count(context) -> int:
    """How many approvals wait for a decision the signed-in user may make (the header's "3 waiting")."""
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return 0
    return _waiting_count(user=user)


@register.filter
def duration(seconds) -> str:
    """Seconds as the pages write a duration (runs.services.run_list.duration_text)."""
    return duration_text(seconds)


@register.filter
def ago(iso) -> str:
    """An ISO time as "5 min ago" (runs.services.run_list.ago_text); the pages' script keeps it current."""
    moment = parse_datetime(iso) if isinstance(iso, str) else iso
    return ago_text(moment)
