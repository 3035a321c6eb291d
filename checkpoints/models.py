"""The checkpoints table: a full snapshot every eighth version, deltas between."""

from django.db import models

from runs.clock import new_uuid, utcnow


class Checkpoint(models.Model):
    id = models.UUIDField(primary_key=True, default=new_uuid, editable=False)
    # No index or FK constraint of their own (see runs.models.ModelCall): (run, version) serves, the fence guards.
    tenant = models.ForeignKey("runs.Tenant", on_delete=models.CASCADE, db_index=False, db_constraint=False)
    run = models.ForeignKey(
        "runs.Run", on_delete=models.CASCADE, related_name="checkpoints", db_index=False, db_constraint=False
    )
    version = models.IntegerField()
    full = models.BooleanField(default=True)
    base_version = models.IntegerField(null=True, blank=True)
    trigger = models.CharField(max_length=40)
    state = models.JSONField()
    code_version = models.CharField(max_length=64, default="")
    lease_epoch = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(default=utcnow)

    class Meta:
        db_table = "checkpoints"
        constraints = [models.UniqueConstraint(fields=["run", "version"], name="checkpoint_run_version_unique")]
