from __future__ import annotations

from django.apps import AppConfig


class ForgesConfig(AppConfig):
    name = "forges"
    verbose_name = "Forges (pull requests)"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from forges.hooks import forge_merge, on_review_created
        from tether.services.changes import ON_REVIEW_CREATED
        from tether.services.merge_queue import FORGE_MERGERS

        if on_review_created not in ON_REVIEW_CREATED:
            ON_REVIEW_CREATED.append(on_review_created)
        if forge_merge not in FORGE_MERGERS:
            FORGE_MERGERS.append(forge_merge)
