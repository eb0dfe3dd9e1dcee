"""Rule and skill selection at agent start with 10,000 playbook rules.

Times what an agent's prompt costs the playbook when the agent starts: the ranked rules for its
role and quantum (one indexed query, reflection.injection.rules_for) and the skill choice among
the matching skills (reflection.services.skills.skill_choose), p50/p95 over many agent runs on
quanta of varied text and labels. Target: p95 under 5 ms for the rules.

    .venv/bin/python bench/reflection.py [--calls 500] [--json]   (needs `make services`)
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._setup import django_bench_db, ms, pct

N_RULES = 10_000
N_SKILLS = 50
ROLES = ["coder", "tester", "reviewer", "planner"]
LABELS = [f"team{n}" for n in range(20)] + ["auth", "cache", "api", "schema", "ui"]
COMMON = ["auth", "cache", "api", "schema", "page", "login", "token", "session", "deploy",
          "queue", "worker", "index", "search", "test", "commit", "migration"]  # fmt: skip
RARE = [
    a + b + c
    for a in ("re", "de", "pro", "con", "ex", "in", "sub", "trans")
    for b in ("port", "form", "tract", "mit", "vert", "press", "duct", "scribe")
    for c in ("", "er", "ing", "ion", "al")
]
MATURITIES = ["candidate"] * 5 + ["established"] * 3 + ["proven", "deprecated"]


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(
        rng.choice(COMMON) if rng.random() < 0.4 else rng.choice(RARE) for _ in range(words)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=500, help="agent starts timed")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()

    django_bench_db("annihilation_bench_reflection")
    from django.conf import settings
    from django.db import connection

    from bursts.models import AgentRun
    from psychonauts.services import agent_run_create
    from quanta.services import quantum_create
    from reflection.injection import rules_for
    from reflection.models import PlaybookRule, Skill
    from reflection.services.skills import skill_choose

    rng = random.Random(11)
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE reflection_ruleuse, reflection_skilluse, reflection_skill, "
            "reflection_playbookdelta, reflection_playbookrule RESTART IDENTITY CASCADE"
        )
    PlaybookRule.objects.bulk_create(
        [
            PlaybookRule(
                text=sentence(rng, rng.randrange(6, 16)),
                roles=rng.sample(ROLES, 1) if rng.random() < 0.5 else [],
                labels=rng.sample(LABELS, rng.randrange(0, 3)),
                confidence=rng.random(),
                maturity=rng.choice(MATURITIES),
            )
            for _ in range(N_RULES)
        ],
        batch_size=2000,
    )
    Skill.objects.bulk_create(
        [
            Skill(
                name=f"skill{n}",
                template=sentence(rng, 30),
                roles=rng.sample(ROLES, 1) if rng.random() < 0.5 else [],
                labels=rng.sample(LABELS, 1) if rng.random() < 0.5 else [],
            )
            for n in range(N_SKILLS)
        ]
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE reflection_playbookrule; ANALYZE reflection_skill")
    runs: list[AgentRun] = []
    for n in range(args.calls):
        q = quantum_create(
            title=sentence(rng, 6),
            body=sentence(rng, 40),
            labels=rng.sample(LABELS, rng.randrange(0, 3)),
        )
        run = agent_run_create(quantum_id=q.pk, role=rng.choice(ROLES), agent_id=f"bench{n}")
        runs.append(AgentRun.objects.select_related("quantum").get(pk=run.pk))

    for run in runs[:20]:  # warm the connection and the plan cache
        rules_for(run)
    rule_samples, injected = [], 0
    for run in runs:
        start = time.perf_counter()
        injected += len(rules_for(run))
        rule_samples.append(time.perf_counter() - start)
    skill_samples = []
    for run in runs:
        start = time.perf_counter()
        skill_choose(agent_run_id=run.pk, role=run.role, labels=list(run.quantum.labels))
        skill_samples.append(time.perf_counter() - start)

    figures = {
        "rules": N_RULES,
        "skills": N_SKILLS,
        "calls": len(runs),
        "top_k": settings.REFLECTION_INJECT_TOP_K,
        "rules_injected_mean": injected / len(runs),
        "rules_p50_ms": pct(rule_samples, 50) * 1000,
        "rules_p95_ms": pct(rule_samples, 95) * 1000,
        "skill_p50_ms": pct(skill_samples, 50) * 1000,
        "skill_p95_ms": pct(skill_samples, 95) * 1000,
        "target_rules_p95_ms": 5.0,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"playbook: {N_RULES:,} rules, {N_SKILLS} skills; {len(runs)} agent starts")
    print(
        f"rule selection (top {settings.REFLECTION_INJECT_TOP_K}, "
        f"{figures['rules_injected_mean']:.1f} injected on average): "
        f"p50 {ms(pct(rule_samples, 50))}  p95 {ms(pct(rule_samples, 95))}  (target p95 < 5 ms)"
    )
    print(
        f"skill choice ({settings.REFLECTION_SKILL_POLICY}, recorded): "
        f"p50 {ms(pct(skill_samples, 50))}  p95 {ms(pct(skill_samples, 95))}"
    )


if __name__ == "__main__":
    main()
