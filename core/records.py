"""Records from an import file: a YAML list of mappings (or `<key>:` and one), or one JSON
object per line. Each record comes with the line it starts on, so that an importer can report
its problems as `file:line: field: why` and write nothing while any remains (all or nothing).

The file is read through core.safeyaml, with its limits; what cannot be read or parsed, and a
document that holds no list, is InputRefused with its line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.safeyaml import InputRefused, LineMap, json_load, read_text, yaml_load

JSONL_SUFFIXES = frozenset({".jsonl", ".ndjson"})
YAML_SUFFIXES = frozenset({".yaml", ".yml", ".json"})  # JSON is YAML to the parser


def records_read(
    path: Path, *, key: str, not_a_list: str, sniff_jsonl: bool = False
) -> list[tuple[int, Any]]:
    """(line, raw record) pairs of the file at `path`, in file order.

    A `.jsonl` or `.ndjson` file is JSON lines (blank lines skipped); with `sniff_jsonl`, so is
    a file of another suffix (not YAML or JSON) whose text starts with `{`. Anything else is
    YAML: a list, or a mapping whose `key` holds the list; an empty document has no records.
    A YAML mapping comes back as a LineMap (the line of each of its keys' values).
    InputRefused(line, why) when the file cannot be read, a line or the document does not
    parse, or the document is not a list (`not_a_list`, on line 1).
    """
    text = read_text(path)
    is_jsonl = path.suffix in JSONL_SUFFIXES or (
        sniff_jsonl and path.suffix not in YAML_SUFFIXES and text.lstrip().startswith("{")
    )
    if is_jsonl:
        # Split on newlines only: a JSON string may hold U+2028, which splitlines() splits on.
        return [
            (number, json_load(line, line=number))
            for number, line in enumerate(text.split("\n"), start=1)
            if line.strip()
        ]
    data = yaml_load(text, line_maps=True)
    if isinstance(data, dict) and key in data:
        data = data[key]
    if data is None:
        return []
    if not isinstance(data, list):
        raise InputRefused(1, not_a_list)
    return [(item.line if isinstance(item, LineMap) else 1, item) for item in data]
