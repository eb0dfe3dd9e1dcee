"""`manage.py quanta <subcommand>`: everything an operator does to quanta, from a terminal."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, cast

from django.core.management.base import CommandError, CommandParser

from core.cli import (
    USAGE_ERROR,
    SafeCommand,
    emit_json,
    parse_id,
    positive_int,
    shorten,
    subcommands,
    table,
)
from quanta import search, selectors, serializers, services
from quanta.complexity import complexity_classify
from quanta.errors import ImportFailed, InvalidQuantum, QuantaError
from quanta.fields import COMPLEXITY_AUTO
from quanta.importer import quanta_import_report
from quanta.models import (
    Comment,
    Complexity,
    Dependency,
    DependencyKind,
    Quantum,
    QuantumKind,
    QuantumStatus,
)
from quanta.serializers import comment_data, dependency_data, quantum_data, why_data
from repos.errors import RepositoryError
from repos.selectors import repository_get


def _priority(value: str) -> int:
    if not value.isdigit() or not 0 <= int(value) <= 4:
        raise argparse.ArgumentTypeError(f"{value!r}: priority is 0..4 (0 = critical)")
    return int(value)


def _complexity(quantum: Quantum) -> str:
    """`standard`, or `standard (auto: 48 words; names 2 files)` when the classifier set it."""
    if not quantum.complexity_auto:
        return quantum.complexity
    return f"{quantum.complexity} (auto: {_reasons(quantum)})"


def _reasons(quantum: Quantum) -> str:
    return complexity_classify(quantum.title, quantum.body).summary


class Command(SafeCommand):
    help = "Create, inspect and change quanta (units of work). Every subcommand takes --json."

    def add_arguments(self, parser: CommandParser) -> None:
        add = subcommands(parser)

        def fields(p: argparse.ArgumentParser, *, create: bool) -> None:
            p.add_argument("--body")
            p.add_argument("--kind", choices=QuantumKind.values)
            p.add_argument("--priority", type=_priority, help="0 (critical) .. 4")
            p.add_argument(
                "--label",
                action="append",
                dest="labels",
                metavar="LABEL",
                help="repeatable" + ("" if create else "; replaces the labels"),
            )
            p.add_argument("--pipeline", help="pipeline override by name")
            p.add_argument("--acceptance", help="acceptance criteria")
            p.add_argument(
                "--verify",
                action="append",
                dest="verify_commands",
                metavar="CMD",
                help="a command that checks the work (repeatable"
                + (")" if create else "; replaces the commands)"),
            )
            p.add_argument(
                "--complexity",
                choices=[*Complexity.values, COMPLEXITY_AUTO],
                help="auto: classified from the title and body"
                + (" (the default)" if create else ""),
            )
            p.add_argument("--parent", type=parse_id)

        p = add("create", "create a quantum")
        p.add_argument("title")
        fields(p, create=True)
        p.add_argument("--depends-on", type=parse_id, action="append", default=[], metavar="ID")
        p.add_argument("--repository", metavar="NAME", help="its repository (default: the default)")

        p = add("list", "list quanta")
        p.add_argument("--status", choices=QuantumStatus.values)
        p.add_argument("--label")
        p.add_argument("--priority", type=_priority)
        p.add_argument("--parent", type=parse_id)
        p.add_argument("--limit", type=positive_int, default=200)

        p = add("show", "one quantum with its dependencies, comments and readiness")
        p.add_argument("id", type=parse_id)

        p = add("update", "change fields of a quantum (not its status)")
        p.add_argument("id", type=parse_id)
        p.add_argument("--title")
        fields(p, create=False)
        p.add_argument("--no-parent", action="store_true", help="remove the parent")

        p = add("close", "close a quantum")
        p.add_argument("id", type=parse_id)
        p.add_argument("--reason", required=True)

        p = add("reopen", "reopen a closed, deferred or blocked quantum")
        p.add_argument("id", type=parse_id)
        p.add_argument("--reason", default="")

        p = add("defer", "set a quantum aside (not ready until reopened)")
        p.add_argument("id", type=parse_id)

        p = add("dep", "add or remove a dependency")
        p.add_argument("action", choices=["add", "rm"])
        p.add_argument("id", type=parse_id, help="the quantum that waits")
        p.add_argument("depends_on", type=parse_id, help="the quantum it waits on")
        p.add_argument("--kind", choices=DependencyKind.values, default=DependencyKind.BLOCKS)

        p = add("comment", "comment on a quantum")
        p.add_argument("id", type=parse_id)
        p.add_argument("text")
        p.add_argument("--author", default="operator")

        p = add("ready", "the ready set, in the order a burst takes it")
        p.add_argument("--label", action="append", dest="labels", default=[])
        p.add_argument("--limit", type=positive_int)

        p = add("blocked", "what cannot start, and why")
        p.add_argument("--limit", type=positive_int, default=100)

        p = add("search", 'full-text search: words, "phrases", OR, -exclude, prefix*')
        p.add_argument("query")
        p.add_argument("--limit", type=positive_int, default=50)

        p = add("import", "import quanta from YAML or JSON lines (all or nothing)")
        p.add_argument("file", type=Path)

        p = add("export", "export quanta in the import format")
        p.add_argument("--status", choices=QuantumStatus.values)
        p.add_argument("--format", choices=serializers.EXPORT_FORMATS, default="yaml")

    def handle(self, *args: Any, **options: Any) -> None:
        handler = getattr(self, "do_" + options["subcommand"])
        try:
            handler(options)
        except ImportFailed as exc:
            problems = exc.problems
            if len(problems) == 1:
                raise CommandError(f"import failed, nothing written: {problems[0]}") from None
            head = f"import failed, nothing written ({len(problems)} problems):"
            raise CommandError("\n".join([head, *(f"  {p}" for p in problems[:50])])) from None
        except InvalidQuantum as exc:  # a value given on the command line: a usage error
            raise CommandError(str(exc), returncode=USAGE_ERROR) from None
        except (QuantaError, RepositoryError) as exc:
            raise CommandError(str(exc)) from None

    # --- output ------------------------------------------------------------------------------

    def _list(self, quanta: list[Quantum], options: dict[str, Any]) -> None:
        if options["json"]:
            emit_json(self.stdout, [quantum_data(q) for q in quanta])
            return
        table(
            self.stdout,
            ["ID", "P", "STATUS", "KIND", "TITLE", "LABELS"],
            [
                (q.pk, q.priority, q.status, q.kind, shorten(q.title, 60), ",".join(q.labels))
                for q in quanta
            ],
        )

    def _one(self, quantum: Quantum, options: dict[str, Any], verb: str) -> None:
        if options["json"]:
            emit_json(self.stdout, quantum_data(quantum))
        else:
            self.stdout.write(f"{verb} #{quantum.pk} {quantum.title!r} [{quantum.status}]")

    # --- subcommands -------------------------------------------------------------------------

    def do_create(self, o: dict[str, Any]) -> None:
        values = {
            k: o[k]
            for k in ("body", "kind", "priority", "pipeline", "acceptance", "complexity")
            if o[k] is not None
        }
        quantum = services.quantum_create(
            repository_id=repository_get(name=o["repository"]).pk if o["repository"] else None,
            title=o["title"],
            labels=o["labels"] or [],
            verify_commands=o["verify_commands"] or [],
            parent_id=o["parent"],
            depends_on=o["depends_on"],
            **values,
        )
        self._one(quantum, o, "created")

    def do_list(self, o: dict[str, Any]) -> None:
        qs = selectors.quanta_list(
            status=o["status"], label=o["label"], priority=o["priority"], parent_id=o["parent"]
        )
        self._list(list(qs[: o["limit"]]), o)

    def do_show(self, o: dict[str, Any]) -> None:
        quantum = selectors.quantum_get(quantum_id=o["id"])
        deps = list(
            Dependency.objects.filter(quantum=quantum).select_related("depends_on").order_by("id")
        )
        dependents = list(
            Dependency.objects.filter(depends_on=quantum).select_related("quantum").order_by("id")
        )
        comments = list(Comment.objects.filter(quantum=quantum).order_by("created_at", "id"))
        why = selectors.quantum_why_not_ready(quantum_id=quantum.pk)
        if o["json"]:
            emit_json(
                self.stdout,
                {
                    **quantum_data(quantum),
                    "complexity_auto": quantum.complexity_auto,
                    "complexity_reasons": _reasons(quantum) if quantum.complexity_auto else "",
                    "dependencies": [dependency_data(d) for d in deps],
                    "dependents": [dependency_data(d) for d in dependents],
                    "comments": [comment_data(c) for c in comments],
                    "readiness": why_data(why),
                },
            )
            return
        w = self.stdout.write
        w(f"#{quantum.pk} {quantum.title}")
        w(
            f"  status {quantum.status} · {quantum.kind} · priority {quantum.priority}"
            f" · {_complexity(quantum)}"
        )
        if quantum.labels:
            w(f"  labels: {', '.join(quantum.labels)}")
        if quantum.parent_id:
            w(f"  parent: #{quantum.parent_id}")
        if quantum.pipeline:
            w(f"  pipeline: {quantum.pipeline}")
        if quantum.close_reason:
            w(f"  closed: {quantum.close_reason}")
        if quantum.body:
            w("")
            w(quantum.body)
        if quantum.acceptance or quantum.verify_commands:
            w("")
            w(f"acceptance: {quantum.acceptance}")
            for cmd in quantum.verify_commands:
                w(f"  verify: {cmd}")
        for title, edges, attr in (
            ("depends on", deps, "depends_on"),
            ("depended on by", dependents, "quantum"),
        ):
            if edges:
                w("")
                w(f"{title}:")
                for d in edges:
                    other = getattr(d, attr)
                    w(f"  {d.kind:<16} #{other.pk} {shorten(other.title, 60)} [{other.status}]")
        if comments:
            w("")
            w("comments:")
            for c in comments:
                w(f"  {c.created_at:%Y-%m-%d %H:%M} {c.author} ({c.author_kind}): {c.body}")
        w("")
        w(why.describe())

    def do_update(self, o: dict[str, Any]) -> None:
        keys = (
            "title",
            "body",
            "kind",
            "priority",
            "labels",
            "pipeline",
            "acceptance",
            "verify_commands",
            "complexity",
        )
        changes = cast(services.QuantumChanges, {k: o[k] for k in keys if o[k] is not None})
        quantum = services.quantum_update(
            quantum_id=o["id"], changes=changes, parent_id=o["parent"], clear_parent=o["no_parent"]
        )
        self._one(quantum, o, "updated")

    def do_close(self, o: dict[str, Any]) -> None:
        self._one(services.quantum_close(quantum_id=o["id"], reason=o["reason"]), o, "closed")

    def do_reopen(self, o: dict[str, Any]) -> None:
        self._one(services.quantum_reopen(quantum_id=o["id"], reason=o["reason"]), o, "reopened")

    def do_defer(self, o: dict[str, Any]) -> None:
        self._one(services.quantum_defer(quantum_id=o["id"]), o, "deferred")

    def do_dep(self, o: dict[str, Any]) -> None:
        ids = {"quantum_id": o["id"], "depends_on_id": o["depends_on"], "kind": o["kind"]}
        if o["action"] == "add":
            services.dependency_add(**ids)
        else:
            services.dependency_remove(**ids)
        if o["json"]:
            emit_json(self.stdout, {"action": o["action"], **ids})
        else:
            verb = "now" if o["action"] == "add" else "no longer"
            self.stdout.write(f"#{o['id']} {verb} depends on #{o['depends_on']} ({o['kind']})")

    def do_comment(self, o: dict[str, Any]) -> None:
        comment = services.comment_add(quantum_id=o["id"], body=o["text"], author=o["author"])
        if o["json"]:
            emit_json(self.stdout, comment_data(comment))
        else:
            self.stdout.write(f"commented on #{o['id']}")

    def do_ready(self, o: dict[str, Any]) -> None:
        self._list(list(selectors.quanta_ready(labels=o["labels"], limit=o["limit"])), o)

    def do_blocked(self, o: dict[str, Any]) -> None:
        quanta = list(selectors.quanta_blocked(limit=o["limit"]))
        whys = [selectors.quantum_why_not_ready(quantum_id=q.pk) for q in quanta]
        if o["json"]:
            emit_json(self.stdout, [why_data(w) for w in whys])
            return
        if not whys:
            self.stdout.write("nothing is blocked")
        for why in whys:
            self.stdout.write(why.describe())

    def do_search(self, o: dict[str, Any]) -> None:
        hits = search.quanta_search(query=o["query"], limit=o["limit"])
        if o["json"]:
            emit_json(self.stdout, [{**quantum_data(h.quantum), "rank": h.rank} for h in hits])
            return
        table(
            self.stdout,
            ["ID", "RANK", "STATUS", "TITLE"],
            [
                (h.quantum.pk, f"{h.rank:.3f}", h.quantum.status, shorten(h.quantum.title, 70))
                for h in hits
            ],
        )

    def do_import(self, o: dict[str, Any]) -> None:
        report = quanta_import_report(path=o["file"])
        if o["json"]:
            emit_json(
                self.stdout,
                {
                    "imported": len(report.ids),
                    "ids": report.ids,
                    "created": report.created,
                    "updated": report.updated,
                    "unchanged": report.unchanged,
                },
            )
        else:
            self.stdout.write(report.describe())

    def do_export(self, o: dict[str, Any]) -> None:
        fmt = "jsonl" if o["json"] else o["format"]
        self.stdout.write(serializers.quanta_export(status=o["status"], fmt=fmt), ending="")
