"""`manage.py psychonaut <subcommand>`: roles, one agent outside a wave, the live registry."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser

from bursts.executor import Outcome
from core.cli import SafeCommand, emit_json, parse_id, shorten, table
from core.redaction import redact
from psychonauts import selectors
from psychonauts.containment.sandbox import sandbox_status
from psychonauts.errors import PsychonautError
from psychonauts.preflight import provider_of, provider_problem, repository_problem
from psychonauts.roles import roles_load, roles_sync_defaults
from psychonauts.routing.registry import registry_rebuild
from psychonauts.runtime import leases
from psychonauts.runtime.execute import agent_run_execute
from psychonauts.runtime.runner import Observer
from psychonauts.runtime.runs import agent_run_create
from psychonauts.runtime.sweep import workspaces_sweep
from quanta.models import Quantum


class Command(SafeCommand):
    help = "Psychonauts: list or load roles, run one agent, inspect running agents."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")
        roles = sub.add_parser("roles", help="list roles (or `roles load PATH`)")
        roles.add_argument("action", nargs="?", choices=["list", "load"], default="list")
        roles.add_argument("path", nargs="?", type=Path, help="a role YAML file or a folder")
        roles.add_argument("--json", action="store_true")
        run = sub.add_parser("run", help="run one agent on a quantum, streaming to the terminal")
        run.add_argument("--role", required=True)
        run.add_argument("--quantum", required=True, type=parse_id)
        run.add_argument("--provider", default="", help="anthropic, scripted, noop ...")
        run.add_argument("--model", default="")
        run.add_argument("--context", default="", help="extra context for the prompt")
        run.add_argument("--quiet", action="store_true", help="only print the outcome")
        execute = sub.add_parser("execute", help="execute (or resume) an existing agent run")
        execute.add_argument("agent_run", type=parse_id)
        agents = sub.add_parser("agents", help="the registry of running agents")
        agents.add_argument("--rebuild", action="store_true")
        agents.add_argument("--json", action="store_true")
        executors = sub.add_parser(
            "executors", help="which executors (ours, claude-code, codex) can run here, and why not"
        )
        executors.add_argument("--json", action="store_true")
        sub.add_parser(
            "sweep", help="drop expired file leases and the worktrees of closed, idle quanta"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            getattr(self, f"_{options['subcommand']}")(options)
        except PsychonautError as exc:
            raise CommandError(str(exc)) from None

    def _roles(self, options: dict[str, Any]) -> None:
        if options["action"] == "load":
            if options["path"] is None:
                raise CommandError("roles load PATH: name a role file or folder")
            loaded = roles_load(options["path"])
            self.stdout.write(f"loaded {len(loaded)} role(s): {', '.join(r.name for r in loaded)}")
            return
        roles_sync_defaults()
        # Only the defined roles: a role whose calls outlive its definition is on the Roles page.
        roles = [row for row in selectors.roles_spend() if row["role"] is not None]
        if options["json"]:
            emit_json(self.stdout, [
                {"name": r.name, "provider": r.provider, "model": r.model,
                 "max_turns": r.max_turns, "timeout_s": r.timeout_s,
                 "allowed_tools": r.allowed_tools, "description": r.description,
                 "spend": row["spend"]}
                for row in roles if (r := row["role"]) is not None
            ])  # fmt: skip
            return
        table(
            self.stdout,
            ["name", "provider", "model", "turns", "timeout", "tools", "tokens in/out", "cache",
             "cost", "description"],
            [
                [r.name, r.provider, r.model or "(routed)", r.max_turns, f"{r.timeout_s}s",
                 len(r.allowed_tools), *_spend_cells(row["spend"]), shorten(r.description, 40)]
                for row in roles if (r := row["role"]) is not None
            ],
        )  # fmt: skip

    def _observer(self, quiet: bool) -> Observer:
        # The runtime hands over redacted text (the deltas by whole lines); what is printed here
        # is redacted once more and made terminal-safe (self.stdout), so nothing an agent wrote
        # reaches the terminal unredacted or acts on it (escape sequences, bidi overrides).
        def show(event_type: str, payload: dict[str, Any]) -> None:
            if quiet:
                return
            if event_type == "delta":
                self.stdout.write(payload["text"], ending="")
                self.stdout.flush()
            elif event_type == "phase":
                self.stdout.write(f"\n[{payload['phase']}]", self.style.HTTP_INFO)
            elif event_type == "tool_call":
                shown = redact(f"→ {payload['name']} {payload['input']}")
                self.stdout.write(shown, self.style.WARNING)
            elif event_type == "tool_result":
                style = self.style.ERROR if payload["is_error"] else self.style.SUCCESS
                self.stdout.write(f"← {shorten(redact(payload['output']), 300)}", style)
            elif event_type in {"usage", "started", "committed"}:
                self.stdout.write(redact(f"[{event_type}] {payload}"), self.style.HTTP_INFO)

        return show

    def _run(self, options: dict[str, Any]) -> None:
        roles_sync_defaults()
        if not Quantum.objects.filter(pk=options["quantum"]).exists():
            raise CommandError(f"quantum #{options['quantum']} does not exist")
        # Refused before the run exists: a run that errors at its first call is one more thing
        # for a new operator to clean up.
        provider = provider_of(role=options["role"], provider=options["provider"] or "")
        problem = provider_problem(provider) or repository_problem()
        if problem is not None:
            raise CommandError(problem)
        run = agent_run_create(
            quantum_id=options["quantum"],
            role=options["role"],
            provider=options["provider"],
            model=options["model"],
            context=options["context"],
        )
        self.stdout.write(f"agent run {run.pk}: {run.agent_id} attempt {run.attempt}")
        self._outcome(agent_run_execute(
            agent_run_id=run.pk, observer=self._observer(options["quiet"])
        ))  # fmt: skip

    def _execute(self, options: dict[str, Any]) -> None:
        self._outcome(agent_run_execute(agent_run_id=options["agent_run"]))

    def _outcome(self, outcome: Outcome) -> None:
        style = self.style.SUCCESS if outcome.status == "done" else self.style.ERROR
        self.stdout.write(f"\n== {outcome.status}", style)
        if outcome.result:
            self.stdout.write(redact(outcome.result))
        if outcome.error:
            self.stdout.write(redact(outcome.error))
        if outcome.status == "error":
            raise CommandError(redact(outcome.error))

    def _agents(self, options: dict[str, Any]) -> None:
        if options["rebuild"]:
            registry_rebuild()
        entries = selectors.agents_running()
        spend = selectors.agents_spend(agent_run_ids=[int(e["agent_run_id"]) for e in entries])
        if options["json"]:
            emit_json(self.stdout, [{**e, "spend": spend[int(e["agent_run_id"])]} for e in entries])
            return
        self.stdout.write(f"sandbox {sandbox_status().describe()}")
        table(
            self.stdout,
            ["run", "agent", "attempt", "status", "phase", "host", "worker", "heartbeat",
             "tokens in/out", "cache", "cost"],
            [[e["agent_run_id"], e["agent_id"], e["attempt"], e["status"], e["phase"],
              e["host"], e["worker"], e["heartbeat"], *_spend_cells(spend[int(e["agent_run_id"])])]
             for e in entries],
        )  # fmt: skip

    def _executors(self, options: dict[str, Any]) -> None:
        from psychonauts.executors import executors_status

        found = executors_status()
        if options["json"]:
            emit_json(self.stdout, [dataclasses.asdict(s) for s in found])
            return
        rows = [[s.name, "yes" if s.available else "no", s.detail] for s in found]
        table(self.stdout, ["executor", "available", "detail"], rows)

    def _sweep(self, options: dict[str, Any]) -> None:
        self.stdout.write(f"dropped {leases.leases_sweep()} expired shared lease(s)")
        removed = workspaces_sweep()
        listed = ", ".join(f"#{pk}" for pk in removed)
        self.stdout.write(
            f"removed the worktrees of {len(removed)} closed quanta"
            + (f": {listed}" if removed else "")
        )


def _spend_cells(spend: selectors.AgentSpend) -> list[str]:
    whole_in = spend["tokens_in"] + spend["cache_read"] + spend["cache_write"]
    share = spend["cache_share"]
    return [
        f"{whole_in}/{spend['tokens_out']}",
        "-" if share is None else f"{share:.0%}",
        spend["cost"],
    ]
