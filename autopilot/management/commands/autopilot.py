"""`manage.py autopilot ...`: the hub's state and the operator's hold on it, each with --json.

    status | pause [--reason TEXT] | resume | force STATE | history [--limit N]

`force` keeps the state until `resume`; a paused autopilot starts nothing new.
Exit status: 0 done, 1 refused, 2 bad usage (an unknown state, a bad limit).
"""

from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import CommandError, CommandParser

from autopilot.errors import AutopilotError
from autopilot.models import HubState
from autopilot.selectors import hub_status, hub_transitions_recent
from autopilot.serializers import hub_status_data, hub_transition_data
from autopilot.services.hub import hub_force, hub_pause, hub_resume
from core.cli import SafeCommand, emit_json, positive_int, subcommands, table

STATUS_TRANSITIONS = 5  # the last transitions `status` shows


class Command(SafeCommand):
    help = "The autopilot: its state and why, spend against budgets; pause, resume, force a state."

    def add_arguments(self, parser: CommandParser) -> None:
        add = subcommands(parser)
        add("status", "state, why, since, paused/forced, the cap, spend today per state")
        add("pause", "stop starting new work (running agents finish)").add_argument(
            "--reason", default=""
        )
        add("resume", "act again; clears a forced state")
        add("force", "hold a state until resumed").add_argument("state", choices=HubState.values)
        add("history", "the hub's transitions, newest first").add_argument(
            "--limit", type=positive_int, default=20
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.as_json = bool(options["json"])
        self.by = getpass.getuser() or "operator"
        try:
            getattr(self, "do_" + options["subcommand"])(options)
        except AutopilotError as exc:
            raise CommandError(str(exc)) from None

    def do_status(self, options: dict[str, Any]) -> None:
        status = hub_status(transitions=STATUS_TRANSITIONS)
        if self.as_json:
            emit_json(self.stdout, hub_status_data(status))
            return
        h, out = status.hub, self.stdout
        flags = [f for f, on in (("paused", h.paused), ("forced", h.forced)) if on]
        out.write(f"state:   {h.state}" + (f" ({', '.join(flags)})" if flags else ""))
        out.write(f"why:     {h.reason or '(no decision yet)'}")
        if h.paused:
            out.write(f"paused:  {h.paused_reason or '(no reason given)'}")
        out.write(f"since:   {h.since:%Y-%m-%d %H:%M:%S %Z}" if h.since else "since:   -")
        cap = status.cap
        if cap.cap_usd is None:
            out.write(f"cap:     none (spent today ${cap.spent_usd:.2f})")
        else:
            reached = " — spend cap reached: agents paused" if cap.reached else ""
            out.write(f"cap:     ${cap.spent_usd:.2f} of ${cap.cap_usd:.2f} today{reached}")
        out.write("\nspend today:")
        table(
            out,
            ["scope", "spent", "budget", "left"],
            [
                (
                    s.scope,
                    f"${s.spent_usd:.2f}",
                    "-" if s.budget_usd is None else f"${s.budget_usd:.2f}",
                    "-" if s.left_usd is None else f"${s.left_usd:.2f}",
                )
                for s in status.spend
            ]
            + [
                (
                    "autopilot",
                    f"${status.spent_autopilot_usd:.2f}",
                    f"${status.day_budget_usd:.2f}",
                    "",
                )
            ],
        )
        out.write("\nlast transitions:")
        self._transitions(status.transitions)

    def _transitions(self, transitions: list[Any]) -> None:
        table(
            self.stdout,
            ["at", "from", "to", "by", "reason"],
            [
                (t.created_at.strftime("%Y-%m-%d %H:%M:%S"), t.from_state or "-", t.to_state,
                 t.by, t.reason)
                for t in transitions
            ],
        )  # fmt: skip

    def _done(self, text: str) -> None:
        status = hub_status(transitions=1)
        if self.as_json:
            emit_json(self.stdout, hub_status_data(status))
        else:
            self.stdout.write(text.format(hub=status.hub))

    def do_pause(self, options: dict[str, Any]) -> None:
        hub_pause(by=self.by, reason=options["reason"])
        self._done("autopilot paused ({hub.state}); `manage.py autopilot resume` to go on")

    def do_resume(self, options: dict[str, Any]) -> None:
        hub_resume(by=self.by)
        self._done("autopilot resumed ({hub.state})")

    def do_force(self, options: dict[str, Any]) -> None:
        hub_force(state=options["state"], by=self.by)
        self._done("autopilot forced to {hub.state} until resumed")

    def do_history(self, options: dict[str, Any]) -> None:
        transitions = hub_transitions_recent(limit=options["limit"])
        if self.as_json:
            emit_json(self.stdout, [hub_transition_data(t) for t in transitions])
            return
        self._transitions(transitions)
