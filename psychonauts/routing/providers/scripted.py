"""`scripted`: a deterministic, offline provider that plays a YAML script of turns.

A script (psychonauts/scripts/*.yaml, plus ANNIHILATION_SCRIPT_DIRS):

    name: coder-default
    match: {roles: [coder], labels: []}    # most specific match wins; label `script:<name>`
    turns:                                 # on a quantum forces a script by name
      - text: "Writing the file."
        tools:
          - write_file: {path: "notes/q{quantum_id}.md", content: "hello\n"}
      - fail: "simulated overload"         # the provider fails (the run ends in error) ...
        attempts: [1]                      # ... only on these attempts
      - sleep: 1.0                         # seconds before answering (benchmarks)
        text: "Done."
        usage: {input_tokens: 1200, output_tokens: 300, model: claude-haiku-4-5}
      - choose:                            # one turn, the first alternative whose `when` holds:
          - when: {prompt: "run the tests"}  # the prompt (system and task) has it, any case
            text: "As the playbook says, running the tests."
          - when: {result: "FAILED"}         # the last tool result contains the text
            text: "A test failed."
          - text: "No condition: the default."

`usage` reports what the turn used, priced as `model` (default `scripted`, which costs nothing);
without it the tokens are estimated from the conversation's length.

The turn played is the number of assistant messages already in the conversation, so a resumed
run continues the script where its checkpoint stopped. `{quantum_id}`, `{agent_id}`, `{role}`,
`{attempt}` and `{depth}` are substituted in every string (and in `when` texts). A `choose`
whose alternatives all have a `when` and none holds is a turn that ends the run with a short
answer.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from psychonauts.errors import InvalidDefinition, ProviderError
from psychonauts.routing.providers.base import (
    ContentBlock,
    Message,
    OnText,
    ProviderRequest,
    ProviderResponse,
    RunInfo,
)
from psychonauts.yamlfile import YamlDoc

_TURN_KEYS = {"text", "tools", "fail", "attempts", "sleep", "usage", "choose"}
_ALTERNATIVE_KEYS = _TURN_KEYS - {"choose", "attempts"} | {"when"}
_WHEN_KEYS = {"prompt", "result"}
_USAGE_KEYS = {"input_tokens", "output_tokens", "model"}


@dataclass(frozen=True)
class ScriptUsage:
    """What a turn reports it used (its cost is priced as `model`)."""

    input_tokens: int
    output_tokens: int
    model: str


@dataclass(frozen=True)
class When:
    """A condition on the request: every given text is contained (ignoring case) in the
    prompt (`prompt`: the system prompt and the task, where the playbook's rules are) or in the
    last tool result (`result`)."""

    prompt: str = ""
    result: str = ""

    def holds(self, request: ProviderRequest) -> bool:
        prompt = _substitute(self.prompt, request.run).lower()
        result = _substitute(self.result, request.run).lower()
        return (not prompt or prompt in _prompt(request).lower()) and (
            not result or result in _last_result(request.messages).lower()
        )


@dataclass(frozen=True)
class ScriptTurn:
    text: str
    tools: tuple[tuple[str, dict[str, Any]], ...]
    fail: str
    attempts: tuple[int, ...]
    sleep: float
    usage: ScriptUsage | None = None
    when: When | None = None
    choose: tuple[ScriptTurn, ...] = ()

    def resolve(self, request: ProviderRequest) -> ScriptTurn | None:
        """The turn to play: itself, or for a `choose` the first alternative that holds."""
        if not self.choose:
            return self
        for alternative in self.choose:
            if alternative.when is None or alternative.when.holds(request):
                return alternative
        return None


@dataclass(frozen=True)
class Script:
    name: str
    roles: tuple[str, ...]
    labels: tuple[str, ...]
    turns: tuple[ScriptTurn, ...]
    path: Path


def _parse_tool(doc: YamlDoc, raw: Any, keys: tuple[str | int, ...]) -> tuple[str, dict[str, Any]]:
    if isinstance(raw, dict) and "name" in raw:
        name, args = raw["name"], raw.get("input", {})
    elif isinstance(raw, dict) and len(raw) == 1:
        ((name, args),) = raw.items()
        args = {} if args is None else args
    else:
        raise doc.error("each tool call is `{tool_name: {args}}`", *keys)
    if not isinstance(name, str) or not isinstance(args, dict):
        raise doc.error("a tool call needs a name and a mapping of arguments", *keys)
    return name, args


def _parse_usage(doc: YamlDoc, raw: Any, keys: tuple[str | int, ...]) -> ScriptUsage | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise doc.error("a mapping of input_tokens, output_tokens and model", *keys)
    unknown = set(raw) - _USAGE_KEYS
    if unknown:
        raise doc.error(f"unknown key {sorted(unknown)[0]!r}", *keys)
    tokens = []
    for key in ("input_tokens", "output_tokens"):
        value = raw.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise doc.error("a number of tokens (0 or more)", *keys, key)
        tokens.append(value)
    model = raw.get("model", "scripted")
    if not isinstance(model, str) or not model:
        raise doc.error("a model name (its price is the cost)", *keys, "model")
    return ScriptUsage(tokens[0], tokens[1], model)


def _parse_when(doc: YamlDoc, raw: Any, keys: tuple[str | int, ...]) -> When | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not raw:
        raise doc.error("a mapping of `prompt` and/or `result` texts", *keys)
    unknown = set(raw) - _WHEN_KEYS
    if unknown:
        raise doc.error(f"unknown key {sorted(unknown)[0]!r} (prompt, result)", *keys)
    for key, value in raw.items():
        if not isinstance(value, str) or not value:
            raise doc.error("a non-empty text", *keys, key)
    return When(prompt=raw.get("prompt", ""), result=raw.get("result", ""))


def _parse_turn(
    doc: YamlDoc, raw: Any, keys: tuple[str | int, ...], *, alternative: bool = False
) -> ScriptTurn:
    allowed = _ALTERNATIVE_KEYS if alternative else _TURN_KEYS
    if not isinstance(raw, dict):
        raise doc.error(f"a turn is a mapping ({', '.join(sorted(allowed))})", *keys)
    unknown = set(raw) - allowed
    if unknown:
        raise doc.error(f"unknown key {sorted(unknown)[0]!r}", *keys)
    attempts = raw.get("attempts") or []
    if not isinstance(attempts, list) or not all(isinstance(a, int) for a in attempts):
        raise doc.error("a list of attempt numbers", *keys, "attempts")
    if "choose" in raw:
        options = raw["choose"]
        if set(raw) - {"choose", "attempts"}:
            raise doc.error("a `choose` turn holds only `choose` (and `attempts`)", *keys)
        if not isinstance(options, list) or not options:
            raise doc.error("a non-empty list of alternative turns", *keys, "choose")
        choose = tuple(
            _parse_turn(doc, option, (*keys, "choose", j), alternative=True)
            for j, option in enumerate(options)
        )
        return ScriptTurn("", (), "", tuple(attempts), 0.0, choose=choose)
    text, fail = raw.get("text", ""), raw.get("fail", "")
    if not isinstance(text, str):
        raise doc.error("a string", *keys, "text")
    if not isinstance(fail, str):
        raise doc.error("a string (the failure message)", *keys, "fail")
    sleep = raw.get("sleep", 0)
    if not isinstance(sleep, int | float) or sleep < 0:
        raise doc.error("a number of seconds", *keys, "sleep")
    tools = raw.get("tools") or []
    if not isinstance(tools, list):
        raise doc.error("a list of tool calls", *keys, "tools")
    parsed = tuple(_parse_tool(doc, t, (*keys, "tools", j)) for j, t in enumerate(tools))
    usage = _parse_usage(doc, raw.get("usage"), (*keys, "usage"))
    when = _parse_when(doc, raw.get("when"), (*keys, "when"))
    return ScriptTurn(text, parsed, fail, tuple(attempts), float(sleep), usage, when)


def script_parse(path: Path) -> Script:
    doc = YamlDoc(path)
    data = doc.data
    if not isinstance(data, dict):
        raise doc.error("a script is a mapping with `name` and `turns`")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise doc.error("required, a non-empty string", "name")
    match = data.get("match") or {}
    if not isinstance(match, dict):
        raise doc.error("a mapping with `roles` and `labels`", "match")
    roles, labels = match.get("roles") or [], match.get("labels") or []
    for key, value in (("roles", roles), ("labels", labels)):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise doc.error("a list of strings", "match", key)
    raw_turns = data.get("turns")
    if not isinstance(raw_turns, list) or not raw_turns:
        raise doc.error("required, a non-empty list of turns", "turns")
    turns = [_parse_turn(doc, raw, ("turns", i)) for i, raw in enumerate(raw_turns)]
    return Script(name, tuple(roles), tuple(labels), tuple(turns), path)


_cache: dict[Path, tuple[float, Script]] = {}


def scripts_load() -> list[Script]:
    scripts = []
    for folder in settings.PSYCHONAUTS_SCRIPT_DIRS:
        for path in sorted(Path(folder).glob("*.yaml")):
            mtime = path.stat().st_mtime
            cached = _cache.get(path)
            if cached is None or cached[0] != mtime:
                cached = (mtime, script_parse(path))
                _cache[path] = cached
            scripts.append(cached[1])
    return scripts


def script_for(run: RunInfo) -> Script:
    scripts = scripts_load()
    forced = [lbl.removeprefix("script:") for lbl in run.labels if lbl.startswith("script:")]
    if forced:
        for script in scripts:
            if script.name == forced[0]:
                return script
        raise ProviderError(f"scripted: no script named {forced[0]!r}")
    candidates = [
        s
        for s in scripts
        if (not s.roles or run.role in s.roles) and set(s.labels) <= set(run.labels)
    ]
    if not candidates:
        raise ProviderError(f"scripted: no script matches role {run.role!r}")
    # Most specific wins: more labels first, then a role-specific script over a generic one.
    return max(candidates, key=lambda s: (len(s.labels), bool(s.roles), s.name))


def _substitute(value: Any, run: RunInfo) -> Any:
    if isinstance(value, str):
        for key, sub in (
            ("{quantum_id}", str(run.quantum_id)),
            ("{agent_id}", run.agent_id),
            ("{role}", run.role),
            ("{attempt}", str(run.attempt)),
            ("{depth}", str(run.depth)),
        ):
            value = value.replace(key, sub)
        return value
    if isinstance(value, list):
        return [_substitute(v, run) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, run) for k, v in value.items()}
    return value


def _text_of(content: str | list[Any]) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(
        str(block.get("content", block.get("text", "")))
        for block in content
        if isinstance(block, dict)
    )


def _prompt(request: ProviderRequest) -> str:
    first = next((m for m in request.messages if m["role"] == "user"), None)
    return request.system + "\n" + (_text_of(first["content"]) if first else "")


def _last_result(messages: list[Message]) -> str:
    """The text of the conversation's last user message (its tool results, in a tool loop)."""
    for message in reversed(messages):
        if message["role"] != "user":
            continue
        return _text_of(message["content"])
    return ""


class ScriptedProvider:
    name = "scripted"
    uses_llm = False

    def complete(self, request: ProviderRequest, on_text: OnText) -> ProviderResponse:
        run = request.run
        try:
            script = script_for(run)
        except InvalidDefinition as exc:
            raise ProviderError(str(exc)) from None
        turns = [t for t in script.turns if not t.attempts or run.attempt in t.attempts]
        index = sum(1 for m in request.messages if m["role"] == "assistant")
        if index >= len(turns):
            text = f"(script {script.name} has no more turns)"
            on_text(text)
            return ProviderResponse([{"type": "text", "text": text}], "end_turn", model="scripted")
        turn = turns[index].resolve(request)
        if turn is None:
            text = f"(script {script.name}: no alternative of turn {index + 1} holds)"
            on_text(text)
            return ProviderResponse([{"type": "text", "text": text}], "end_turn", model="scripted")
        if turn.sleep:
            time.sleep(turn.sleep)
        if turn.fail:
            raise ProviderError(_substitute(turn.fail, run))
        content: list[ContentBlock] = []
        if turn.text:
            text = _substitute(turn.text, run)
            # Stream it in a few pieces, as a real model would.
            for start in range(0, len(text), 40):
                on_text(text[start : start + 40])
            content.append({"type": "text", "text": text})
        for j, (name, args) in enumerate(turn.tools):
            content.append(
                {
                    "type": "tool_use",
                    # Unique, as a model's are: a run that starts over (another host took it
                    # over, psychonauts/workspaces/central.py) plays the script's turns again.
                    "id": f"toolu_s{index}_{j}_{uuid.uuid4().hex[:8]}",
                    "name": name,
                    "input": _substitute(args, run),
                }
            )
        stop = "tool_use" if turn.tools else "end_turn"
        if turn.usage is not None:
            return ProviderResponse(
                content,
                stop,
                tokens_in=turn.usage.input_tokens,
                tokens_out=turn.usage.output_tokens,
                model=turn.usage.model,
            )
        return ProviderResponse(
            content,
            stop,
            tokens_in=sum(len(str(m["content"])) for m in request.messages) // 4,
            tokens_out=len(turn.text) // 4,
            model="scripted",
        )
