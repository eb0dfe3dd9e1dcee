"""Who may do what in the control room.

Two groups made by a data migration: `operators` hold `core.operate` and may act (start
and cancel waves, answer, ground, approve); `viewers` only look. Every action view is wrapped in
`operator_required`, and websocket actions check `user_can_operate` the same way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, Group, Permission, User
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import HttpRequest, HttpResponseBase

from core.errors import AnnihilationError

OPERATE = "core.operate"
OPERATORS = "operators"
VIEWERS = "viewers"

View = TypeVar("View", bound=Callable[..., HttpResponseBase])


class AccountError(AnnihilationError):
    """An account cannot be created as asked (empty username or password)."""


def user_can_operate(user: AbstractBaseUser | AnonymousUser | None) -> bool:
    """Logged in, active, and holding `core.operate` (superusers hold every permission)."""
    return bool(
        user is not None
        and user.is_authenticated
        and user.is_active
        and cast(User, user).has_perm(OPERATE)
    )


def operator_required(view: View) -> View:
    """403 for anyone who may not act (login itself is enforced by LoginRequiredMiddleware)."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not user_can_operate(request.user):
            raise PermissionDenied("operators only: viewers can look but not act")
        return view(request, *args, **kwargs)

    return cast(View, wrapper)


def _group_ensure(name: str) -> Group:
    """The group as the data migration made it (again, should a flush have removed it)."""
    group, _ = Group.objects.get_or_create(name=name)
    if name == OPERATORS:
        app_label, codename = OPERATE.split(".")
        group.permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    return group


def _account_ensure(*, username: str, password: str, group: str) -> User:
    if not username.strip() or not password:
        raise AccountError("an account needs a username and a password")
    user, _ = User.objects.get_or_create(username=username.strip())
    user.set_password(password)
    user.is_active = True
    user.save()
    user.groups.set([_group_ensure(group)])
    return user


@transaction.atomic
def operator_ensure(*, username: str, password: str) -> User:
    """Create or update an operator account (for `make demo`); safe to run twice."""
    return _account_ensure(username=username, password=password, group=OPERATORS)


@transaction.atomic
def viewer_ensure(*, username: str, password: str) -> User:
    """Create or update a read-only account."""
    return _account_ensure(username=username, password=password, group=VIEWERS)
