"""Environment builds: one row per (host, key), the folder it built and how that went."""

from __future__ import annotations

from django.db import models


class BuildStatus(models.TextChoices):
    """building -> ready | failed; failed -> building (the operator rebuilds it); ready ->
    building (its folder was removed as stale, and it is needed again). Every transition is a
    compare-and-set on the status (services.py)."""

    BUILDING = "building", "building"
    READY = "ready", "ready"
    FAILED = "failed", "failed"


class EnvironmentBuild(models.Model):
    """A repository's environment for one key (the hash of its declaration and key files'
    content) on one host: built once there, then mounted read-only into that repository's
    commands. The folder is `settings.ENV_ROOT / key` on `host`."""

    host = models.CharField(max_length=255)
    key = models.CharField(max_length=64)
    # The repository it belongs to: its local path or central URL.
    repository = models.CharField(max_length=1000)
    commit_sha = models.CharField(
        max_length=64, blank=True, help_text="the commit it was read from"
    )
    spec = models.JSONField(default=dict)
    status = models.CharField(
        max_length=10, choices=BuildStatus.choices, default=BuildStatus.BUILDING
    )
    error = models.TextField(blank=True)
    log = models.TextField(blank=True, help_text="setup's output, redacted")
    denied = models.JSONField(default=list, blank=True, help_text="hosts the proxy refused")
    size_bytes = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["host", "key"], name="environment_build_host_key"),
        ]
        indexes = [
            # Pruning: a host's ready builds, least recently used first.
            models.Index(fields=["host", "status", "used_at"], name="environment_build_prune"),
        ]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"environment {self.key[:12]} ({self.status})"


class EnvironmentWaiter(models.Model):
    """An agent run suspended until a build ends: the build's end wakes it (ready: it runs in
    the environment; failed: it ends with the build's error). Written under the build row's
    lock, as the build's end reads them, so no waiter is missed."""

    build = models.ForeignKey(EnvironmentBuild, on_delete=models.CASCADE, related_name="waiters")
    agent_run_id = models.BigIntegerField(unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"agent run {self.agent_run_id} waits on {self.build}"
