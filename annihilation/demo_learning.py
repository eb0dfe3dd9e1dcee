"""The demo's learning loop: what reflection made of the first wave, and a second wave whose
agents get what it learned.

In the first wave the coders of the quanta labelled `needs-tests` hand over without running the
tests and their testers fail them (psychonauts/scripts/needs-tests*.yaml); the demo's worker
blocks a quantum after one failed run, so they wait for the Tether. Reflection reads those
sessions after each burst, and its reflector (scripted offline) notes the lesson for the coder;
with its evidence it becomes a candidate playbook rule. The demo then reopens the blocked quanta
as the Tether would and runs a second wave: the rule is in the coders' prompts, they run the
tests, and the testers pass them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from django.core.management.base import OutputWrapper

from bursts.models import AgentRun, AgentStatus, Burst
from core.cli import shorten
from quanta.models import Quantum, QuantumStatus
from quanta.services import quantum_reopen
from reflection.models import PlaybookRule, ReflectionRun, ReflectionRunStatus, RuleUse

# The demo's worker blocks a quantum after its first failed run (instead of trying it again in
# the same wave), so that the lesson is learned between the two waves.
LEARNING_ENV = {"ANNIHILATION_MAX_FAILURES": "1"}
LESSON_LABEL = "needs-tests"
ENDED = (ReflectionRunStatus.COMPLETED, ReflectionRunStatus.ERROR)


def failed_stages(wave_id: int) -> int:
    """Failed agent attempts of the wave (every failed try of a stage counts)."""
    return AgentRun.objects.filter(
        quantum_run__wave_id=wave_id, depth=0, status=AgentStatus.ERROR
    ).count()


def reflection_wait(wave_id: int, *, timeout: float) -> list[ReflectionRun]:
    """The wave's reflection runs once each burst's has ended (or the timeout passed)."""
    bursts = Burst.objects.filter(wave_id=wave_id).count()
    deadline = time.monotonic() + timeout
    while True:
        runs = list(ReflectionRun.objects.filter(wave_id=wave_id).order_by("burst__number"))
        ended = [r for r in runs if r.status in ENDED]
        if len(ended) >= bursts or time.monotonic() > deadline:
            return runs
        time.sleep(0.2)


def print_reflection(
    out: OutputWrapper, wave_id: int, *, timeout: float, provider: str
) -> list[PlaybookRule]:
    """Each burst's reflection and the rules it added; returns those rules."""
    w = out.write
    w("")
    w(
        f"Reflection on wave {wave_id} (reflector: {provider}"
        + (
            ", a scripted stand-in for a model: it plays psychonauts/scripts/reflector.yaml"
            if provider == "scripted"
            else ""
        )
        + "):"
    )
    runs = reflection_wait(wave_id, timeout=timeout)
    for run in runs:
        c = run.counts
        w(
            f"  burst {run.burst.number if run.burst else '?'}: {run.status}"
            + (f" ({run.error})" if run.error else "")
            + f"; sessions read {c.get('sessions_read', 0)}, diary entries "
            f"{c.get('diary_entries', 0)}, proposals {c.get('proposed', 0)}: accepted "
            f"{c.get('accepted', 0)}, unsupported {c.get('unsupported', 0)}, duplicates "
            f"{c.get('duplicates', 0)}"
        )
    if not runs:
        w("  (no reflection ran: is a worker consuming the default queue?)")
    rules = list(
        PlaybookRule.objects.filter(deltas__reflection_run__in=runs).distinct().order_by("pk")
    )
    if rules:
        w("The playbook learned (each rule with its evidence; /playbook/ in the control room):")
    for rule in rules:
        w(
            f"  rule {rule.pk} [{rule.kind}, {rule.maturity}, confidence {rule.confidence:.2f}] "
            f"for {', '.join(rule.roles) or 'every role'}: {shorten(rule.text, 110)!r}"
        )
        agents = AgentRun.objects.filter(pk__in=rule.evidence_agent_run_ids).values_list(
            "agent_id", flat=True
        )
        w(
            f"    evidence: agent runs {', '.join(agents) or '-'}; events "
            f"{', '.join(f'#{e}' for e in rule.evidence_event_ids[:8]) or '-'}"
        )
    return rules


def reopen_blocked(ids: Sequence[int]) -> list[int]:
    """The Tether's part: the demo's blocked quanta open again, for the second wave."""
    reopened = []
    for quantum in Quantum.objects.filter(pk__in=ids, status=QuantumStatus.BLOCKED).order_by("pk"):
        quantum_reopen(quantum_id=quantum.pk, reason="the demo reopens it after reflection")
        reopened.append(quantum.pk)
    return reopened


def print_outcome(
    out: OutputWrapper, first: int, second: int, rules: Sequence[PlaybookRule]
) -> None:
    """Both waves' failed stages, and which agents of the second got the rules."""
    w = out.write
    w("")
    before, after = failed_stages(first), failed_stages(second)
    w(f"Failed stages: wave {first}: {before}; wave {second}: {after}")
    uses = list(
        RuleUse.objects.filter(rule__in=rules, agent_run__quantum_run__wave_id=second)
        .select_related("agent_run")
        .order_by("pk")
    )
    for use in uses:
        w(
            f"  rule {use.rule_id} was in the prompt of {use.agent_run.agent_id} "
            f"({use.outcome}): /agents/{use.agent_run_id}/ shows it"
        )
    if rules and not uses:
        w("  (no agent of the second wave was given the learned rules)")
