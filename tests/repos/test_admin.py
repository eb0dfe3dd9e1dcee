"""The admin shows repositories and edits their checks and environment, refusing a bad
declaration; registering and removing go through the checked paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from repos.models import Repository
from repos.services import repository_default

pytestmark = pytest.mark.django_db


def test_the_admin_refuses_a_bad_environment_and_keeps_the_old(admin_client, repo: Path) -> None:
    default = repository_default()
    url = f"/admin/repos/repository/{default.pk}/change/"
    assert admin_client.get(url).status_code == 200
    assert admin_client.get("/admin/repos/repository/add/").status_code == 403

    refused = admin_client.post(url, {"verify_commands": "", "environment": "- not a mapping"})
    assert refused.status_code == 200 and "must be a mapping" in refused.content.decode()
    assert Repository.objects.get(pk=default.pk).environment == ""

    saved = admin_client.post(url, {"verify_commands": "make check", "environment": "setup: []"})
    assert saved.status_code == 302
    default.refresh_from_db()
    assert (default.verify_commands, default.environment) == (["make check"], "setup: []")
