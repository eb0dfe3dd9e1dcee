"""YAML with line numbers, so a malformed role or script names its file, line and field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from psychonauts.errors import InvalidDefinition


class YamlDoc:
    """A parsed YAML document plus its node tree, for error messages that point at a line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise InvalidDefinition(f"{path}: cannot read: {exc.strerror}") from None
        try:
            self.node = yaml.compose(text, Loader=yaml.SafeLoader)
            self.data: Any = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f":{mark.line + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc)
            raise InvalidDefinition(f"{path}{line}: invalid YAML: {problem}") from None

    def line(self, *keys: str | int) -> int:
        """1-based line of the value at `keys` (or of the nearest existing parent)."""
        node = self.node
        line = node.start_mark.line + 1 if node is not None else 1
        for key in keys:
            child = None
            if isinstance(node, yaml.MappingNode):
                for k, v in node.value:
                    if k.value == key:
                        child = v
                        line = k.start_mark.line + 1
                        break
            elif (
                isinstance(node, yaml.SequenceNode)
                and isinstance(key, int)
                and key < len(node.value)
            ):
                child = node.value[key]
                line = child.start_mark.line + 1
            if child is None:
                break
            node = child
        return line

    def error(self, message: str, *keys: str | int) -> InvalidDefinition:
        field = ".".join(str(k) for k in keys) or "(document)"
        return InvalidDefinition(f"{self.path}:{self.line(*keys)}: {field}: {message}")
