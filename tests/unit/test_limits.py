"""One limits table (issue 12 item 5): the domain's RunLimits, the agent
definition's `limits` schema and the settings defaults all derive from
runs/domain/limits.py, so a limit is added or changed in one place."""

from __future__ import annotations

import pytest
from django.conf import settings
from pydantic import ValidationError

from runs.domain.limits import LIMITS, default_limits
from runs.domain.values import RunLimits
from runs.services.agent_schema import Limits

NAMES = [limit.name for limit in LIMITS]


def test_run_limits_have_exactly_the_tables_names_and_defaults():
    assert list(RunLimits.model_fields) == NAMES
    assert RunLimits().model_dump() == default_limits()


def test_the_settings_default_is_the_tables_defaults():
    assert settings.AGENTRT_DEFAULT_LIMITS == default_limits()


def test_an_agent_definition_may_give_any_limit_and_none_is_required():
    assert list(Limits.model_fields) == NAMES
    assert Limits().given() == {}


@pytest.mark.parametrize("limit", LIMITS, ids=lambda limit: limit.name)
def test_each_bound_of_the_table_is_enforced_where_it_applies(limit):
    if limit.ge is not None:
        below = limit.ge - 1
        with pytest.raises(ValidationError, match=limit.name):
            RunLimits(**{limit.name: below})
        with pytest.raises(ValidationError, match=limit.name):
            Limits(**{limit.name: below})
    if limit.gt is not None:
        with pytest.raises(ValidationError, match=limit.name):
            Limits(**{limit.name: limit.gt})
    if limit.le is not None:
        with pytest.raises(ValidationError, match=limit.name):
            Limits(**{limit.name: limit.le + 1})
        RunLimits(**{limit.name: limit.le + 1})  # a deployment's own defaults may go past a definition's ceiling
        assert Limits(**{limit.name: limit.le}).given() == {limit.name: limit.le}


@pytest.mark.parametrize("model", [RunLimits, Limits], ids=lambda m: m.__name__)
def test_each_fields_type_is_the_tables(model):
    for limit in LIMITS:
        annotation = model.model_fields[limit.name].annotation
        assert limit.type in getattr(annotation, "__args__", (annotation,)), (model.__name__, limit.name)
