"""What `/metrics` keeps so a scrape stays flat in the size of the tables
(ops/fleet.py): the deployment's counters summed over every run that ended
and was folded in (`MetricTotal`), and the runs that ended since
(`UnfoldedRun`, filled by a trigger on `runs` in PostgreSQL, emptied by the
`metrics` maintenance sweep). A run's figures are final once it has ended
(nothing leaves a terminal state), so they are added once."""

from __future__ import annotations

from django.db import models


class MetricTotal(models.Model):
    """One number of one series: a counter's value for a label (`bucket`
    empty), or a histogram's cumulative count under a bound (`bucket` the
    bound, `+Inf` for the count) or its sum (`bucket` = `sum`)."""

    series = models.CharField(max_length=40)
    label = models.CharField(max_length=200)
    bucket = models.CharField(max_length=20, default="")
    value = models.FloatField(default=0)

    class Meta:
        db_table = "metric_totals"
        constraints = [models.UniqueConstraint(fields=["series", "label", "bucket"], name="metric_total_unique")]


class UnfoldedRun(models.Model):
    """A run that ended and whose figures are not in `MetricTotal` yet."""

    run_id = models.UUIDField(primary_key=True)

    class Meta:
        db_table = "metric_unfolded_runs"
