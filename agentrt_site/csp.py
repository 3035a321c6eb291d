"""django-csp's middleware, with the one relaxation it cannot express per view.

The Django admin's change lists without actions write a small inline <style> block (and the admin has no
per-view hook of ours), so under /admin/ the policy also allows inline styles. Scripts stay 'self' only
everywhere; the API docs relax their own views with django-csp's decorators (runs/api/views.py).
"""
from __future__ import annotations

from csp.constants import UNSAFE_INLINE
from csp.middleware import CSPMiddleware as _CSPMiddleware
from csp.middleware import PolicyParts

ADMIN_PREFIX = "/admin/"
ADMIN_UPDATE = {"style-src": [UNSAFE_INLINE]}


class CSPMiddleware(_CSPMiddleware):
    def get_policy_parts(self, request, response, report_only: bool = False) -> PolicyParts:
        parts = super().get_policy_parts(request, response, report_only)
        if not report_only and parts.update is None and request.path_info.startswith(ADMIN_PREFIX):
            parts.update = ADMIN_UPDATE
        return parts
