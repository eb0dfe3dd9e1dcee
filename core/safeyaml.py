"""Reading YAML and JSON from outside: import files, uploads, pipelines, roles and scripts.

Every reader of such a file goes through here, so each gets the same limits:

- the file is read up to `settings.IMPORT_MAX_BYTES` (+1 byte to notice more), never whole
  first: `/dev/zero` or a huge file stops at the limit;
- NUL bytes and bytes that are not UTF-8 are refused with their line;
- YAML aliases are budgeted while the document is composed: at most MAX_ALIASES of them, and
  together they may add at most MAX_ALIAS_NODES nodes (each counted with everything below it).
  A "billion laughs" file fails at the alias that crosses the budget, before any structure is
  built, with a short message; a recursive alias is refused;
- nesting deeper than MAX_DEPTH and documents of more than MAX_NODES nodes are refused (the
  pure-Python YAML parser's memory and time grow with every node);
- a key that appears twice in a mapping is refused, naming both lines;
- a value a constructor cannot make (a 5,000-digit number, the 45th of the 13th month) is a
  problem with its line, not a ValueError.

Problems are `InputRefused(line, why)`; callers say `file:line: why` in their own error type.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from django.conf import settings

from core.safetext import display_name, quoted, text_problem

MAX_DEPTH = 50
MAX_NODES = 250_000
MAX_ALIASES = 100
MAX_ALIAS_NODES = 10_000
PROBLEM_MAX = 200  # characters of a parser's own message

_MERGE_TAG = "tag:yaml.org,2002:merge"


class InputRefused(Exception):
    """A file or document that cannot be read. `line` is 1-based; 0 means the whole file."""

    def __init__(self, line: int, why: str) -> None:
        self.line = line
        self.why = why
        super().__init__(why)

    def where(self, source: str) -> str:
        """`source:line: why` (`source: why` for the whole file)."""
        return f"{source}:{self.line}: {self.why}" if self.line else f"{source}: {self.why}"


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n:,} bytes"


def read_bytes(path: Path, *, limit: int | None = None) -> bytes:
    """The file's bytes; InputRefused when it cannot be read or holds more than `limit`."""
    limit = settings.IMPORT_MAX_BYTES if limit is None else limit
    try:
        with path.open("rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise InputRefused(0, f"cannot read: {exc.strerror or exc}") from None
    except ValueError:  # a NUL in the path
        raise InputRefused(0, "cannot read: the path contains a NUL character") from None
    if len(data) > limit:
        raise InputRefused(
            0, f"larger than the import limit of {_size(limit)} (ANNIHILATION_IMPORT_MAX_BYTES)"
        )
    return data


def decode_text(data: bytes) -> str:
    """UTF-8 text without NUL bytes (a leading byte order mark is dropped)."""
    nul = data.find(b"\x00")
    if nul >= 0:
        raise InputRefused(data.count(b"\n", 0, nul) + 1, "contains a NUL byte")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputRefused(line, f"not valid UTF-8 (byte {data[exc.start]:#04x})") from None
    return text.removeprefix("\ufeff")


def read_text(path: Path, *, limit: int | None = None) -> str:
    return decode_text(read_bytes(path, limit=limit))


def source_name(path: Path) -> str:
    """The file's name as messages and events show it."""
    return display_name(path.name)


class LineMap(dict[str, Any]):
    """A YAML mapping (keys as text) that remembers its line and the line of each key's value."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.line = 0
        self.lines: dict[str, int] = {}


def _line(node: yaml.Node | yaml.Event) -> int:
    mark = node.start_mark
    return int(mark.line) + 1 if mark is not None else 1


class _BoundedLoader(yaml.SafeLoader):
    """A SafeLoader that counts while it composes and checks while it constructs."""

    def __init__(self, text: str, *, line_maps: bool) -> None:
        super().__init__(text)
        self.line_maps = line_maps
        self.depth = 0
        self.nodes = 0
        self.aliases = 0
        self.alias_nodes = 0
        # Each composed node's size with its aliases expanded, by id (the tree keeps the nodes
        # alive, so an id is not reused): what an alias to it would add.
        self.sizes: dict[int, int] = {}

    def _next_event(self) -> yaml.Event:
        event: yaml.Event = self.peek_event()  # type: ignore[no-untyped-call]
        return event

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self._next_event()
            assert isinstance(event, yaml.AliasEvent)
            target = self.anchors.get(event.anchor)
            if target is not None:  # an undefined alias is the composer's own error
                self._count_alias(event, target)
            return super().compose_node(parent, index)
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise InputRefused(_line(self._next_event()), f"nested deeper than {MAX_DEPTH} levels")
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise InputRefused(
                _line(self._next_event()),
                f"more than {MAX_NODES:,} YAML nodes (split the file, or use JSON lines)",
            )
        node = super().compose_node(parent, index)
        self.depth -= 1
        size = 1
        if isinstance(node, yaml.SequenceNode):
            size += sum(self.sizes[id(child)] for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            size += sum(self.sizes[id(k)] + self.sizes[id(v)] for k, v in node.value)
        self.sizes[id(node)] = size
        return node

    def _count_alias(self, event: yaml.AliasEvent, target: yaml.Node) -> None:
        self.aliases += 1
        if self.aliases > MAX_ALIASES:
            raise InputRefused(_line(event), f"more than {MAX_ALIASES} aliases (*name)")
        size = self.sizes.get(id(target))
        if size is None:
            raise InputRefused(
                _line(event), f"alias *{_clip(event.anchor or '')} is inside the node it names"
            )
        self.alias_nodes += size
        if self.alias_nodes > MAX_ALIAS_NODES:
            raise InputRefused(
                _line(event),
                f"aliases would expand the document by more than {MAX_ALIAS_NODES:,} nodes",
            )

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as exc:
            raise InputRefused(
                _line(node), f"cannot read the value {quoted(node.value)}: {_clip(str(exc))}"
            ) from None

    def construct_scalar(self, node: yaml.ScalarNode | yaml.MappingNode) -> Any:
        value = super().construct_scalar(node)
        problem = text_problem(value) if isinstance(value, str) else None
        if problem is not None:
            raise InputRefused(_line(node), f"a value {problem}")
        return value

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            first: dict[str, int] = {}
            # The raw pairs, before merge keys (`<<: *base`) are flattened in: a key that
            # overrides a merged one is not a duplicate.
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                text = str(key)
                line = _line(key_node)
                if text in first:
                    raise InputRefused(
                        line, f"key {quoted(text)} appears twice (first at line {first[text]})"
                    )
                first[text] = line
        return super().construct_mapping(node, deep=deep)


def _construct_line_map(loader: _BoundedLoader, node: yaml.MappingNode) -> Any:
    if not loader.line_maps:
        return loader.construct_yaml_map(node)
    mapping = LineMap({str(k): v for k, v in loader.construct_mapping(node, deep=True).items()})
    mapping.line = _line(node)
    mapping.lines = {
        str(loader.construct_object(key, deep=True)): _line(value) for key, value in node.value
    }
    return mapping


_BoundedLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_line_map)


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= PROBLEM_MAX else text[:PROBLEM_MAX] + "…"


def _error_line(exc: yaml.YAMLError, text: str) -> int:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is not None:
        return int(mark.line) + 1
    position = getattr(exc, "position", None)  # a ReaderError: a character YAML does not allow
    if isinstance(position, int):
        return text.count("\n", 0, position) + 1
    return 1


def yaml_parse(text: str, *, line_maps: bool = False) -> tuple[yaml.Node | None, Any]:
    """The document's node tree and its data; mappings are LineMaps when `line_maps`."""
    try:
        loader = _BoundedLoader(text, line_maps=line_maps)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.reader.ReaderError as exc:
        why = f"character {exc.character:#06x} is not allowed in YAML"
        raise InputRefused(_error_line(exc, text), why) from None
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputRefused(_error_line(exc, text), f"not valid YAML: {_clip(problem)}") from None
    return node, data


def yaml_load(text: str, *, line_maps: bool = False) -> Any:
    return yaml_parse(text, line_maps=line_maps)[1]


def json_load(text: str, *, line: int = 1) -> Any:
    """One JSON value with the YAML reader's limits on nesting and text (`line` for messages)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputRefused(line, f"not valid JSON: {exc.msg}") from None
    except ValueError:  # Python's own limit on the digits of a number
        raise InputRefused(line, "not valid JSON: a number with too many digits") from None
    except RecursionError:
        raise InputRefused(line, f"nested deeper than {MAX_DEPTH} levels") from None
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InputRefused(line, f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(item, str):
            problem = text_problem(item)
            if problem is not None:
                raise InputRefused(line, f"a value {problem}")
        elif isinstance(item, dict):
            stack.extend((k, depth + 1) for k in item)
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return value
