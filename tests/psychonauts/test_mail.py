"""The mail tools: a message reaches its recipient (an agent id or a role) once, oldest first,
however many readers ask at the same moment."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from psychonauts.models import Mail
from psychonauts.runtime.tools import ToolContext, tool_execute


def _ctx(agent_id: str, tmp_path: Path) -> ToolContext:
    return ToolContext(
        agent_run_id=0, agent_id=agent_id, attempt=1, quantum_id=0, role="coder", depth=0,
        workspace=tmp_path, shared=False,
    )  # fmt: skip


def _read(ctx: ToolContext) -> str:
    result = tool_execute(ctx, "mail_read", {}, [])
    assert not result.is_error, result.output
    return result.output


@pytest.mark.django_db
def test_it_reads_unread_mail_oldest_first_and_once(tmp_path: Path) -> None:
    me = _ctx("7_s0_coder", tmp_path)
    for n in range(3):
        Mail.objects.create(
            sender="7_s0_planner", recipient="7_s0_coder", subject=f"s{n}", body=f"b{n}"
        )
    Mail.objects.create(sender="x", recipient="someone_else", body="not mine")
    assert _read(me) == "\n\n".join(f"From 7_s0_planner: s{n}\nb{n}" for n in range(3))
    assert _read(me) == "(no new mail)"
    assert Mail.objects.filter(read_at=None).count() == 1


def _waiting_on_a_lock() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND datname = current_database()"
        )
        row = cursor.fetchone()
    return int(row[0]) if row else 0


@pytest.mark.django_db(transaction=True)
def test_two_agents_reading_at_once_never_get_the_same_message(tmp_path: Path) -> None:
    """Two siblings of one role read while a third transaction holds the messages' rows: each
    message is read by one of them (or after), never by both."""
    for n in range(3):
        Mail.objects.create(sender="planner", recipient="coder", subject=f"s{n}", body=f"b{n}")
    outputs: list[str] = []

    def read_as(agent: str) -> None:
        try:
            outputs.append(_read(_ctx(agent, tmp_path)))
        finally:
            connection.close()  # this thread's own connection

    readers = [
        threading.Thread(target=read_as, args=(agent,))
        for agent in ("7_s1_coder_a", "7_s1_coder_b")
    ]
    settings_dict = connection.settings_dict
    holder = psycopg.connect(
        host=settings_dict["HOST"], port=settings_dict["PORT"], user=settings_dict["USER"],
        dbname=settings_dict["NAME"], password=settings_dict["PASSWORD"] or None,
    )  # fmt: skip
    try:
        with holder.transaction():
            holder.execute(f"SELECT 1 FROM {Mail._meta.db_table} FOR UPDATE")
            for reader in readers:
                reader.start()
            # Both readers have either finished or are blocked on the held rows.
            deadline = time.monotonic() + 20
            while any(r.is_alive() for r in readers) and _waiting_on_a_lock() < sum(
                r.is_alive() for r in readers
            ):
                assert time.monotonic() < deadline, "the readers neither finished nor waited"
                time.sleep(0.02)
        for reader in readers:
            reader.join(20)
    finally:
        holder.close()
    outputs.append(_read(_ctx("7_s1_coder_c", tmp_path)))
    read = [line for out in outputs for line in out.split("\n\n") if line.startswith("From")]
    assert sorted(read) == [f"From planner: s{n}\nb{n}" for n in range(3)]
