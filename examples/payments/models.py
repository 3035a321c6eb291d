"""The journal: one row per charge, written *before* the gateway is called."""

from django.db import models


class ChargeJournal(models.Model):
    STARTED = "started"  # journaled; the gateway may or may not have been called
    SUCCEEDED = "succeeded"  # the gateway answered with the charge
    PENDING = "pending_review"  # the gateway holds the charge for review
    ABANDONED = "abandoned"  # the reconciler found the gateway never saw it

    idempotency_key = models.CharField(max_length=200, unique=True)
    run_id = models.UUIDField()
    customer = models.CharField(max_length=64)
    amount_cents = models.PositiveIntegerField()
    currency = models.CharField(max_length=3)
    state = models.CharField(
        max_length=16,
        choices=[(s, s) for s in (STARTED, SUCCEEDED, PENDING, ABANDONED)],
        default=STARTED,
    )
    charge_id = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "payments_charge_journal"

    def matches(self, charge: dict) -> bool:
        """Whether the gateway's charge is the one this row journaled."""
        return (
            charge.get("customer") == self.customer
            and charge.get("amount_cents") == self.amount_cents
            and charge.get("currency") == self.currency
        )
