"""Answers recorded from a real small model, replayed by the fake OpenAI server so the suite
keeps the cases without the model: Qwen2.5-Coder-1.5B-Instruct (Q4_K_M) under llama.cpp's
server (`xllamacpp`, n_ctx 8192, `--jinja`), asked through the chat-completions API with tools.
"""

from __future__ import annotations

from tests.fakes.openai_server import FakeReply

# Asked to create hello.txt with the write_file tool, it wrote the call as a fenced JSON block in
# its text, with no tool call in the API's sense (finish_reason "stop").
TEXT_TOOL_CALL = (
    "```json\n"
    "{\n"
    '    "name": "write_file",\n'
    '    "arguments": {\n'
    '        "path": "hello.txt",\n'
    '        "content": "hi"\n'
    "    }\n"
    "}\n"
    "```"
)


def text_tool_call() -> FakeReply:
    return FakeReply(text=TEXT_TOOL_CALL, finish="stop", tokens_in=183, tokens_out=37)


# Asked to write calc.py whole with write_file (temperature 0.8), 2 of 14 answers wrote a fenced
# block that is not JSON; this one holds the file's content as a Python triple-quoted string.
# Not a call.
TEXT_CALL_PYTHON_STRING = (
    "```json\n{\n"
    '    "name": "write_file",\n'
    '    "arguments": {\n'
    '        "path": "calc.py",\n'
    '        "content": """\n'
    "        def add(a, b):\n"
    "            return a + b\n\n"
    "        def sub(a, b):\n"
    "            return a - b\n"
    '        """\n'
    "    }\n}\n```"
)


# The same request with max_tokens 12: the answer stopped half way through the call it was
# writing, finish_reason "length".
CUT_TEXT = '```json\n{\n    "name": "write_file",\n'


def cut_text_call() -> FakeReply:
    return FakeReply(text=CUT_TEXT, finish="length", tokens_in=183, tokens_out=12)


def cut_tool_call() -> FakeReply:
    """A tool call in the API's sense cut by the output limit: its arguments end half way."""
    return FakeReply(
        tool_calls=[("write_file", {"path": "hello.txt", "content": "hi " * 40})],
        arguments_cut=30,
        finish="length",
        tokens_out=12,
    )


# A conversation over the context (n_ctx 8192): llama.cpp refuses it before any work, HTTP 400.
CONTEXT_OVERFLOW_ERROR = {
    "error": {
        "code": 400,
        "message": "request (9175 tokens) exceeds the available context size (8192 tokens), "
        "try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 9175,
        "n_ctx": 8192,
    }
}


def context_overflow() -> FakeReply:
    return FakeReply(status=400, error=CONTEXT_OVERFLOW_ERROR)


def repeated_verdict(n: int = 1) -> FakeReply:
    """A reviewer that recorded its verdict and calls report_verdict again (and again)."""
    return FakeReply(
        tool_calls=[("report_verdict", {"verdict": "pass", "reasons": f"looks fine (call {n})"})]
    )
