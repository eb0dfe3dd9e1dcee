"""Browser tests: Debian's Chromium driven by Playwright (it cannot download its own here).

They run as their own pytest invocation (`pytest -m browser`): pytest-playwright keeps an
asyncio loop in the main thread, which would break async tests in the same process.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    return {
        **browser_type_launch_args,
        "executable_path": "/usr/bin/chromium",
        "args": CHROMIUM_ARGS,
    }


@pytest.fixture
def screenshot(page):
    """Save a full-page screenshot under artifacts/screenshots/<name>.png."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    def take(name: str) -> Path:
        path = ARTIFACTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take


@pytest.fixture(scope="module")
def control_room(django_db_setup, tmp_path_factory):
    """The whole system for a browser: daphne (HTTP + websockets) and a Celery worker running
    the real agent runtime with the scripted provider on a demo repository, both subprocesses
    on the test database. Yields the base URL."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    from psychonauts.workspaces.worktrees import demo_repo_ensure
    from tests.bursts.conftest import ROOT, Worker, worker_env

    tmp = tmp_path_factory.mktemp("control-room")
    repo = demo_repo_ensure(tmp / "repo")
    env = worker_env(
        ANNIHILATION_BURSTS_EXECUTOR="psychonauts",
        ANNIHILATION_HOME=str(tmp),
        ANNIHILATION_REPO=str(repo),
        ANNIHILATION_PROVIDER="",
    )
    worker = Worker(env=env, tmp=tmp, name=f"ui-{os.getpid()}", concurrency=8).start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp / "daphne.log").open("ab")
    web = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
         "annihilation.asgi:application"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                if time.monotonic() > deadline or web.poll() is not None:
                    raise AssertionError((tmp / "daphne.log").read_text()) from None
                time.sleep(0.2)
        yield url
    finally:
        web.terminate()
        try:
            web.wait(10)
        except subprocess.TimeoutExpired:
            web.kill()
        log.close()
        worker.stop()


@pytest.fixture
def login(page):
    def log_in(base: str, username: str, password: str) -> None:
        page.goto(f"{base}/login/")
        page.fill("#id_username", username)
        page.fill("#id_password", password)
        page.click("#login-submit")
        page.wait_for_url(f"{base}/")

    return log_in
