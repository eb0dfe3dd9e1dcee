"""The playbook in and out of files, and the operator's own changes, through the playbook's
writer (reflection.services.playbook).

A file holds a list of rules (or `rules:` followed by one) in YAML, or one JSON object per line
(`.jsonl`). A rule: `text` (required), `kind` rule | anti_pattern, `scope` project | global,
`roles`, `labels`, `paths` (lists of text). `playbook export` writes the same format. Import is
all or nothing: every problem is reported as `file:line: field: why` and nothing is written.

A rule's key is its kind, scope and text (case and runs of spaces aside): importing a rule the
playbook has already updates its roles, labels and paths (a grounded `update` delta, in its
history) and keeps what the playbook learned about it: its confidence and maturity. A deprecated
rule stays deprecated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from django.db import transaction

from core.records import records_read
from core.safetext import text_problem
from core.safeyaml import InputRefused, LineMap, source_name
from reflection.errors import ReflectionError
from reflection.models import (
    DeltaOp,
    DeltaStatus,
    PlaybookRule,
    RuleKind,
    RuleMaturity,
    RuleScope,
)
from reflection.services.playbook import delta_decide, delta_propose, rule_create

LIST_FIELDS = ("roles", "labels", "paths")
KNOWN_FIELDS = frozenset({"text", "kind", "scope", *LIST_FIELDS})
NOT_A_LIST = "rules: expected a list of rules (or 'rules:' and a list)"


class ImportFailed(ReflectionError):
    """A playbook file with problems: each `file:line: field: why`."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


def rule_data(rule: PlaybookRule) -> dict[str, Any]:
    """A rule as export writes it (and import reads it back)."""
    return {
        "text": rule.text,
        "kind": rule.kind,
        "scope": rule.scope,
        "roles": list(rule.roles),
        "labels": list(rule.labels),
        "paths": list(rule.paths),
    }


def playbook_export(rules: list[PlaybookRule], *, fmt: str) -> str:
    data = [rule_data(r) for r in rules]
    if fmt == "jsonl":
        return "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in data)
    return yaml.safe_dump({"rules": data}, sort_keys=False, allow_unicode=True)


def _check(name: str, line: int, raw: Any, problems: list[str]) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        problems.append(f"{name}:{line}: rule: must be a mapping, got {type(raw).__name__}")
        return None
    lines: dict[str, int] = raw.lines if isinstance(raw, LineMap) else {}
    before = len(problems)

    def bad(key: str, why: str) -> None:
        problems.append(f"{name}:{lines.get(key, line)}: {key}: {why}")

    for key in raw:
        if key not in KNOWN_FIELDS:
            bad(str(key)[:60], "unknown field")
    text = raw.get("text")
    if text is None:
        bad("text", "required")
    elif not isinstance(text, str) or not text.strip():
        bad("text", "must be non-empty text")
    elif (problem := text_problem(text)) is not None:
        bad("text", problem)
    if raw.get("kind", RuleKind.RULE) not in RuleKind.values:
        bad("kind", f"must be one of {', '.join(RuleKind.values)}")
    if raw.get("scope", RuleScope.PROJECT) not in RuleScope.values:
        bad("scope", f"must be one of {', '.join(RuleScope.values)}")
    for key in LIST_FIELDS:
        value = raw.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            bad(key, "must be a list of non-empty text")
        elif any(len(v) > (500 if key == "paths" else 64) for v in value):
            bad(key, "an item is too long")
    if len(problems) > before:
        return None
    return {
        "text": text,
        "kind": raw.get("kind", RuleKind.RULE),
        "scope": raw.get("scope", RuleScope.PROJECT),
        **{key: list(raw.get(key, [])) for key in LIST_FIELDS},
    }


def rule_key(*, kind: str, scope: str, text: str) -> tuple[str, str, str]:
    """What makes two rules the same rule for an import."""
    return kind, scope, " ".join(text.split()).casefold()


@dataclass
class PlaybookImport:
    """What an import did, rule by rule (each list in file order)."""

    created: list[PlaybookRule] = field(default_factory=list)
    updated: list[PlaybookRule] = field(default_factory=list)
    unchanged: list[PlaybookRule] = field(default_factory=list)
    deprecated: list[PlaybookRule] = field(default_factory=list)  # found, and left deprecated

    def describe(self) -> str:
        text = (
            f"{len(self.created)} rule(s) created, {len(self.updated)} updated, "
            f"{len(self.unchanged)} unchanged"
        )
        if self.deprecated:
            ids = ", ".join(f"#{r.pk}" for r in self.deprecated)
            text += f"; {len(self.deprecated)} already deprecated and left so ({ids})"
        return text


def playbook_import(path: Path, *, by: str) -> PlaybookImport:
    """Every rule of the file, created or found again (see the module's docstring), in one
    transaction; ImportFailed (nothing written) when any record has a problem."""
    name = source_name(path)
    try:
        records = records_read(path, key="rules", not_a_list=NOT_A_LIST)
    except InputRefused as exc:
        raise ImportFailed([exc.where(name)]) from None
    problems: list[str] = []
    checked = [_check(name, line, raw, problems) for line, raw in records]
    if problems:
        raise ImportFailed(problems)
    report = PlaybookImport()
    with transaction.atomic():
        known: dict[tuple[str, str, str], PlaybookRule] = {}
        for have in PlaybookRule.objects.select_for_update().order_by("pk"):
            known.setdefault(rule_key(kind=have.kind, scope=have.scope, text=have.text), have)
        for fields in checked:
            if fields is None:
                continue
            key = rule_key(kind=fields["kind"], scope=fields["scope"], text=fields["text"])
            rule = known.get(key)
            if rule is None:
                known[key] = rule = rule_create(**fields, created_by=by)
                report.created.append(rule)
            elif rule.maturity == RuleMaturity.DEPRECATED:
                report.deprecated.append(rule)
            elif any(list(getattr(rule, k)) != fields[k] for k in LIST_FIELDS):
                delta = delta_propose(
                    op=DeltaOp.UPDATE,
                    rule_id=rule.pk,
                    text=rule.text,
                    kind=rule.kind,
                    scope=rule.scope,
                    **{k: fields[k] for k in LIST_FIELDS},
                    reason=f"imported from {name} by {by}",
                )
                delta_decide(delta.pk, to=DeltaStatus.GROUNDED, by=by, reason="import")
                rule.refresh_from_db()
                report.updated.append(rule)
            else:
                report.unchanged.append(rule)
    return report


@transaction.atomic
def rule_deprecate(*, rule_id: int, by: str, reason: str = "") -> PlaybookRule:
    """The operator deprecates a rule: a `deprecate` delta, grounded at once, so the rule's
    history shows who did it and why."""
    delta = delta_propose(op=DeltaOp.DEPRECATE, rule_id=rule_id, reason=reason or f"by {by}")
    delta_decide(delta.pk, to=DeltaStatus.GROUNDED, by=by, reason=reason)
    return PlaybookRule.objects.get(pk=rule_id)
