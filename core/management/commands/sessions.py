"""`manage.py sessions search QUERY`: full-text search over the events, by session."""

from __future__ import annotations

import argparse
from typing import Any

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
from core.errors import BadSearchQuery
from core.search import LIMIT_MAX, SessionHit, sessions_search


def _limit(value: str) -> int:
    limit = positive_int(value)
    if limit > LIMIT_MAX:
        raise argparse.ArgumentTypeError(f"{value!r}: at most {LIMIT_MAX}")
    return limit


def hit_data(hit: SessionHit) -> dict[str, Any]:
    return {
        "session": hit.session_id,
        "kind": hit.kind,
        "title": hit.title,
        "started_at": hit.started_at,
        "ended_at": hit.ended_at,
        "matches": hit.matches,
        "rank": hit.rank,
        "topics": hit.topics,
        "event": hit.event_id,
        "snippet": hit.snippet,
        "agent_run": hit.agent_run_id,
        "agent_id": hit.agent_id,
        "quantum": hit.quantum_id,
        "role": hit.role,
    }


class Command(SafeCommand):
    help = "Search the sessions' events. Every subcommand takes --json."

    def add_arguments(self, parser: CommandParser) -> None:
        add = subcommands(parser)
        p = add("search", 'full-text search: words, "phrases", OR, -exclude, prefix*')
        p.add_argument("query")
        p.add_argument("--topic", help="only events on this topic (`agent:*`: a prefix)")
        p.add_argument("--quantum", type=parse_id, help="only the agents of this quantum")
        p.add_argument("--role", help="only the agents in this role")
        p.add_argument("--limit", type=_limit, default=50)

    def handle(self, *args: Any, **options: Any) -> None:
        handler = getattr(self, "do_" + options["subcommand"])
        try:
            handler(options)
        except BadSearchQuery as exc:  # what was typed cannot be searched: a usage error
            raise CommandError(str(exc), returncode=USAGE_ERROR) from None

    def do_search(self, o: dict[str, Any]) -> None:
        hits = sessions_search(
            o["query"], topic=o["topic"], quantum_id=o["quantum"], role=o["role"], limit=o["limit"]
        )
        if o["json"]:
            emit_json(self.stdout, [hit_data(h) for h in hits])
            return
        table(
            self.stdout,
            ["SESSION", "RANK", "HITS", "AGENT RUN", "TITLE", "SNIPPET"],
            [
                (
                    h.session_id,
                    f"{h.rank:.3f}",
                    h.matches,
                    h.agent_run_id or "",
                    shorten(h.title, 40),
                    shorten(h.snippet, 70),
                )
                for h in hits
            ],
        )
