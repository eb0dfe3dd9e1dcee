"""`manage.py tether ...`: the operator's side of the Tether, each subcommand with --json.

    questions | answer ID TEXT | drifts [--status S] | ground ID | reject ID --reason TEXT |
    note ID TEXT | changes | show-change ID | approve ID... | approve --all-low-risk | queue |
    reject-change ID --reason TEXT | mutations | approve-mutation ID | reject-mutation ID [--reason TEXT]

Exit status: 0 done, 1 refused (unknown id, already decided, branch moved ...), 2 bad usage.

The subcommands that write import tether.services when they run: `questions` and the other lists
read through the selectors alone, without loading the services (and the bursts, psychonauts and
git layers beneath them).
"""

from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils import timezone

from core.cli import SafeCommand, emit_json, parse_id, shorten, subcommands, table
from psychonauts.errors import PsychonautError
from quanta.errors import QuantaError
from tether.errors import TetherError
from tether.models import ChangeReview, Drift, DriftStatus, PipelineMutation, Reaching
from tether.selectors import (
    change_detail,
    changes_list,
    drifts_list,
    merge_queue_list,
    mutations_list,
    reachings_pending,
)


def reaching_data(r: Reaching) -> dict[str, Any]:
    return {
        "id": r.pk,
        "quantum_id": r.quantum_id,
        "agent_run_id": r.agent_run_id,
        "agent_id": r.agent_run.agent_id if r.agent_run_id and r.agent_run else "",
        "priority": r.priority,
        "question": r.question,
        "assumption": r.assumption,
        "context": r.context,
        "deadline": r.deadline,
        "seconds_left": round((r.deadline - timezone.now()).total_seconds(), 1),
        "status": r.status,
    }


def drift_data(d: Drift) -> dict[str, Any]:
    return {
        "id": d.pk,
        "kind": d.kind,
        "status": d.status,
        "quantum_id": d.quantum_id,
        "agent_run_id": d.agent_run_id,
        "reaching_id": d.reaching_id,
        "mutation_id": d.mutation_id,
        "question": d.reaching.question if d.reaching_id and d.reaching else "",
        "assumption": d.assumption,
        "rationale": d.rationale,
        "built_on": d.built_on,
        "comment": d.comment,
        "notes": d.notes,
        "decided_by": d.decided_by,
        "decided_at": d.decided_at,
        "correction_id": d.correction_id,
        "created_at": d.created_at,
    }


def change_data(c: ChangeReview, *, diff: bool = False) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": c.pk,
        "quantum_id": c.quantum_id,
        "quantum_run_id": c.quantum_run_id,
        "branch": c.branch,
        "base": c.base,
        "head_sha": c.head_sha,
        "files": c.files,
        "additions": c.additions,
        "deletions": c.deletions,
        "risk": c.risk,
        "reasons": c.reasons,
        "status": c.status,
        "merge_sha": c.merge_sha,
        "decided_by": c.decided_by,
        "comment": c.comment,
        "correction_id": c.correction_id,
        "queued_at": c.queued_at,
        "checks": c.checks,
        "left_out": c.left_out,
        "created_at": c.created_at,
    }
    if diff:
        data["diff"] = c.diff
    return data


def mutation_data(m: PipelineMutation) -> dict[str, Any]:
    return {
        "id": m.pk,
        "pipeline": m.pipeline_name,
        "base_version": m.base_version,
        "status": m.status,
        "rationale": m.rationale,
        "proposed_yaml": m.proposed_yaml,
        "agent_run_id": m.agent_run_id,
        "quantum_id": m.quantum_id,
        "deadline": m.deadline,
        "resulting_version": m.resulting_version,
        "decided_by": m.decided_by,
        "comment": m.comment,
    }


