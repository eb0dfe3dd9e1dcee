"""No silent waits: start_wave with no worker says so at once, and how to start one; --follow
repeats it while the work waits."""

from __future__ import annotations

import io
from collections.abc import Callable

import pytest
import redis
from django.conf import settings
from django.core.management import CommandError, call_command

from quanta.services import quantum_create
from tests.bursts.conftest import Worker

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def empty_broker(redis_client):
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    broker.delete("celery")
    yield broker
    broker.delete("celery")


def test_it_warns_at_once_when_no_worker_answers(empty_broker, quick_ping) -> None:
    quantum_create(title="waits")
    out, err = io.StringIO(), io.StringIO()
    call_command("start_wave", stdout=out, stderr=err)
    assert "started" in out.getvalue()
    assert "no Celery worker answered within 0.3 s" in err.getvalue()
    assert "make dev" in err.getvalue() and "celery -A annihilation worker" in err.getvalue()


def test_follow_repeats_the_warning_while_the_work_waits(
    empty_broker, quick_ping, settings
) -> None:
    settings.OPERATIONS_WARN_EVERY_S = 0.5
    quantum_create(title="waits")
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError) as gave_up:
        call_command("start_wave", "--follow", "--timeout", "3", stdout=out, stderr=err)
    assert gave_up.value.returncode == 3
    assert "agents: pending=1" in out.getvalue()
    assert err.getvalue().count("no Celery worker answered") >= 3
    assert empty_broker.llen("celery") >= 1  # the work is still there, waiting


def test_it_says_nothing_when_a_worker_is_there(
    empty_broker, make_worker: Callable[..., Worker]
) -> None:
    make_worker("present", beat=False)
    quantum_create(title="runs")
    out, err = io.StringIO(), io.StringIO()
    call_command("start_wave", "--follow", "--timeout", "30", stdout=out, stderr=err)
    assert "done" in out.getvalue()
    assert "warning" not in err.getvalue()
