from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from tests.factories import make_chain

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_admin_logs_in_and_sees_the_quanta(live_server, page, screenshot):
    User.objects.create_superuser("admin", "admin@example.com", "correct horse")
    chain = make_chain(2, prefix="browser step")
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "wrong")
    page.click("input[type=submit]")
    assert page.locator(".errornote").is_visible()
    page.fill("#id_password", "correct horse")
    page.click("input[type=submit]")
    page.goto(f"{live_server.url}/admin/quanta/quantum/")
    assert page.locator(f"text={chain[1].title}").first.is_visible()
    screenshot("admin-quanta")
