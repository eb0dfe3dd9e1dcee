"""YAML with line numbers, so a malformed role or script names its file, line and field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from core.safeyaml import InputRefused, read_text, yaml_parse
from psychonauts.errors import InvalidDefinition


class YamlDoc:
    """A parsed YAML document plus its node tree, for error messages that point at a line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.node: yaml.Node | None
        self.data: Any
        try:
            self.node, self.data = yaml_parse(read_text(path))
        except InputRefused as exc:
            raise InvalidDefinition(exc.where(str(path))) from None

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
