from __future__ import annotations

import pytest

from core.access import operator_ensure, viewer_ensure


@pytest.fixture
def operator(db):
    return operator_ensure(username="op", password="pw-operator")


@pytest.fixture
def viewer(db):
    return viewer_ensure(username="viewer", password="pw-viewer")


@pytest.fixture
def op_client(client, operator):
    client.force_login(operator)
    return client


@pytest.fixture
def viewer_client(client, viewer):
    client.force_login(viewer)
    return client
