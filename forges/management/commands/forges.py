"""`manage.py forges ...`: which repositories publish their changes as pull requests.

    set REPO --slug OWNER/NAME (--token-env VAR | --app-id ID --installation ID --key-env VAR)
        [--api-url URL] [--push-url URL] [--required-check NAME]... [--merge-method M] [--no-webhook]
    show REPO | remove REPO | publish PULL_ID | sync PULL_ID

The credential is named (an environment variable of the workers), never given. Exit status:
0 done, 1 refused, 2 bad usage.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from core.cli import SafeCommand, emit_json, parse_id, subcommands
from forges.errors import ForgeError
from forges.models import ForgeRepository, MergeMethod
from forges.services import forge_configure, forge_remove, pull_request_publish, pull_request_sync
from repos.errors import RepositoryError
from repos.selectors import repository_get


def forge_data(config: ForgeRepository) -> dict[str, Any]:
    return {
        "repository": config.repository.name,
        "kind": config.kind,
        "slug": config.slug,
        "api_url": config.api_url,
        "push_url": config.push_url,
        "token_env": config.token_env,
        "app_id": config.app_id,
        "installation_id": config.installation_id,
        "key_env": config.key_env,
        "required_checks": config.required_checks,
        "merge_method": config.merge_method,
        "webhook": config.webhook,
    }


class Command(SafeCommand):
    help = "Publish a repository's changes as pull requests on GitHub. Each takes --json."

    def add_arguments(self, parser: CommandParser) -> None:
        add = subcommands(parser)
        p = add("set", "the repository publishes pull requests on OWNER/NAME")
        p.add_argument("repository")
        p.add_argument("--slug", required=True, help="owner/name on GitHub")
        p.add_argument("--token-env", default="", help="the workers' variable holding a token")
        p.add_argument("--app-id", default="")
        p.add_argument("--installation", type=int, default=None)
        p.add_argument("--key-env", default="", help="the workers' variable holding the App key")
        p.add_argument("--api-url", default="https://api.github.com")
        p.add_argument("--push-url", default="", help="blank: the repository's central URL")
        p.add_argument("--required-check", action="append", dest="required_checks", default=[])
        p.add_argument("--merge-method", choices=MergeMethod.values, default="merge")
        p.add_argument("--no-webhook", action="store_true", help="poll instead of deliveries")
        add("show", "the repository's forge").add_argument("repository")
        add("remove", "merge locally again").add_argument("repository")
        add("publish", "push and open or update a pull request now").add_argument(
            "id", type=parse_id
        )
        add("sync", "read a pull request's reviews and checks now").add_argument(
            "id", type=parse_id
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.as_json = bool(options["json"])
        try:
            getattr(self, "do_" + options["subcommand"])(options)
        except (ForgeError, RepositoryError) as exc:
            raise CommandError(str(exc)) from None

    def _out(self, data: dict[str, Any]) -> None:
        if self.as_json:
            emit_json(self.stdout, data)
        else:
            for key, value in data.items():
                self.stdout.write(f"{key}: {value}")

    def do_set(self, o: dict[str, Any]) -> None:
        config = forge_configure(
            repository_id=repository_get(name=o["repository"]).pk,
            slug=o["slug"], token_env=o["token_env"], app_id=o["app_id"],
            installation_id=o["installation"], key_env=o["key_env"], api_url=o["api_url"],
            push_url=o["push_url"], required_checks=o["required_checks"],
            merge_method=o["merge_method"], webhook=not o["no_webhook"],
        )  # fmt: skip
        self._out(forge_data(config))

    def do_show(self, o: dict[str, Any]) -> None:
        repository = repository_get(name=o["repository"])
        config = ForgeRepository.objects.filter(repository=repository).first()
        if config is None:
            raise CommandError(f"{repository.name} merges locally (no forge)")
        self._out(forge_data(config))

    def do_remove(self, o: dict[str, Any]) -> None:
        removed = forge_remove(repository_id=repository_get(name=o["repository"]).pk)
        self._out({"removed": removed})

    def do_publish(self, o: dict[str, Any]) -> None:
        pull = pull_request_publish(pull_id=o["id"])
        if pull is None:
            raise CommandError(f"no pull request #{o['id']}")
        self._out({"id": pull.pk, "number": pull.number, "url": pull.url, "state": pull.state,
                   "error": pull.error})  # fmt: skip

    def do_sync(self, o: dict[str, Any]) -> None:
        synced = pull_request_sync(pull_id=o["id"])
        self._out({"id": synced.pull_id, "outcome": synced.outcome})
