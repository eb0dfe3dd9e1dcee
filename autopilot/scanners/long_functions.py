"""Functions longer than a limit (rule `long-function`).

Python: parsed (`ast`); a function's length runs from its `def` to its last line, decorators
not counted; methods and nested functions are named by their qualified name. A file that does
not parse is skipped.

Brace languages (JavaScript, TypeScript, Go, Rust, Java, Kotlin, C, C++, C#, Swift, PHP,
Scala): a conservative heuristic. Strings and comments are blanked out, a line that reads as a
named function's header (`function f(`, `func f(`, `fn f(`, `fun f(`, or `type name(...) {`
ending the line, control keywords excepted) opens a function at its first `{`, and the
matching `}` closes it. Anonymous functions are not reported; a header whose brace never
closes is not reported. Other languages are not scanned.
"""

from __future__ import annotations

import ast
import bisect
import re
from collections.abc import Iterator
from pathlib import PurePosixPath

from autopilot.scanners import ScanFinding

SCANNER = "long_function"
RULE = "long-function"
# A longer line is not read as a function's header (and the patterns stay linear in practice).
HEADER_MAX_CHARS = 300

BRACE_SUFFIXES: frozenset[str] = frozenset(
    {".js", ".jsx", ".mjs", ".cjs", ".ts", ".tsx", ".go", ".rs", ".java", ".kt", ".kts", ".c",
     ".h", ".cc", ".cpp", ".cxx", ".hpp", ".hh", ".cs", ".swift", ".php", ".scala"}
)  # fmt: skip
_KEYWORDS = frozenset(
    {"if", "for", "while", "switch", "catch", "return", "else", "new", "sizeof", "do", "try",
     "with", "match", "throw", "using", "lock", "foreach", "synchronized", "typeof", "await"}
)  # fmt: skip
_HEADERS = (
    re.compile(r"\bfunction\b\s*\*?\s*(?P<name>[A-Za-z_$][\w$]*)\s*(?:<[^>]*>)?\s*\("),
    re.compile(r"^\s*func\s+(?:\([^)]*\)\s*)?(?P<name>[A-Za-z_]\w*)\s*[(<\[]"),
    re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:(?:async|unsafe|const|extern)\s+)*fn\s+"
               r"(?P<name>[A-Za-z_]\w*)"),
    re.compile(r"^\s*(?:(?:private|public|protected|internal|override|suspend|inline|open)\s+)*"
               r"fun\s+(?:<[^>]*>\s*)?(?:[\w.]+\.)?(?P<name>[A-Za-z_]\w*)\s*\("),
    re.compile(r"^\s*(?:[\w:<>,*&\[\]]+\s+)+[*&]*(?P<name>[A-Za-z_~]\w*)\s*\([^;{}]*\)\s*"
               r"(?:const\s*)?(?:noexcept\s*)?(?:throws\s+[\w., ]+)?(?::\s*[\w<>\[\]|, ]+)?"
               r"\s*\{\s*$"),
    re.compile(r"^\s*(?:(?:async|static|get|set|public|private|protected)\s+)*"
               r"(?P<name>[A-Za-z_$][\w$]*)\s*\([^;{}]*\)\s*(?::\s*[^{;]+)?\{\s*$"),
)  # fmt: skip


def long_functions_scan(path: str, text: str, *, limit: int) -> list[ScanFinding]:
    """The functions of one file longer than `limit` lines, in order."""
    suffix = PurePosixPath(path).suffix.lower()
    if text.count("\n") + 1 <= limit:
        return []  # no function of it can be longer
    if suffix in (".py", ".pyi"):
        spans = list(_python_spans(text))
    elif suffix in BRACE_SUFFIXES:
        spans = list(_brace_spans(text))
    else:
        return []
    found = []
    for name, start, end in sorted(spans, key=lambda span: span[1]):
        length = end - start + 1
        if length > limit:
            found.append(
                ScanFinding(
                    scanner=SCANNER,
                    path=path,
                    line=start,
                    rule=RULE,
                    message=f"{name} is {length} lines long (limit {limit})",
                    key=name,
                )
            )
    return found


def _python_spans(text: str) -> Iterator[tuple[str, int, int]]:
    if "def " not in text:
        return
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return
    # Statements only (a function is defined by a statement; expressions hold only lambdas),
    # iteratively: the parser itself bounds how deep blocks nest.
    stack: list[tuple[list[ast.stmt], str]] = [(tree.body, "")]
    while stack:
        body, prefix = stack.pop()
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{node.name}"
                yield name, node.lineno, node.end_lineno or node.lineno
                stack.append((node.body, f"{name}.<locals>."))
            elif isinstance(node, ast.ClassDef):
                stack.append((node.body, f"{prefix}{node.name}."))
            else:
                for block in _blocks(node):
                    stack.append((block, prefix))


def _blocks(node: ast.stmt) -> Iterator[list[ast.stmt]]:
    """The statement lists inside a compound statement (if, for, while, with, try, match)."""
    for name in ("body", "orelse", "finalbody"):
        block = getattr(node, name, None)
        if isinstance(block, list):
            yield block
    for handler in getattr(node, "handlers", ()):
        yield handler.body
    for case in getattr(node, "cases", ()):
        yield case.body


def _blank(text: str) -> str:
    """`text` with the insides of strings and comments replaced by spaces (newlines kept), so
    braces in them do not count."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "/" and text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            out.append(" " * (end - i))
            i = end
        elif ch == "/" and text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif ch in "\"'`":
            j = i + 1
            while j < n and text[j] != ch:
                if text[j] == "\\":
                    j += 1
                elif text[j] == "\n" and ch != "`":
                    break  # an unclosed quote ends with its line (a char literal gone wrong)
                j += 1
            end = min(j + 1, n)
            out.append(ch + re.sub(r"[^\n]", " ", text[i + 1 : end - 1]) + text[end - 1 : end])
            i = end
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _brace_spans(text: str) -> Iterator[tuple[str, int, int]]:
    lines = _blank(text).split("\n")
    # Where each line starts in the joined text, to walk braces from a header on.
    joined = "\n".join(lines)
    starts = [0]
    for line in lines[:-1]:
        starts.append(starts[-1] + len(line) + 1)
    # The matching `}` of every `{`, in one pass.
    closes: dict[int, int] = {}
    opened: list[int] = []
    for index, ch in enumerate(joined):
        if ch == "{":
            opened.append(index)
        elif ch == "}" and opened:
            closes[opened.pop()] = index
    seen: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        if len(line) > HEADER_MAX_CHARS or "(" not in line:
            continue
        name = _header_name(line)
        if not name:
            continue
        brace = joined.find("{", starts[number - 1])
        # The body opens on the header's line or within the three after it, before any `;`.
        last = min(number + 2, len(lines) - 1)
        limit = starts[last] + len(lines[last])
        semicolon = joined.find(";", starts[number - 1])
        if brace < 0 or brace > limit or (0 <= semicolon < brace):
            continue
        close = closes.get(brace)
        if close is None:
            continue
        end_line = bisect.bisect_right(starts, close)
        seen[name] = seen.get(name, 0) + 1
        label = name if seen[name] == 1 else f"{name}#{seen[name]}"
        yield label, number, end_line


def _header_name(line: str) -> str:
    for pattern in _HEADERS:
        match = pattern.search(line)
        if match is None:
            continue
        name = match.group("name")
        before = line[: match.start("name")].split()
        if name in _KEYWORDS or (before and before[-1] in _KEYWORDS):
            continue
        return name
    return ""
