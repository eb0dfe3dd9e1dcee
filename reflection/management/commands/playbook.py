"""`manage.py playbook list|show|add|deprecate|export|import`: the rules the agents learn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser

from core.cli import USAGE_ERROR, SafeCommand, emit_json, parse_id, shorten, subcommands, table
from reflection.errors import InvalidRule, NotFound
from reflection.models import PlaybookDelta, PlaybookRule, RuleKind, RuleMaturity, RuleScope
from reflection.selectors import rule_deltas, rule_get, rules_list
from reflection.services.playbook import rule_create
from reflection.services.playbook_io import (
    ImportFailed,
    playbook_export,
    playbook_import,
    rule_deprecate,
)

CLI_AUTHOR = "cli"


def rule_json(rule: PlaybookRule) -> dict[str, Any]:
    return {
        "id": rule.pk,
        "text": rule.text,
        "kind": rule.kind,
        "scope": rule.scope,
        "maturity": rule.maturity,
        "confidence": rule.confidence,
        "helpful": rule.helpful,
        "harmful": rule.harmful,
        "roles": list(rule.roles),
        "labels": list(rule.labels),
        "paths": list(rule.paths),
        "evidence_event_ids": list(rule.evidence_event_ids),
        "evidence_agent_run_ids": list(rule.evidence_agent_run_ids),
        "created_by": rule.created_by,
        "created_at": rule.created_at,
        "last_feedback_at": rule.last_feedback_at,
    }


def delta_json(delta: PlaybookDelta) -> dict[str, Any]:
    return {
        "id": delta.pk,
        "op": delta.op,
        "status": delta.status,
        "scope": delta.scope,
        "text": delta.text,
        "reason": delta.reason,
        "decided_by": delta.decided_by,
        "decided_at": delta.decided_at,
        "created_at": delta.created_at,
    }


class Command(SafeCommand):
    help = (
        "The playbook: list, show, add, deprecate, export, import. Every subcommand takes --json."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add = subcommands(parser)
        p = add("list", "the rules, by maturity and confidence")
        p.add_argument("--maturity", choices=RuleMaturity.values)
        p = add("show", "one rule with its deltas and evidence")
        p.add_argument("rule", type=parse_id)
        p = add("add", "add a rule (a candidate)")
        p.add_argument("text")
        p.add_argument("--kind", choices=RuleKind.values, default=RuleKind.RULE)
        p.add_argument("--scope", choices=RuleScope.values, default=RuleScope.PROJECT)
        p.add_argument("--role", action="append", default=[], dest="roles")
        p.add_argument("--label", action="append", default=[], dest="labels")
        p = add("deprecate", "deprecate a rule")
        p.add_argument("rule", type=parse_id)
        p.add_argument("--reason", default="")
        p = add("export", "every rule, in the format import reads")
        p.add_argument("--format", choices=["yaml", "jsonl"], default="yaml", dest="fmt")
        p = add("import", "add the rules of a file: all or nothing")
        p.add_argument("file", type=Path)

    def handle(self, *args: Any, **options: Any) -> None:
        handler = getattr(self, "do_" + options["subcommand"])
        try:
            handler(options)
        except NotFound as exc:
            raise CommandError(str(exc)) from None
        except InvalidRule as exc:  # what was typed cannot be a rule: a usage error
            raise CommandError(str(exc), returncode=USAGE_ERROR) from None
        except ImportFailed as exc:
            if options["json"]:
                emit_json(self.stdout, {"imported": 0, "errors": exc.problems})
            else:
                for problem in exc.problems:
                    self.stderr.write(problem)
            raise CommandError(f"{len(exc.problems)} problem(s): nothing imported") from None

    def do_list(self, o: dict[str, Any]) -> None:
        rules = rules_list(maturity=o["maturity"], limit=10_000)
        if o["json"]:
            emit_json(self.stdout, [rule_json(r) for r in rules])
            return
        table(
            self.stdout,
            ["ID", "MATURITY", "CONF", "+", "-", "SCOPE", "KIND", "TEXT"],
            [
                (r.pk, r.maturity, f"{r.confidence:.2f}", r.helpful, r.harmful, r.scope,
                 r.kind, shorten(r.text, 60))
                for r in rules
            ],
        )  # fmt: skip

    def do_show(self, o: dict[str, Any]) -> None:
        rule = rule_get(rule_id=o["rule"])
        deltas = rule_deltas(rule_id=rule.pk)
        if o["json"]:
            emit_json(self.stdout, {**rule_json(rule), "deltas": [delta_json(d) for d in deltas]})
            return
        out = self.stdout
        out.write(f"rule #{rule.pk} [{rule.maturity}] {rule.kind}, {rule.scope}")
        out.write(rule.text)
        out.write(
            f"confidence {rule.confidence:.3f} · helpful {rule.helpful} · harmful {rule.harmful}"
        )
        out.write(
            f"roles: {', '.join(rule.roles) or 'any'} · labels: {', '.join(rule.labels) or 'any'}"
        )
        out.write(
            "evidence: agent runs "
            + (", ".join(map(str, rule.evidence_agent_run_ids)) or "none")
            + " · events "
            + (", ".join(map(str, rule.evidence_event_ids)) or "none")
        )
        for d in deltas:
            out.write(f"delta #{d.pk} {d.op} [{d.status}] {shorten(d.reason, 60)}")

    def do_add(self, o: dict[str, Any]) -> None:
        rule = rule_create(
            text=o["text"], kind=o["kind"], scope=o["scope"], roles=o["roles"],
            labels=o["labels"], created_by=CLI_AUTHOR,
        )  # fmt: skip
        if o["json"]:
            emit_json(self.stdout, rule_json(rule))
        else:
            self.stdout.write(f"rule #{rule.pk} added ({rule.maturity})")

    def do_deprecate(self, o: dict[str, Any]) -> None:
        rule = rule_deprecate(rule_id=o["rule"], by=CLI_AUTHOR, reason=o["reason"])
        if o["json"]:
            emit_json(self.stdout, rule_json(rule))
        else:
            self.stdout.write(f"rule #{rule.pk} deprecated")

    def do_export(self, o: dict[str, Any]) -> None:
        rules = rules_list(limit=1_000_000)
        text = playbook_export(rules, fmt=o["fmt"])
        if o["json"]:
            emit_json(self.stdout, {"format": o["fmt"], "count": len(rules), "text": text})
        else:
            self.stdout.write(text, ending="")

    def do_import(self, o: dict[str, Any]) -> None:
        report = playbook_import(o["file"], by=CLI_AUTHOR)
        if o["json"]:
            emit_json(
                self.stdout,
                {
                    "imported": len(report.created),
                    "ids": [r.pk for r in report.created],
                    "updated": [r.pk for r in report.updated],
                    "unchanged": [r.pk for r in report.unchanged],
                    "deprecated": [r.pk for r in report.deprecated],
                },
            )
        else:
            self.stdout.write(report.describe())
