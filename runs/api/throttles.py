"""Scoped throttles for the writes that cost (RELIABILITY §5): create run,
approve/reject, cancel, resume, input. Rates live in
REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"] and are read at each request, so a
settings override applies at once. Reads are never throttled here.

DRF's own warning holds: this is not a security boundary (the cache is per
process unless CACHES says otherwise); budgets and quotas live in the DB."""

from __future__ import annotations

from rest_framework.permissions import SAFE_METHODS
from rest_framework.settings import api_settings
from rest_framework.throttling import ScopedRateThrottle


class WriteScopedRateThrottle(ScopedRateThrottle):
    """ScopedRateThrottle for unsafe methods only, keyed by user."""

    def allow_request(self, request, view):
        if request.method in SAFE_METHODS:
            return True
        return super().allow_request(request, view)

    def get_rate(self):
        try:
            return api_settings.DEFAULT_THROTTLE_RATES[self.scope]
        except KeyError:
            return None  # no rate configured for this scope: not throttled
