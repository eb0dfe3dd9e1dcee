"""`manage.py skills list|add|rank`: the prompt templates chosen by their record."""

from __future__ import annotations

from typing import Any, cast

from django.conf import settings
from django.core.management.base import CommandError, CommandParser
from django.db import IntegrityError

from core.cli import USAGE_ERROR, SafeCommand, emit_json, subcommands, table
from reflection.models import Skill
from reflection.selection import Policy
from reflection.selectors import SkillRow, skills_list, skills_ranked
from reflection.services.skills import skill_create

NAME_MAX = 200


def skill_json(row: SkillRow, *, score: bool = False) -> dict[str, Any]:
    s = row.skill
    data: dict[str, Any] = {
        "id": s.pk,
        "name": s.name,
        "roles": list(s.roles),
        "labels": list(s.labels),
        "alpha": s.alpha,
        "beta": s.beta,
        "posterior_mean": row.posterior_mean,
        "uses": s.uses,
        "last_used_at": s.last_used_at,
    }
    if score:
        # An unused skill's UCB1 score is infinite: JSON has no infinity, null stands for it.
        data["score"] = row.score if row.score != float("inf") else None
    return data


class Command(SafeCommand):
    help = "Skills: list, add, rank. Every subcommand takes --json."

    def add_arguments(self, parser: CommandParser) -> None:
        add = subcommands(parser)
        add("list", "every skill with its record")
        p = add("add", "add a skill")
        p.add_argument("name")
        p.add_argument("--template", required=True)
        p.add_argument("--role", action="append", default=[], dest="roles")
        p.add_argument("--label", action="append", default=[], dest="labels")
        p = add("rank", "the matching skills, best first by the configured policy's score")
        p.add_argument("--role")
        p.add_argument("--label", action="append", default=[], dest="labels")

    def handle(self, *args: Any, **options: Any) -> None:
        getattr(self, "do_" + options["subcommand"])(options)

    def _rows(self, rows: list[SkillRow], *, score: bool = False) -> None:
        headers = ["ID", "NAME", "ALPHA", "BETA", "MEAN", "USES", "ROLES", "LABELS"]
        table(
            self.stdout,
            headers + (["SCORE"] if score else []),
            [
                [r.skill.pk, r.skill.name, f"{r.skill.alpha:g}", f"{r.skill.beta:g}",
                 f"{r.posterior_mean:.3f}", r.skill.uses, ",".join(r.skill.roles) or "any",
                 ",".join(r.skill.labels) or "any"] + ([f"{r.score:.3f}"] if score else [])
                for r in rows
            ],
        )  # fmt: skip

    def do_list(self, o: dict[str, Any]) -> None:
        rows = skills_list(limit=100_000)
        if o["json"]:
            emit_json(self.stdout, [skill_json(r) for r in rows])
        else:
            self._rows(rows)

    def do_add(self, o: dict[str, Any]) -> None:
        name, template = o["name"].strip(), o["template"]
        if not name or len(name) > NAME_MAX:
            raise CommandError(f"name: 1 to {NAME_MAX} characters", returncode=USAGE_ERROR)
        if not template.strip():
            raise CommandError("--template: must not be empty", returncode=USAGE_ERROR)
        if Skill.objects.filter(name=name).exists():
            raise CommandError(f"a skill named {name!r} exists already")
        try:
            skill = skill_create(name=name, template=template, roles=o["roles"], labels=o["labels"])
        except IntegrityError:  # added meanwhile by someone else
            raise CommandError(f"a skill named {name!r} exists already") from None
        row = SkillRow(skill, skill.alpha / (skill.alpha + skill.beta), 0.0)
        if o["json"]:
            emit_json(self.stdout, skill_json(row))
        else:
            self.stdout.write(f"skill #{skill.pk} {skill.name} added")

    def do_rank(self, o: dict[str, Any]) -> None:
        policy = cast(Policy, settings.REFLECTION_SKILL_POLICY)
        rows = skills_ranked(policy=policy, role=o["role"], labels=o["labels"])
        if o["json"]:
            emit_json(
                self.stdout, {"policy": policy, "skills": [skill_json(r, score=True) for r in rows]}
            )
        else:
            self.stdout.write(f"policy: {policy}")
            self._rows(rows, score=True)
