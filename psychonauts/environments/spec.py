"""A repository's environment declaration: how its toolchain is built and what it exposes.

The declaration lives in the repository at DECLARATION_PATH (read from a commit, never from a
worktree an agent can write) or is given by the operator; the operator's wins, whole. It is
read through the safe YAML reader, and every field is checked here, so a bad one is refused
with its file and line before anything runs.

```yaml
setup:                       # shell commands, run in order in the build's sandbox
  - python3 -m venv /run/env/venv
  - /run/env/venv/bin/pip install -r requirements.txt
key_files: [requirements.txt] # their content (with the declaration) decides when to rebuild
variables: {PYTHONDONTWRITEBYTECODE: "1"}
path: [venv/bin]             # PATH entries, relative to the environment's folder
network: [pypi.org, files.pythonhosted.org]   # hosts setup may reach (default: registries)
timeout_s: 900               # the whole setup's wall time
```
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from core.safeyaml import InputRefused, yaml_load
from psychonauts.environments.errors import EnvironmentInvalid

DECLARATION_PATH = ".annihilation/environment.yaml"

# The package registries setup may reach unless the declaration names its own hosts.
DEFAULT_REGISTRIES: tuple[str, ...] = (
    "pypi.org",
    "files.pythonhosted.org",
    "registry.npmjs.org",
    "registry.yarnpkg.com",
    "proxy.golang.org",
    "sum.golang.org",
    "crates.io",
    "static.crates.io",
    "index.crates.io",
    "rubygems.org",
    "repo.maven.apache.org",
)

_FIELDS = {"setup", "key_files", "variables", "path", "network", "timeout_s"}
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# Variables the sandbox sets itself: a declaration may not replace them.
_RESERVED = {"PATH", "HOME", "TMPDIR", "ANNIHILATION_ENV", "ANNIHILATION_AGENT"}
_HOST = re.compile(
    r"(\*\.)?[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*"
)
MAX_SETUP = 50
MAX_KEY_FILES = 50


@dataclass(frozen=True)
class EnvironmentSpec:
    """A checked declaration. Empty `setup`: the repository has no environment to build."""

    setup: tuple[str, ...] = ()
    key_files: tuple[str, ...] = ()
    variables: tuple[tuple[str, str], ...] = ()
    path: tuple[str, ...] = ()
    network: tuple[str, ...] = DEFAULT_REGISTRIES
    timeout_s: float | None = None
    source: str = field(default="", compare=False)  # where it was read (for messages)

    def as_data(self) -> dict[str, Any]:
        return {
            "setup": list(self.setup),
            "key_files": list(self.key_files),
            "variables": dict(self.variables),
            "path": list(self.path),
            "network": list(self.network),
            "timeout_s": self.timeout_s,
        }

    def digest(self) -> str:
        """The declaration's part of an environment's key."""
        text = json.dumps(self.as_data(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def _strings(value: Any, name: str, *, limit: int) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ValueError(f"`{name}` must be a list of non-empty strings")
    if len(value) > limit:
        raise ValueError(f"`{name}` has {len(value)} entries, more than {limit}")
    return tuple(v.strip() for v in value)


def _relative(path: str, name: str) -> str:
    parts = path.split("/")
    if path.startswith("/") or ".." in parts or "\\" in path or "\0" in path:
        raise ValueError(f"`{name}` entry {path!r} must be a relative path inside the repository")
    return "/".join(p for p in parts if p not in ("", "."))


def spec_from_data(data: Any, *, source: str = "") -> EnvironmentSpec:
    """A checked spec from parsed data; EnvironmentInvalid naming `source` and the field."""
    where = source or "environment declaration"
    if data is None:
        return EnvironmentSpec(source=source)
    if not isinstance(data, Mapping):
        raise EnvironmentInvalid(f"{where}: must be a mapping of {', '.join(sorted(_FIELDS))}")
    unknown = sorted(str(k) for k in data if k not in _FIELDS)
    if unknown:
        raise EnvironmentInvalid(
            f"{where}: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(_FIELDS))}"
        )
    try:
        setup = _strings(data.get("setup"), "setup", limit=MAX_SETUP)
        key_files = tuple(
            _relative(p, "key_files")
            for p in _strings(data.get("key_files"), "key_files", limit=MAX_KEY_FILES)
        )
        variables = data.get("variables") or {}
        if not isinstance(variables, Mapping):
            raise ValueError("`variables` must be a mapping of names to strings")
        pairs: list[tuple[str, str]] = []
        for name, value in variables.items():
            if not isinstance(name, str) or not _VARIABLE.fullmatch(name):
                raise ValueError(f"`variables`: {name!r} is not a variable name")
            if name in _RESERVED:
                raise ValueError(f"`variables`: {name} is set by the sandbox itself")
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                raise ValueError(f"`variables`: {name} must be a string")
            pairs.append((name, str(value)))
        path = tuple(
            p if p.startswith("/") else _relative(p, "path")
            for p in _strings(data.get("path"), "path", limit=MAX_KEY_FILES)
        )
        if any(":" in p for p in path):
            raise ValueError("`path` entries may not contain ':'")
        network_raw = data.get("network", list(DEFAULT_REGISTRIES))
        network = tuple(h.lower() for h in _strings(network_raw, "network", limit=200))
        bad = [h for h in network if not _HOST.fullmatch(h)]
        if bad:
            raise ValueError(f"`network`: {bad[0]!r} is not a host name (`*.example.org` allowed)")
        timeout = data.get("timeout_s")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
        ):
            raise ValueError("`timeout_s` must be a positive number of seconds")
    except ValueError as exc:
        raise EnvironmentInvalid(f"{where}: {exc}") from None
    return EnvironmentSpec(
        setup=setup,
        key_files=key_files,
        variables=tuple(sorted(pairs)),
        path=path,
        network=network,
        timeout_s=float(timeout) if timeout is not None else None,
        source=source,
    )


def spec_parse(text: str, *, source: str = DECLARATION_PATH) -> EnvironmentSpec:
    """A spec from YAML text (the safe reader's limits); EnvironmentInvalid with file:line."""
    try:
        data = yaml_load(text)
    except InputRefused as exc:
        raise EnvironmentInvalid(exc.where(source)) from None
    return spec_from_data(data, source=source)


def spec_choose(
    repository: EnvironmentSpec | None, operator: EnvironmentSpec | None
) -> EnvironmentSpec | None:
    """The declaration in force: the operator's when given (whole), else the repository's."""
    return operator if operator is not None else repository
