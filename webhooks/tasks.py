"""django-q2 task functions: doorbells only (the delivery row is the truth)."""

from .delivery import deliver as _deliver


def deliver(delivery_id: str) -> str:
    """Claim the delivery and attempt it once, or exit quietly."""
    return _deliver(delivery_id)
