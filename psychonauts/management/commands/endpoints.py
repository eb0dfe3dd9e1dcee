"""`manage.py endpoints list|add|remove|check`: the registry of model endpoints."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError, CommandParser

from core.cli import SafeCommand, emit_json, positive_int, shorten, table
from psychonauts.errors import PsychonautError
from psychonauts.models import Endpoint, EndpointProvider, Role
from psychonauts.roles import roles_sync_defaults
from psychonauts.routing.endpoints import (
    CheckResult,
    endpoint_add,
    endpoint_remove,
    endpoints_health_check,
    endpoints_state,
    registry_invalidate,
    registry_snapshot,
)
from quanta.models import Complexity


def price(value: str) -> Decimal:
    try:
        amount = Decimal(value)
    except InvalidOperation:
        raise CommandError(f"not a price: {value!r} (USD per million tokens, e.g. 0.15)") from None
    if not amount.is_finite() or amount < 0:
        raise CommandError(f"not a price: {value!r} (a number of USD, 0 or more)")
    return amount


class Command(SafeCommand):
    help = "The registry of model endpoints: list, add, remove, check their health."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")
        listing = sub.add_parser("list", help="every endpoint, its health and calls in flight")
        listing.add_argument("--json", action="store_true")
        add = sub.add_parser("add", help="add an endpoint")
        add.add_argument("name", help="a short unique name (letters, digits, - and _)")
        add.add_argument("--model", required=True, help="the model name the endpoint expects")
        add.add_argument("--base-url", default="", help="e.g. http://localhost:11434/v1")
        add.add_argument(
            "--provider", default=EndpointProvider.OPENAI, choices=EndpointProvider.values
        )
        add.add_argument(
            "--api-key-env",
            default="",
            help="the NAME of the environment variable holding the key (never the key)",
        )
        add.add_argument("--tier", default=Complexity.STANDARD, choices=Complexity.values)
        add.add_argument("--max-concurrency", type=positive_int, default=4)
        add.add_argument("--price-in", type=price, help="USD per million input tokens")
        add.add_argument("--price-out", type=price, help="USD per million output tokens")
        add.add_argument("--disabled", action="store_true", help="add it switched off")
        add.add_argument(
            "--context-tokens",
            type=positive_int,
            default=None,
            help="the model's context size in tokens (the server's n_ctx): requests are kept "
            "within it",
        )
        add.add_argument(
            "--text-tool-calls",
            action="store_true",
            help="parse tool calls the model writes as text (fenced JSON of name and "
            "arguments) as tool calls",
        )
        add.add_argument("--json", action="store_true")
        remove = sub.add_parser("remove", help="remove an endpoint")
        remove.add_argument("name")
        remove.add_argument("--json", action="store_true")
        check = sub.add_parser("check", help="check the health of every enabled endpoint now")
        check.add_argument("names", nargs="*", help="only these endpoints (enabled or not)")
        check.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            getattr(self, f"_{options['subcommand']}")(options)
        except PsychonautError as exc:
            raise CommandError(str(exc)) from None

    def _list(self, options: dict[str, Any]) -> None:
        registry_invalidate()
        confs = registry_snapshot()
        states = {s.conf.name: s for s in endpoints_state(confs)}
        rows = {r.name: r for r in Endpoint.objects.all()}
        checked = {n: r.checked_at.isoformat() for n, r in rows.items() if r.checked_at}
        found: list[dict[str, Any]] = [
            {
                "name": c.name, "provider": c.provider, "model": c.model,
                "base_url": c.base_url, "api_key_env": c.api_key_env, "tier": c.tier,
                "max_concurrency": c.max_concurrency, "in_flight": states[c.name].in_flight,
                "price_in": c.price[0] if c.price else None,
                "price_out": c.price[1] if c.price else None, "enabled": c.enabled,
                "down": states[c.name].down, "failures": states[c.name].failures,
                "health": rows[c.name].health if c.name in rows else "",
                "health_reason": rows[c.name].health_reason if c.name in rows else "",
                "checked_at": checked.get(c.name),
            }
            for c in confs
        ]  # fmt: skip
        if options["json"]:
            emit_json(self.stdout, found)
            return
        if not found:
            self.stdout.write(
                "no endpoints: runs go to PSYCHONAUTS_MODELS (add one with `endpoints add`)"
            )
            return
        table(
            self.stdout,
            ["name", "provider", "model", "tier", "base url", "slots", "enabled", "health"],
            [
                [e["name"], e["provider"], e["model"], e["tier"], shorten(e["base_url"], 40),
                 f"{e['in_flight']}/{e['max_concurrency']}", "yes" if e["enabled"] else "no",
                 ("down" if e["down"] else e["health"])
                 + (f": {shorten(str(e['health_reason']), 60)}" if e["health_reason"] else "")]
                for e in found
            ],
        )  # fmt: skip

    def _add(self, options: dict[str, Any]) -> None:
        row = endpoint_add(
            name=options["name"],
            model=options["model"],
            base_url=options["base_url"],
            provider=options["provider"],
            api_key_env=options["api_key_env"],
            tier=options["tier"],
            max_concurrency=options["max_concurrency"],
            usd_per_mtok_in=options["price_in"],
            usd_per_mtok_out=options["price_out"],
            enabled=not options["disabled"],
            context_tokens=options["context_tokens"],
            text_tool_calls=options["text_tool_calls"],
        )
        if options["json"]:
            emit_json(self.stdout, {"name": row.name, "added": True})
            return
        self.stdout.write(
            f"added endpoint {row.name} ({row.provider} {row.model}, tier {row.tier}); "
            f"check it with `manage.py endpoints check {row.name}`"
        )
        roles_sync_defaults()  # a fresh database has none yet: the shipped ones are what runs
        scripted = sorted(
            Role.objects.filter(provider__in=("scripted", "noop")).values_list("name", flat=True)
        )
        if not settings.PSYCHONAUTS_PROVIDER and scripted:
            # The registry routes only runs that need a model: a role on the offline provider
            # never asks it. Said here, where the operator expects the endpoint to take runs.
            self.stdout.write(
                f"note: roles {', '.join(scripted)} run on the offline scripted provider and do "
                "not use the registry; set ANNIHILATION_PROVIDER=openai (or anthropic) in the "
                "workers' environment for their runs to go to the endpoints"
            )

    def _remove(self, options: dict[str, Any]) -> None:
        endpoint_remove(name=options["name"])
        if options["json"]:
            emit_json(self.stdout, {"name": options["name"], "removed": True})
            return
        self.stdout.write(f"removed endpoint {options['name']}")

    def _check(self, options: dict[str, Any]) -> None:
        names = options["names"] or None
        if names:
            known = set(Endpoint.objects.filter(name__in=names).values_list("name", flat=True))
            unknown = sorted(set(names) - known)
            if unknown:
                raise CommandError(f"no endpoint named {', '.join(unknown)}")
        results = endpoints_health_check(names=names)
        if options["json"]:
            emit_json(self.stdout, [_result(r) for r in results])
        elif not results:
            self.stdout.write("no enabled endpoints to check (name one to check it anyway)")
        else:
            table(
                self.stdout,
                ["name", "health", "how", "ms", "reason"],
                [[r.name, "up" if r.up else "down", r.how, r.ms, shorten(r.reason, 80)]
                 for r in results],
            )  # fmt: skip
        if any(not r.up for r in results):
            raise CommandError(f"{sum(not r.up for r in results)} endpoint(s) down")


def _result(r: CheckResult) -> dict[str, Any]:
    return {"name": r.name, "up": r.up, "reason": r.reason, "how": r.how, "ms": r.ms,
            "changed": r.changed}  # fmt: skip
