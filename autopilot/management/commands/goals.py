"""`manage.py goals ...`: the operator's goals, each subcommand with --json.

    add --title T --criteria C [--description D] [--verify CMD]... [--priority P]
        [--label L]... [--budget USD] | list [--status S] | show ID | approve ID |
    abandon ID [--reason TEXT]

A goal added here is proposed: it waits for `approve` (as do the goals contemplation proposes).
Exit status: 0 done, 1 refused (unknown id, a guard-refused verify command, already decided),
2 bad usage.
"""

from __future__ import annotations

import argparse
import getpass
from decimal import Decimal, InvalidOperation
from typing import Any

from django.core.management.base import CommandError, CommandParser

from autopilot.errors import AutopilotError
from autopilot.forms import BUDGET_MAX
from autopilot.models import GoalStatus
from autopilot.selectors import GoalPage, goal_page, goal_row, goals_list
from autopilot.serializers import goal_data, goal_page_data
from autopilot.services.goals.lifecycle import goal_abandon, goal_approve, goal_create
from core.cli import SafeCommand, emit_json, parse_id, shorten, subcommands, table
from core.safetext import quoted
from quanta.errors import QuantaError


def _priority(value: str) -> int:
    if not (value.isascii() and value.isdigit()) or not 0 <= int(value) <= 4:
        raise argparse.ArgumentTypeError(f"{quoted(value)}: priority is 0..4 (0 = critical)")
    return int(value)


def _budget(value: str) -> Decimal:
    try:
        usd = Decimal(value)
    except InvalidOperation:
        usd = Decimal("NaN")
    if not usd.is_finite() or not 0 <= usd <= BUDGET_MAX:
        raise argparse.ArgumentTypeError(f"{quoted(value)} is not an amount of USD (0 or more)")
    return usd


