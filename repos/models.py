"""The registry of repositories the installation works on.

One repository is the default: its location is ANNIHILATION_REPO (settings), kept in step on
every use, so an installation configured by that setting alone runs as it always has. Quanta,
goals and waves belong to a repository; worktrees, branches, reviews and the merge queue of a
repository are its own (repos.context says which repository the code at hand works on).
"""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q

NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"


class Repository(models.Model):
    name = models.CharField(max_length=63, help_text="lowercase letters, digits, '.', '_' and '-'")
    location = models.CharField(
        max_length=1000,
        help_text="an absolute path of a local git repository, or a central repository's URL",
    )
    target_branch = models.CharField(
        max_length=255, blank=True, help_text="the branch changes merge into; blank = checked out"
    )
    verify_commands = ArrayField(
        models.TextField(), default=list, blank=True,
        help_text="run on every merged result of the merge queue, after the quantum's own",
    )  # fmt: skip
    # The operator's environment declaration (YAML or JSON text of a mapping), validated on
    # write and stored as written; building the environment reads it.
    environment = models.TextField(blank=True)
    is_default = models.BooleanField(default=False, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Removed by the operator: hidden and given no new work, its history (closed quanta, waves,
    # reviews) kept. Its name is free again.
    removed_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        verbose_name_plural = "repositories"
        ordering = ["name"]
        constraints = [
            # repository_get(name=...): one live repository per name.
            models.UniqueConstraint(
                fields=["name"], condition=Q(removed_at__isnull=True), name="repository_name_live"
            ),
            # repository_default(): at most one default, so its lookup is one row.
            models.UniqueConstraint(
                fields=["is_default"], condition=Q(is_default=True), name="repository_one_default"
            ),
            models.CheckConstraint(
                condition=Q(name__regex=NAME_PATTERN), name="repository_name_valid"
            ),
            models.CheckConstraint(condition=~Q(location=""), name="repository_location_set"),
        ]

    def __str__(self) -> str:
        return self.name