class Command(SafeCommand):
    help = "Answer the psychonauts' questions and ground drifts, changes and pipeline mutations."
    needs_redis = True
    # An operator answers an agent waiting seconds for it: no system checks first (they import
    # every view and the HTTP API to check the URLs). `manage.py check` runs them.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        add = subcommands(parser)
        add("questions", "pending questions, in queue order")
        p = add("answer", "answer a question (after its timeout: a late answer)")
        p.add_argument("reaching_id", type=parse_id)
        p.add_argument("text")
        p = add("drifts", "assumptions agents built on (open ones by default)")
        p.add_argument("--status", default=DriftStatus.OPEN, choices=[*DriftStatus.values, "all"])
        add("ground", "confirm a drift's assumption").add_argument("drift_id", type=parse_id)
        p = add("reject", "reject a drift's assumption: files a correction quantum")
        p.add_argument("drift_id", type=parse_id)
        p.add_argument("--reason", required=True)
        p = add("note", "add a note to a drift; it stays open, to be grounded or rejected later")
        p.add_argument("drift_id", type=parse_id)
        p.add_argument("text")
        add("changes", "change reviews, pending first")
        add("show-change", "a change with its diff").add_argument("change_id", type=parse_id)
        p = add("approve", "approve changes into the merge queue (merged and verified in order)")
        p.add_argument("change_ids", type=parse_id, nargs="*")
        p.add_argument("--all-low-risk", action="store_true", help="every pending low-risk change")
        add("queue", "the merge queue: the change merging, then the queued ones in order")
        p = add("reject-change", "reject a change: the quantum is reopened")
        p.add_argument("change_id", type=parse_id)
        p.add_argument("--reason", required=True)
        add("mutations", "pipeline proposals, pending first, with the current pipeline")
        add("approve-mutation", "save a proposal as a new pipeline version").add_argument(
            "mutation_id", type=parse_id
        )
        p = add("reject-mutation", "reject a pipeline proposal")
        p.add_argument("mutation_id", type=parse_id)
        p.add_argument("--reason", default="")

    def handle(self, *args: Any, **options: Any) -> None:
        self.as_json = bool(options["json"])
        self.by = getpass.getuser() or "operator"
        try:
            getattr(self, "do_" + options["subcommand"].replace("-", "_"))(options)
        except (TetherError, QuantaError, PsychonautError) as exc:
            raise CommandError(str(exc)) from None

    def say(self, data: Any, text: str) -> None:
        if self.as_json:
            emit_json(self.stdout, data)
        else:
            self.stdout.write(text)

    def do_questions(self, options: dict[str, Any]) -> None:
        rows = [reaching_data(r) for r in reachings_pending()]
        if self.as_json:
            emit_json(self.stdout, rows)
            return
        table(
            self.stdout,
            ["id", "priority", "quantum", "agent", "left s", "question", "assumption"],
            [
                (
                    r["id"],
                    r["priority"],
                    f"#{r['quantum_id']}",
                    r["agent_id"] or "(quarantine)",
                    max(0, int(r["seconds_left"])),
                    shorten(r["question"], 50),
                    shorten(r["assumption"], 30),
                )
                for r in rows
            ],
        )

    def do_answer(self, options: dict[str, Any]) -> None:
        from tether.services import reaching_answer

        result = reaching_answer(
            reaching_id=options["reaching_id"], text=options["text"], by=self.by
        )
        texts = {
            "answered": f"answered reaching {result.reaching_id}"
            + ("; the agent resumes" if result.resumed else ""),
            "late_grounded": f"late answer to reaching {result.reaching_id} agrees: drift "
            f"{result.drift_id} grounded",
            "late_superseded": f"late answer to reaching {result.reaching_id}: drift "
            f"{result.drift_id} superseded, correction quantum #{result.correction_id} filed",
            "quarantine": f"answered quarantine reaching {result.reaching_id} (kept as a comment)",
        }
        self.say(vars(result), texts[result.kind])

    def do_drifts(self, options: dict[str, Any]) -> None:
        status = None if options["status"] == "all" else options["status"]
        rows = [drift_data(d) for d in drifts_list(status=status)]
        if self.as_json:
            emit_json(self.stdout, rows)
            return
        table(
            self.stdout,
            ["id", "kind", "status", "quantum", "assumption", "question"],
            [
                (
                    d["id"],
                    d["kind"],
                    d["status"],
                    f"#{d['quantum_id']}",
                    shorten(d["assumption"], 40),
                    shorten(d["question"], 40),
                )
                for d in rows
            ],
        )

    def _drift_done(self, drift: Drift) -> None:
        extra = f"; correction quantum #{drift.correction_id}" if drift.correction_id else ""
        self.say(drift_data(drift), f"drift {drift.pk} {drift.status}{extra}")

    def do_ground(self, options: dict[str, Any]) -> None:
        from tether.services import drift_ground

        self._drift_done(drift_ground(drift_id=options["drift_id"], by=self.by))

    def do_reject(self, options: dict[str, Any]) -> None:
        from tether.services import drift_reject

        self._drift_done(
            drift_reject(drift_id=options["drift_id"], reason=options["reason"], by=self.by)
        )

    def do_note(self, options: dict[str, Any]) -> None:
        from tether.services import drift_note

        drift = drift_note(drift_id=options["drift_id"], text=options["text"], by=self.by)
        self.say(drift_data(drift), f"drift {drift.pk} noted; it stays {drift.status}")

    def do_changes(self, options: dict[str, Any]) -> None:
        rows = [change_data(c) for c in changes_list()]
        if self.as_json:
            emit_json(self.stdout, rows)
            return
        table(
            self.stdout,
            ["id", "status", "risk", "quantum", "branch", "files", "+", "-"],
            [
                (
                    c["id"],
                    c["status"],
                    c["risk"],
                    f"#{c['quantum_id']}",
                    c["branch"],
                    len(c["files"]),
                    c["additions"],
                    c["deletions"],
                )
                for c in rows
            ],
        )

    def do_show_change(self, options: dict[str, Any]) -> None:
        detail = change_detail(change_id=options["change_id"])
        c = detail.review
        if self.as_json:
            data = change_data(c)
            data["file_diffs"] = [
                {
                    "path": f.path,
                    "status": f.status,
                    "additions": f.additions,
                    "deletions": f.deletions,
                    "diff": f.diff,
                }
                for f in detail.files
            ]
            emit_json(self.stdout, data)
            return
        w = self.stdout.write
        w(f"change {c.pk} of quantum #{c.quantum_id} [{c.status}] risk {c.risk}")
        w(f"{c.branch} @ {c.head_sha[:10]} -> {c.base}; +{c.additions} -{c.deletions}")
        for reason in c.reasons:
            w(f"  - {reason}")
        if c.comment:
            w(f"note: {c.comment}")
        if c.merge_sha:
            w(f"merged as {c.merge_sha[:10]}")
        for check in c.checks:
            mark = "ok" if check.get("passed") else f"FAILED ({check.get('reason', '')})"
            w(f"check: {check.get('command', '')}: {mark}")
        if c.left_out:
            w(f"left out of the commits (ignored, generated): {len(c.left_out)}")
            for path in c.left_out:
                w(f"  - {path}")
        for f in detail.files:
            w("")
            w(f"== {f.status} {f.path} (+{f.additions} -{f.deletions})")
            w(f.diff)

    def do_approve(self, options: dict[str, Any]) -> None:
        from tether.services import changes_approve, changes_approve_low_risk

        ids: list[int] = options["change_ids"]
        if options["all_low_risk"] == bool(ids):
            raise CommandError("name the changes to approve, or --all-low-risk (not both)")
        if ids:
            outcomes = changes_approve(change_ids=ids, by=self.by)
        else:
            outcomes = changes_approve_low_risk(by=self.by)
        data: list[dict[str, Any]] = []
        lines: list[str] = []
        refused = 0
        for change_id, outcome in outcomes:
            if isinstance(outcome, TetherError):
                refused += 1
                data.append({"id": change_id, "error": str(outcome)})
                lines.append(f"change {change_id} refused: {outcome}")
            else:
                data.append(change_data(outcome))
                lines.append(f"change {change_id} queued for {outcome.base}")
        if not outcomes:
            lines.append("no pending low-risk change")
        if not refused or self.as_json:
            self.say(data, "\n".join(lines))
        elif len(outcomes) > refused:
            self.stdout.write("\n".join(line for line in lines if "refused" not in line))
        if refused:
            errors = [str(o) for _, o in outcomes if isinstance(o, TetherError)]
            raise CommandError("; ".join(errors))

    def do_queue(self, options: dict[str, Any]) -> None:
        rows = [change_data(c) for c in merge_queue_list()]
        if self.as_json:
            emit_json(self.stdout, rows)
            return
        if not rows:
            self.stdout.write("the merge queue is empty")
            return
        table(
            self.stdout,
            ["#", "id", "status", "risk", "quantum", "branch", "base", "queued", "note"],
            [
                (
                    n,
                    c["id"],
                    c["status"],
                    c["risk"],
                    f"#{c['quantum_id']}",
                    c["branch"],
                    c["base"],
                    f"{c['queued_at']:%H:%M:%S}" if c["queued_at"] else "",
                    shorten(c["comment"], 60),
                )
                for n, c in enumerate(rows, 1)
            ],
        )

    def do_reject_change(self, options: dict[str, Any]) -> None:
        from tether.services import change_reject

        c = change_reject(change_id=options["change_id"], reason=options["reason"], by=self.by)
        self.say(change_data(c), f"change {c.pk} rejected; quantum #{c.quantum_id} reopened")

    def do_mutations(self, options: dict[str, Any]) -> None:
        views = mutations_list()
        if self.as_json:
            emit_json(
                self.stdout,
                [
                    {
                        **mutation_data(v.mutation),
                        "current_version": v.current_version,
                        "current_yaml": v.current_yaml,
                    }
                    for v in views
                ],
            )
            return
        table(
            self.stdout,
            ["id", "status", "pipeline", "base v", "now v", "rationale"],
            [
                (
                    v.mutation.pk,
                    v.mutation.status,
                    v.mutation.pipeline_name,
                    v.mutation.base_version,
                    v.current_version or "(new)",
                    shorten(v.mutation.rationale, 50),
                )
                for v in views
            ],
        )

    def do_approve_mutation(self, options: dict[str, Any]) -> None:
        from tether.services import mutation_approve

        m = mutation_approve(mutation_id=options["mutation_id"], by=self.by)
        self.say(
            mutation_data(m), f"mutation {m.pk} approved: {m.pipeline_name} v{m.resulting_version}"
        )

    def do_reject_mutation(self, options: dict[str, Any]) -> None:
        from tether.services import mutation_reject

        m = mutation_reject(
            mutation_id=options["mutation_id"], by=self.by, reason=options["reason"]
        )
        self.say(mutation_data(m), f"mutation {m.pk} rejected; {m.pipeline_name} unchanged")