class Command(SafeCommand):
    help = "Propose, list, inspect, approve and abandon the autopilot's goals. Each takes --json."

    def add_arguments(self, parser: CommandParser) -> None:
        add = subcommands(parser)
        p = add("add", "propose a goal (it waits for approve)")
        p.add_argument("--title", required=True)
        p.add_argument("--criteria", required=True, help="what must be true when it is done")
        p.add_argument("--description", default="")
        p.add_argument(
            "--verify",
            action="append",
            dest="verify_commands",
            default=[],
            metavar="CMD",
            help="a command run on the integration branch at the end (repeatable)",
        )
        p.add_argument("--priority", type=_priority, default=2, help="0 (critical) .. 4")
        p.add_argument("--label", action="append", dest="labels", default=[], metavar="LABEL")
        p.add_argument("--budget", type=_budget, help="USD its agents may spend in all")
        p = add("list", "goals by status (proposed first), with progress and spend")
        p.add_argument("--status", choices=GoalStatus.values)
        add("show", "a goal, its history, its quanta and planner runs").add_argument(
            "id", type=parse_id
        )
        add("approve", "approve a proposed (or failed) goal").add_argument("id", type=parse_id)
        p = add("abandon", "give a goal up")
        p.add_argument("id", type=parse_id)
        p.add_argument("--reason", default="")

    def handle(self, *args: Any, **options: Any) -> None:
        self.as_json = bool(options["json"])
        self.by = getpass.getuser() or "operator"
        try:
            getattr(self, "do_" + options["subcommand"])(options)
        except (AutopilotError, QuantaError) as exc:
            raise CommandError(str(exc)) from None

    def do_add(self, options: dict[str, Any]) -> None:
        goal = goal_create(
            title=options["title"],
            success_criteria=options["criteria"],
            description=options["description"],
            verify_commands=options["verify_commands"],
            priority=options["priority"],
            labels=options["labels"],
            budget_usd=options["budget"],
            by=self.by,
        )
        if self.as_json:
            emit_json(self.stdout, goal_data(goal_row(goal)))
        else:
            self.stdout.write(
                f"goal {goal.pk} proposed: {goal.title}\n"
                f"approve it with `manage.py goals approve {goal.pk}`"
            )

    def do_list(self, options: dict[str, Any]) -> None:
        rows = goals_list(status=options["status"])
        if self.as_json:
            emit_json(self.stdout, [goal_data(r) for r in rows])
            return
        table(
            self.stdout,
            ["id", "status", "P", "source", "progress", "spend", "title"],
            [
                (
                    r.goal.pk,
                    r.goal.status + (" (waiting for approval)" if r.waiting_for_approval else ""),
                    r.goal.priority,
                    r.goal.source,
                    f"{r.closed}/{r.total}",
                    f"${r.spend_usd:.2f}",
                    shorten(r.goal.title, 60),
                )
                for r in rows
            ],
        )

    def do_show(self, options: dict[str, Any]) -> None:
        detail = goal_page(goal_id=options["id"])
        if self.as_json:
            emit_json(self.stdout, goal_page_data(detail))
            return
        self._show(detail)

    def _show(self, d: GoalPage) -> None:
        g, out = d.goal, self.stdout
        out.write(f"goal {g.pk}: {g.title}")
        out.write(f"status:    {g.status}" + (f" ({g.reason})" if g.reason else ""))
        out.write(
            f"priority:  {g.priority} · source {g.source} · labels {', '.join(g.labels) or '-'}"
        )
        budget = f" of ${g.budget_usd:.2f}" if g.budget_usd is not None else ""
        out.write(
            f"progress:  {d.row.closed}/{d.row.total} quanta closed · spend ${d.row.spend_usd:.4f}{budget}"
        )
        a = d.agents
        share = "-" if a["cache_share"] is None else f"{a['cache_share']:.0%}"
        out.write(
            f"agents:    {a['calls']} model calls · "
            f"{a['tokens_in'] + a['cache_read'] + a['cache_write']}/{a['tokens_out']} tokens in/out"
            f" · cache {share} · {a['cost']}"
        )
        out.write(f"criteria:  {g.success_criteria}")
        if g.description:
            out.write(f"description: {g.description}")
        out.write("verify:    " + ("; ".join(g.verify_commands) or "(none)"))
        if d.last_verify is not None:
            out.write(f"last verify: {d.last_verify.to_status} {d.last_verify.reason}")
        out.write("\nhistory:")
        table(
            out,
            ["at", "from", "to", "by", "reason"],
            [
                (t.created_at.strftime("%Y-%m-%d %H:%M:%S"), t.from_status or "-", t.to_status,
                 t.by, shorten(t.reason, 60))
                for t in d.transitions
            ],
        )  # fmt: skip
        out.write("\nquanta:")
        table(
            out,
            ["id", "status", "waits on", "change", "title"],
            [
                (c.quantum_id, c.status, " ".join(f"#{n}" for n in c.waits_on) or "-",
                 f"#{c.change_id} {c.change_status}" if c.change_id else "-",
                 shorten(c.title, 60))
                for c in d.children
            ],
        )  # fmt: skip
        out.write("\nplanner runs:")
        table(
            out,
            ["id", "agent", "status", "cost", "error"],
            [
                (r.pk, r.agent_id, r.status, f"${r.cost_usd:.4f}", shorten(r.error, 50))
                for r in d.planner_runs
            ],
        )

    def _decided(self, goal_id: int, verb: str) -> None:
        detail = goal_page(goal_id=goal_id)
        if self.as_json:
            emit_json(self.stdout, goal_data(detail.row))
        else:
            self.stdout.write(f"goal {goal_id} {verb}: {detail.goal.status}")

    def do_approve(self, options: dict[str, Any]) -> None:
        goal_approve(goal_id=options["id"], by=self.by)
        self._decided(options["id"], "approved")

    def do_abandon(self, options: dict[str, Any]) -> None:
        goal_abandon(goal_id=options["id"], by=self.by, reason=options["reason"])
        self._decided(options["id"], "abandoned")
