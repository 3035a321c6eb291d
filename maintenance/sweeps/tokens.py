"""Expired API tokens. A request checks only its own token and deletes it if
it has expired (runs/api/auth.py); the user's other expired tokens, which
knox would have deleted on each of their requests, are deleted here, a batch
at a time, with the `token_expired` signal knox sends for each."""

from __future__ import annotations

from django.db import transaction
from knox.models import AuthToken
from knox.signals import token_expired

from maintenance.locks import try_sweep_lock
from runs.runtime.queue import db_now

BATCH = 500


def sweep_tokens() -> dict:
    with transaction.atomic():
        if not try_sweep_lock("sweep.tokens"):
            return {"skipped": True}
        expired = list(AuthToken.objects.filter(expiry__lt=db_now()).select_related("user").order_by("expiry")[:BATCH])
        if expired:
            AuthToken.objects.filter(pk__in=[t.pk for t in expired]).delete()
    for token in expired:
        token_expired.send(sender=sweep_tokens, username=token.user.get_username(), source="other_token")
    return {"deleted_tokens": len(expired)}
