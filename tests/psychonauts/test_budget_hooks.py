"""The runtime's budget hooks: gates asked before every model call, recorders told what each
call cost; and scripts that report a turn's usage."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from bursts.models import AgentStatus
from psychonauts.errors import BudgetExceeded, InvalidDefinition
from psychonauts.models import Usage
from psychonauts.routing.providers.scripted import script_parse
from psychonauts.runtime.budget import (
    SPEND_GATES,
    SPEND_RECORDERS,
    CallCheck,
    CallSpend,
    cost_usd,
)
from psychonauts.runtime.execute import agent_run_execute

pytestmark = pytest.mark.django_db(transaction=True)

REPORTED = """
name: reported
match: {labels: [reported]}
turns:
  - text: "Looking."
    tools:
      - list_dir: {path: "."}
    usage: {input_tokens: 1200, output_tokens: 300, model: claude-sonnet-4-6}
  - text: "Done."
    usage: {output_tokens: 10}
"""


@pytest.fixture
def seen() -> Iterator[tuple[list[CallCheck], list[CallSpend]]]:
    checks: list[CallCheck] = []
    spends: list[CallSpend] = []
    with (
        SPEND_GATES.replaced(*SPEND_GATES, checks.append),
        SPEND_RECORDERS.replaced(*SPEND_RECORDERS, spends.append),
    ):
        yield checks, spends


def test_it_asks_the_gates_before_each_call_and_tells_the_recorders_its_cost(
    repo: Path,
    scripts: Callable[[str, str], None],
    make_run,
    make_quantum,
    seen: tuple[list[CallCheck], list[CallSpend]],
) -> None:
    scripts("reported", REPORTED)
    run = make_run("coder", quantum=make_quantum(labels=["reported", "team:a"]))

    assert agent_run_execute(agent_run_id=run.pk).status == "done"

    checks, spends = seen
    assert [(c.agent_run_id, c.labels, c.model) for c in checks] == [
        (run.pk, ("reported", "team:a"), "scripted")
    ] * 2
    assert [(s.model, s.tokens_in, s.tokens_out, s.usd) for s in spends] == [
        ("claude-sonnet-4-6", 1200, 300, cost_usd("claude-sonnet-4-6", 1200, 300)),
        ("scripted", 0, 10, Decimal(0)),
    ]
    usage = Usage.objects.filter(agent_run=run).order_by("pk").first()
    assert usage is not None and usage.cost_usd == Decimal("0.008100")


def test_a_gate_that_refuses_ends_the_run_before_the_call(
    repo: Path, scripts: Callable[[str, str], None], make_run, make_quantum
) -> None:
    scripts("reported", REPORTED)
    run = make_run("coder", quantum=make_quantum(labels=["reported"]))

    def refuse(check: CallCheck) -> None:
        raise BudgetExceeded(f"budget: no more calls for run {check.agent_run_id}")

    with SPEND_GATES.replaced(*SPEND_GATES, refuse):
        outcome = agent_run_execute(agent_run_id=run.pk)

    assert (outcome.status, outcome.error) == ("error", f"budget: no more calls for run {run.pk}")
    run.refresh_from_db()
    assert run.status == AgentStatus.ERROR
    assert not Usage.objects.filter(agent_run=run).exists()


def test_it_names_a_bad_usage_in_a_script(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: bad\nturns:\n  - text: hi\n    usage: {output_tokens: -1}\n", encoding="utf-8"
    )
    with pytest.raises(
        InvalidDefinition, match=r"bad\.yaml:4: turns\.0\.usage\.output_tokens: a number"
    ):
        script_parse(bad)
    bad.write_text("name: bad\nturns:\n  - text: hi\n    usage: {cost: 1}\n", encoding="utf-8")
    with pytest.raises(InvalidDefinition, match="unknown key 'cost'"):
        script_parse(bad)
