from __future__ import annotations

from django.apps import AppConfig


class ReposConfig(AppConfig):
    name = "repos"
    verbose_name = "Repositories"
    default_auto_field = "django.db.models.BigAutoField"
