"""`manage.py flower`: Flower behind a password, or not at all."""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CREDENTIALS = ("ANNIHILATION_FLOWER_USER", "ANNIHILATION_FLOWER_PASSWORD", "FLOWER_BASIC_AUTH")


def flower_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CREDENTIALS}
    return {**env, "DJANGO_SETTINGS_MODULE": "annihilation.settings", **extra}


def manage_flower(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "flower", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    "given",
    [
        {},
        {"ANNIHILATION_FLOWER_USER": "ops"},
        {"ANNIHILATION_FLOWER_PASSWORD": "secret"},
        {"FLOWER_BASIC_AUTH": "ops"},
    ],
)
def test_it_refuses_to_start_flower_without_credentials(given):
    result = manage_flower(flower_env(**given))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0, result.stderr  # one line
    assert "credentials" in result.stderr or "user:password" in result.stderr


def status_of(url: str, auth: str | None = None) -> int:
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.slow
def test_flower_answers_only_with_its_credentials(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = flower_env(
        ANNIHILATION_FLOWER_USER="ops",
        ANNIHILATION_FLOWER_PASSWORD="flower test password",
        ANNIHILATION_HOME=str(tmp_path),
    )
    log = (tmp_path / "flower.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "manage.py", "flower", f"--port={port}", "--address=127.0.0.1"],
        env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                anonymous = status_of(url)
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise AssertionError((tmp_path / "flower.log").read_text()) from None
                time.sleep(0.3)
        assert anonymous == 401
        assert status_of(f"{url}api/workers") == 401
        assert status_of(url, "ops:wrong") == 401
        assert status_of(url, "ops:flower test password") == 200
        # The password is in Flower's environment, not on its command line for ps to show.
        command_line = Path(f"/proc/{process.pid}/cmdline").read_bytes()
        assert b"flower test password" not in command_line and b"celery" in command_line
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()
