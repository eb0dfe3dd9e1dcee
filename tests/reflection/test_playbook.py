"""The playbook's arithmetic and its writes: decay by half-life, feedback, promotion,
demotion, inversion into anti-patterns, and deltas decided once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pytest_django.fixtures import Settings as SettingsWrapper

from reflection.errors import IllegalTransition, InvalidRule
from reflection.models import DeltaOp, DeltaStatus, PlaybookDelta, PlaybookRule, RuleKind
from reflection.services.playbook import (
    anti_pattern_of,
    confidence_decayed,
    delta_decide,
    delta_propose,
    is_anti_pattern,
    rule_create,
    rule_feedback,
    rules_decay,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_it_halves_confidence_per_half_life() -> None:
    assert confidence_decayed(0.8, T0, T0 + timedelta(days=30), 30) == pytest.approx(0.4)
    assert confidence_decayed(0.8, T0, T0 + timedelta(days=60), 30) == pytest.approx(0.2)
    assert confidence_decayed(0.8, T0, T0 + timedelta(days=15), 30) == pytest.approx(0.8 / 2**0.5)


def test_it_does_not_decay_without_time_elapsed() -> None:
    assert confidence_decayed(0.8, None, T0, 30) == 0.8
    assert confidence_decayed(0.8, T0, T0, 30) == 0.8
    assert confidence_decayed(0.8, T0 + timedelta(days=1), T0, 30) == 0.8


def test_the_inversion_predicate() -> None:
    assert is_anti_pattern(failures=3, successes=1, min_failures=3)
    assert not is_anti_pattern(failures=2, successes=0, min_failures=3)  # too few failures
    assert not is_anti_pattern(failures=4, successes=2, min_failures=3)  # not > 2x
    assert is_anti_pattern(failures=5, successes=2, min_failures=3)


@pytest.mark.django_db
def test_it_writes_the_anti_pattern_text() -> None:
    rule = rule_create(text="  Run the whole test suite before each commit ")
    assert anti_pattern_of(rule) == "Avoid: Run the whole test suite before each commit"


@pytest.mark.django_db
def test_it_refuses_an_empty_rule() -> None:
    with pytest.raises(InvalidRule):
        rule_create(text="   ")


@pytest.mark.django_db
def test_it_promotes_a_helpful_rule_to_established_then_proven() -> None:
    rule = rule_create(text="Read the failing test first")
    maturities = []
    for day in range(10):
        rule = rule_feedback(rule.pk, True, T0 + timedelta(minutes=day))
        maturities.append(rule.maturity)
    # 0.5 -> 0.6 -> 0.68 -> 0.744: established at the third helpful feedback.
    assert maturities[:3] == ["candidate", "candidate", "established"]
    assert maturities[8] == "established"
    assert maturities[9] == "proven"
    assert rule.helpful == 10
    assert rule.confidence == pytest.approx(1 - 0.5 * 0.8**10, abs=1e-4)
    assert rule.last_feedback_at == T0 + timedelta(minutes=9)


@pytest.mark.django_db
def test_it_deprecates_a_harmful_rule_below_the_floor() -> None:
    rule = rule_create(text="Skip the linter")
    rule = rule_feedback(rule.pk, False, T0)
    rule = rule_feedback(rule.pk, False, T0)
    assert rule.maturity == "candidate"
    assert rule.confidence == pytest.approx(0.32)
    rule = rule_feedback(rule.pk, False, T0)
    assert rule.maturity == "deprecated"
    assert rule.confidence == pytest.approx(0.256)
    assert rule.harmful == 3


@pytest.mark.django_db
def test_a_harmful_rule_proposes_its_anti_pattern_once() -> None:
    rule = rule_create(text="Skip the linter", roles=["coder"])
    for _ in range(4):
        rule_feedback(rule.pk, False, T0)
    delta = PlaybookDelta.objects.get()
    assert (delta.op, delta.kind, delta.text) == ("add", "anti_pattern", "Avoid: Skip the linter")
    assert delta.roles == ["coder"]
    accepted = delta_decide(delta.pk, to=DeltaStatus.ACCEPTED, by="curator")
    assert accepted.rule_id is not None
    anti = PlaybookRule.objects.get(pk=accepted.rule_id)
    assert (anti.kind, anti.text) == (RuleKind.ANTI_PATTERN, "Avoid: Skip the linter")
    assert PlaybookRule.objects.get(pk=rule.pk).maturity == "deprecated"


@pytest.mark.django_db
def test_feedback_decays_confidence_before_moving_it(settings: SettingsWrapper) -> None:
    settings.REFLECTION_HALF_LIFE_DAYS = 10.0
    rule = rule_create(text="Keep commits small")
    PlaybookRule.objects.filter(pk=rule.pk).update(confidence=0.8, confidence_at=T0)
    rule = rule_feedback(rule.pk, True, T0 + timedelta(days=10))
    assert rule.confidence == pytest.approx(0.4 + 0.6 * 0.2)


@pytest.mark.django_db
def test_the_sweep_decays_every_live_rule_once_per_interval(settings: SettingsWrapper) -> None:
    settings.REFLECTION_HALF_LIFE_DAYS = 30.0
    live = rule_create(text="Keep commits small")
    gone = rule_create(text="Old advice")
    PlaybookRule.objects.filter(pk=live.pk).update(confidence=0.8, confidence_at=T0)
    PlaybookRule.objects.filter(pk=gone.pk).update(
        confidence=0.8, confidence_at=T0, maturity="deprecated"
    )
    assert rules_decay(T0 + timedelta(days=30)) == 1
    assert PlaybookRule.objects.get(pk=live.pk).confidence == pytest.approx(0.4)
    assert rules_decay(T0 + timedelta(days=30)) == 0  # the same instant: nothing more
    assert rules_decay(T0 + timedelta(days=60)) == 1
    assert PlaybookRule.objects.get(pk=live.pk).confidence == pytest.approx(0.2)
    assert PlaybookRule.objects.get(pk=gone.pk).confidence == 0.8


@pytest.mark.django_db
def test_the_beat_runs_the_decay_task_daily(settings: SettingsWrapper) -> None:
    from reflection.tasks import decay

    rule = rule_create(text="Keep commits small")
    PlaybookRule.objects.filter(pk=rule.pk).update(confidence=0.8, confidence_at=T0)
    assert decay() == 1
    assert PlaybookRule.objects.get(pk=rule.pk).confidence < 0.8
    entry = settings.CELERY_BEAT_SCHEDULE["reflection-decay"]
    assert (entry["task"], entry["schedule"]) == ("reflection.decay", 86400.0)
    from core.celery import app

    app.loader.import_default_modules()
    assert "reflection.decay" in app.tasks  # a worker finds it


@pytest.mark.django_db
def test_a_delta_is_decided_once() -> None:
    delta = delta_propose(op=DeltaOp.ADD, text="Pin the versions", labels=["deps"])
    delta_decide(delta.pk, to=DeltaStatus.REJECTED, by="op", reason="too vague")
    with pytest.raises(IllegalTransition):
        delta_decide(delta.pk, to=DeltaStatus.ACCEPTED, by="op")
    with pytest.raises(IllegalTransition):
        delta_decide(delta_propose(op=DeltaOp.ADD, text="x").pk, to=DeltaStatus.PROPOSED, by="op")
    assert not PlaybookRule.objects.exists()


@pytest.mark.django_db
def test_accepted_deltas_add_update_and_deprecate_rules() -> None:
    added = delta_decide(
        delta_propose(op=DeltaOp.ADD, text="Pin versions", labels=["deps"]).pk,
        to=DeltaStatus.ACCEPTED,
        by="op",
    )
    rule_id = added.rule_id
    assert rule_id is not None
    delta_decide(
        delta_propose(op=DeltaOp.UPDATE, rule_id=rule_id, text="Pin exact versions").pk,
        to=DeltaStatus.ACCEPTED,
        by="op",
    )
    assert PlaybookRule.objects.get(pk=rule_id).text == "Pin exact versions"
    delta_decide(
        delta_propose(op=DeltaOp.DEPRECATE, rule_id=rule_id).pk, to=DeltaStatus.ACCEPTED, by="op"
    )
    assert PlaybookRule.objects.get(pk=rule_id).maturity == "deprecated"


@pytest.mark.django_db
def test_it_refuses_an_update_without_its_rule() -> None:
    with pytest.raises(InvalidRule):
        delta_propose(op=DeltaOp.UPDATE, text="x")


@pytest.mark.django_db
def test_a_global_delta_applies_only_when_grounded() -> None:
    delta = delta_propose(op=DeltaOp.ADD, text="Never force-push", scope="global")
    with pytest.raises(IllegalTransition, match="needs grounding"):
        delta_decide(delta.pk, to=DeltaStatus.ACCEPTED, by="curator")
    assert PlaybookDelta.objects.get(pk=delta.pk).status == "proposed"
    grounded = delta_decide(delta.pk, to=DeltaStatus.GROUNDED, by="operator")
    assert grounded.rule_id is not None
    rule = PlaybookRule.objects.get(pk=grounded.rule_id)
    assert (rule.scope, rule.text, rule.maturity) == ("global", "Never force-push", "candidate")


@pytest.mark.django_db
def test_it_logs_a_maturity_change_only_when_the_maturity_moves(
    settings: SettingsWrapper, caplog: pytest.LogCaptureFixture
) -> None:
    settings.REFLECTION_PROMOTE_ESTABLISHED = (1, 0.0)
    settings.REFLECTION_PROMOTE_PROVEN = (100, 1.0)
    rule = rule_create(text="Read the failing test first")
    caplog.set_level("INFO", logger="reflection.services.playbook")

    assert rule_feedback(rule.pk, True).maturity == "established"
    assert [r.maturity for r in caplog.records] == ["established"]  # type: ignore[attr-defined]
    caplog.clear()

    assert rule_feedback(rule.pk, True).maturity == "established"  # no step
    assert rule_feedback(rule.pk, False).maturity == "established"
    assert caplog.records == []
