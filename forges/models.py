"""Pull requests: a repository that publishes its changes on a forge (GitHub), and the pull
request each quantum's branch became there.

A repository without a `ForgeRepository` row merges locally, through the merge queue, as it
always has. The credential is never stored here: the row names the worker's environment variable
that holds it (its name ends in _TOKEN or _KEY, so core.redaction masks its value everywhere),
and only the worker's forge client and git push read it; no sandbox gets it (bubblewrap runs
with an empty environment).
"""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q

from repos.models import Repository
from tether.models import ChangeReview

SLUG_PATTERN = r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$"
CREDENTIAL_PATTERN = r"^[A-Z][A-Z0-9_]*_(TOKEN|KEY)$"


class ForgeKind(models.TextChoices):
    GITHUB = "github", "GitHub"


class MergeMethod(models.TextChoices):
    MERGE = "merge", "merge commit"
    SQUASH = "squash", "squash"
    REBASE = "rebase", "rebase"


class ForgeRepository(models.Model):
    """How one of our repositories reaches its forge."""

    repository = models.OneToOneField(
        Repository, on_delete=models.CASCADE, related_name="forge", primary_key=True
    )
    kind = models.CharField(max_length=16, choices=ForgeKind.choices, default=ForgeKind.GITHUB)
    slug = models.CharField(max_length=200, help_text="owner/name on the forge")
    api_url = models.CharField(max_length=500, default="https://api.github.com")
    push_url = models.CharField(
        max_length=1000, blank=True,
        help_text="where branches are pushed; blank: the repository's own central URL",
    )  # fmt: skip
    # A fine-grained token (token_env), or a GitHub App (app_id, installation_id and the
    # private key's variable, key_env).
    token_env = models.CharField(max_length=100, blank=True)
    app_id = models.CharField(max_length=40, blank=True)
    installation_id = models.PositiveBigIntegerField(null=True, blank=True)
    key_env = models.CharField(max_length=100, blank=True)
    required_checks = ArrayField(
        models.CharField(max_length=200), default=list, blank=True,
        help_text="checks that must pass before a merge; empty: every check on the head",
    )  # fmt: skip
    merge_method = models.CharField(
        max_length=8, choices=MergeMethod.choices, default=MergeMethod.MERGE
    )
    # Deliveries come to /hooks/github; without them the beat polls open pull requests.
    webhook = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(slug__regex=SLUG_PATTERN), name="forge_slug_valid"),
            models.CheckConstraint(
                condition=Q(token_env="") | Q(token_env__regex=CREDENTIAL_PATTERN),
                name="forge_token_env_valid",
            ),
            models.CheckConstraint(
                condition=Q(key_env="") | Q(key_env__regex=CREDENTIAL_PATTERN),
                name="forge_key_env_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind}:{self.slug}"


class PullState(models.TextChoices):
    """publishing -> open (pushed, opened or found on the forge) | failed (the forge refused:
    `error` says why; publishing again is allowed).
    open -> publishing (a new review of the branch: pushed and updated again) | merged | closed.
    failed -> publishing. merged and closed are terminal."""

    PUBLISHING = "publishing", "publishing"
    OPEN = "open", "open"
    FAILED = "failed", "failed"
    MERGED = "merged", "merged"
    CLOSED = "closed", "closed"

    @classmethod
    def terminal(cls) -> frozenset[str]:
        return frozenset({cls.MERGED, cls.CLOSED})


class PullRequest(models.Model):
    """A quantum's branch on the forge: one live pull request per (repository, branch), updated
    by each new review of the branch."""

    repository = models.ForeignKey(Repository, on_delete=models.CASCADE, related_name="+")
    branch = models.CharField(max_length=200)
    base = models.CharField(max_length=200)
    change = models.ForeignKey(
        ChangeReview, on_delete=models.CASCADE, related_name="pull_requests",
        help_text="the branch's latest review",
    )  # fmt: skip
    number = models.PositiveIntegerField(null=True, blank=True)
    url = models.CharField(max_length=500, blank=True)
    head_sha = models.CharField(max_length=40, blank=True, help_text="last pushed")
    state = models.CharField(max_length=12, choices=PullState.choices, default=PullState.PUBLISHING)
    error = models.TextField(blank=True, help_text="the forge's last refusal (redacted)")
    # What the forge said that we acted on already, so that a redelivery or a poll acts once:
    # review ids, and "<check name>@<sha>" of failed checks.
    acted = models.JSONField(default=list, blank=True)
    synced_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            # The publisher's upsert and the crash-safe "exactly one pull request per branch".
            models.UniqueConstraint(
                fields=["repository", "branch"],
                condition=~Q(state__in=["merged", "closed"]),
                name="pull_request_live_per_branch",
            ),
        ]
        indexes = [
            # The webhook's lookup by number; the poll's walk of open pull requests.
            models.Index(fields=["repository", "number"], name="pull_request_number"),
            models.Index(fields=["synced_at"], name="pull_request_open", condition=Q(state="open")),
        ]

    def __str__(self) -> str:
        return f"pull request {self.number or '?'} of {self.branch} [{self.state}]"
