"""The Content-Security-Policy in Chromium: every page of the control room and the admin runs
without a single violation (no inline script or style, the live socket allowed), and an injected
inline script is refused."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from bursts.models import AgentRun
from core.access import operator_ensure
from psychonauts.runtime.runs import agent_run_create
from tests.factories import make_chain
from tether.models import Priority
from tether.services import reaching_ask

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Recorded from the first script on, so a violation while the page loads is seen too.
RECORD_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__cspViolations.push(`${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`);
});
"""


@pytest.fixture
def violations(page):
    """Console messages about the policy, and the page's securitypolicyviolation events."""
    console: list[str] = []
    page.on(
        "console",
        lambda m: console.append(m.text) if "Content Security Policy" in m.text else None,
    )
    page.add_init_script(RECORD_VIOLATIONS)

    def seen() -> list[str]:
        events: list[str] = page.evaluate("window.__cspViolations")
        return console + events

    return seen


def test_the_control_room_runs_under_its_policy(control_room, page, login, violations):
    operator_ensure(username="operator", password="correct horse")
    first, second = make_chain(2, prefix="csp")
    run = agent_run_create(quantum_id=first.pk, role="coder")
    for i, priority in enumerate([Priority.NORMAL, Priority.CRITICAL]):
        reaching_ask(
            agent_run_id=run.pk,
            quantum_id=first.pk,
            tool_use_id=f"toolu_csp_{i}",
            question=f"Question {i}?",
            assumption="go on",
            priority=priority,
            timeout_s=3600,
        )
    agent = AgentRun.objects.get(pk=run.pk)

    page.goto(f"{control_room}/login/")
    assert violations() == []
    login(control_room, "operator", "correct horse")
    live_pages = ["/", "/tether/", f"/agents/{agent.pk}/", f"/quanta/{second.pk}/"]
    for path in live_pages:
        page.goto(f"{control_room}{path}")
        # The socket is open: connect-src let it through.
        expect(page.locator("#live-status")).to_have_text("live")
        assert violations() == [], path
        if path == "/tether/":
            # The queue order comes from data-order through the script, not a style attribute.
            cards = page.locator(".reaching").all()
            assert len(cards) == 2
            for card in cards:
                # Chromium prints the computed value with six significant digits.
                order = float(card.evaluate("el => getComputedStyle(el).order"))
                wanted = float(card.get_attribute("data-order") or 0)
                assert order > 0 and order == pytest.approx(wanted, rel=1e-5)
            expect(page.locator(".countdown").first).to_contain_text("left")
    for path in ["/quanta/", "/waves/", "/pipelines/", "/grounding/", "/quanta/new/"]:
        page.goto(f"{control_room}{path}")
        expect(page.locator("main h1")).to_be_visible()
        assert violations() == [], path

    # The policy is enforced, and a violation would have been seen.
    page.goto(f"{control_room}/")
    page.evaluate(
        "() => { const s = document.createElement('script');"
        " s.textContent = 'window.__inlineRan = true'; document.body.append(s); }"
    )
    assert page.evaluate("window.__inlineRan") is None
    page.wait_for_function("window.__cspViolations.length > 0")
    assert any("script-src" in v for v in violations())


def test_the_admin_runs_under_the_same_policy(control_room, page, violations):
    User.objects.create_superuser("admin", "admin@example.com", "correct horse")
    quantum = make_chain(1, prefix="admin csp")[0]
    page.goto(f"{control_room}/admin/login/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "correct horse")
    page.click("input[type=submit]")
    expect(page.locator("#site-name")).to_be_visible()
    for path in [
        "/admin/",
        "/admin/quanta/quantum/",
        f"/admin/quanta/quantum/{quantum.pk}/change/",
        "/admin/auth/user/add/",
        "/admin/axes/accessattempt/",
    ]:
        page.goto(f"{control_room}{path}")
        expect(page.locator("#content")).to_be_visible()
        assert violations() == [], path


def test_too_many_wrong_passwords_show_the_lockout_page(control_room, page, violations, screenshot):
    operator_ensure(username="operator", password="correct horse")
    for attempt in ["wrong", "wrong", "wrong", "wrong", "wrong", "correct horse"]:
        page.goto(f"{control_room}/login/")
        page.fill("#id_username", "operator")
        page.fill("#id_password", attempt)
        with page.expect_response(f"{control_room}/login/") as response:
            page.click("#login-submit")
    assert response.value.status == 429
    expect(page.locator("#locked-out")).to_contain_text("Too many failed logins")
    assert violations() == []
    screenshot("login-locked-out")
