"""Shared set-up for benchmarks: a database of their own on the dev Postgres, migrated."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def django_bench_db(name: str = "annihilation_bench") -> None:
    """Point Django at `name` on the dev cluster (creating it), set up and migrate."""
    sys.path.insert(0, str(ROOT))
    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:55432/annihilation")
    os.environ["DATABASE_URL"] = base.rsplit("/", 1)[0] + "/" + name
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "annihilation.settings")
    import psycopg

    admin_url = base.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"
