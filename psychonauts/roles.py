"""Roles (psychonaut templates) from YAML into Postgres."""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings
from django.db import transaction

from psychonauts.errors import InvalidDefinition
from psychonauts.models import Role
from psychonauts.yamlfile import YamlDoc

_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,99}$")
_KEYS = {
    "name", "description", "system_prompt", "provider", "model", "allowed_tools", "max_turns",
    "timeout_s", "executor",
}  # fmt: skip


def role_parse(path: Path) -> dict[str, object]:
    """The fields of one role file, validated; InvalidDefinition names file, line and field."""
    from psychonauts.routing.providers import PROVIDERS
    from psychonauts.runtime.tools import TOOLS

    doc = YamlDoc(path)
    data = doc.data
    if not isinstance(data, dict):
        raise doc.error("a role is a mapping (name, system_prompt, provider, ...)")
    unknown = set(data) - _KEYS
    if unknown:
        key = sorted(unknown)[0]
        raise doc.error(f"unknown field (known: {', '.join(sorted(_KEYS))})", key)
    name = data.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise doc.error("required: lower-case letters, digits, - and _", "name")
    prompt = data.get("system_prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise doc.error("required, a non-empty text", "system_prompt")
    provider = data.get("provider", "scripted")
    if provider not in PROVIDERS:
        raise doc.error(f"unknown provider {provider!r} (known: {sorted(PROVIDERS)})", "provider")
    tools = data.get("allowed_tools", [])
    if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
        raise doc.error("a list of tool names", "allowed_tools")
    # Tools other apps register (ask_tether ...) may not be loaded yet: only refuse typos of
    # the names this app knows about when no other app could provide them.
    for i, tool in enumerate(tools):
        if TOOLS.get(tool) is None and tool not in {"ask_tether", "propose_pipeline_change"}:
            raise doc.error(f"unknown tool {tool!r}", "allowed_tools", i)
    from psychonauts.executors import EXECUTORS

    executor = data.get("executor", "ours")
    if executor not in EXECUTORS:
        raise doc.error(
            f"unknown executor {executor!r} (known: {', '.join(EXECUTORS)})", "executor"
        )
    fields: dict[str, object] = {
        "name": name,
        "description": str(data.get("description", "")),
        "system_prompt": prompt.strip(),
        "provider": provider,
        "model": str(data.get("model", "") or ""),
        "allowed_tools": tools,
        "executor": executor,
        "source": str(path),
    }
    for key, default in (("max_turns", 30), ("timeout_s", 1800)):
        value = data.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise doc.error("a positive whole number", key)
        fields[key] = value
    return fields


@transaction.atomic
def roles_load(path: Path) -> list[Role]:
    """Load a role file or every *.yaml of a folder; creates or updates roles by name.

    Every file is validated before anything is written, so a bad file changes nothing.
    """
    path = Path(path)
    files = sorted(path.glob("*.yaml")) if path.is_dir() else [path]
    if not files:
        raise InvalidDefinition(f"{path}: no role files (*.yaml)")
    parsed = [role_parse(f) for f in files]
    roles = []
    for fields in parsed:
        name = str(fields.pop("name"))
        role, _ = Role.objects.update_or_create(name=name, defaults=fields)
        roles.append(role)
    return roles


def roles_sync_defaults() -> list[Role]:
    """Create the shipped roles that are missing; never overwrites an operator's edits."""
    existing = set(Role.objects.values_list("name", flat=True))
    missing = [
        f for f in sorted(Path(settings.PSYCHONAUTS_ROLE_DIR).glob("*.yaml"))
        if f.stem not in existing
    ]  # fmt: skip
    created = []
    for path in missing:
        fields = role_parse(path)
        name = str(fields.pop("name"))
        role, made = Role.objects.get_or_create(name=name, defaults=fields)
        if made:
            created.append(role)
    return created
