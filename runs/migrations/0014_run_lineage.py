"""A run's lineage (forks and replays): `Run.forked_from` and
`Run.forked_from_step` (the run and the step a fork continues after),
`Run.fork_effects` ("approve": every side effect of the fork waits for a
person; "policy": the agent's policy decides, as for a fresh run) and
`Run.replay_of` (the run a replay answers its calls from). Null on every
existing run; each foreign key is indexed only where set."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0013_run_list_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="forked_from",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                editable=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="forks",
                to="runs.run",
            ),
        ),
        migrations.AddField(
            model_name="run",
            name="forked_from_step",
            field=models.IntegerField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="run",
            name="fork_effects",
            field=models.CharField(blank=True, editable=False, max_length=8, null=True),
        ),
        migrations.AddField(
            model_name="run",
            name="replay_of",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                editable=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="replays",
                to="runs.run",
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("forked_from__isnull", False)), fields=["forked_from"], name="runs_forked_from_idx"
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("replay_of__isnull", False)), fields=["replay_of"], name="runs_replay_of_idx"
            ),
        ),
    ]
