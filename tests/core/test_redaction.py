"""The redaction module: each kind of secret, the process's own secrets by value, ordinary code
left alone, streamed text, and every log record of the process."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from core.events import publish, publish_many
from core.models import Event
from core.redaction import (
    RedactingFilter,
    TextStream,
    extra_patterns_check,
    redact,
    redact_data,
    redaction_reload,
    secrets_found,
)
from tests.core.secret_shapes import ALL, SHAPES, Shape, leaked

AWS_ID = "AKIA" + "Q7X2M4K9P1R5T8W3"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzq8Vh3Tn2L"
GITHUB = "ghp_" + "Zx9Lm2Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0Lz9X"
ANTHROPIC = "sk-ant-api03-" + "Rt5Yu6Io7Pa8Sd9Fg0Hj1Kl2Zx3Cv4Bn5Mq6We7"
OPENAI = "sk-proj-" + "Nb4Vc5Xz6Lk7Jh8Gf9Ds0Aq1Wr2Et3Yu4"
KEY_BODY = [
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW",
    "QyNTUxOQAAACDq0w7sZ6p1Lw3bZkq9e8FvVrT5c2yXw0JmHn4uK1aQ8wAAAJg4o1xT",
]
SSH_KEY = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    + "\n".join(KEY_BODY)
    + "\n-----END OPENSSH PRIVATE KEY-----\n"
)
API_TOKEN = "ann_3f9a0c12b4e7_" + "Qz8-Xw7_Vu6Ts5Rq4Po3Nm2Lk1Jh0Gf9Ed8Cb7Aa6Zy"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"


@pytest.fixture(autouse=True)
def fresh_rules() -> Iterator[None]:
    """Each test builds the rules from its own settings and environment."""
    redaction_reload()
    yield
    redaction_reload()


@pytest.mark.parametrize(
    ("text", "secret", "shown"),
    [
        (f"id {AWS_ID} here", AWS_ID, "AKIA…(redacted)"),
        (f"AWS_SECRET_ACCESS_KEY={AWS_SECRET}", AWS_SECRET, "AWS_SECRET_ACCESS_KEY=…(redacted)"),
        (f"aws_secret_access_key = {AWS_SECRET}", AWS_SECRET, "aws_secret_access_key = …(redacted)"),
        (f'"SecretAccessKey": "{AWS_SECRET}"', AWS_SECRET, '"SecretAccessKey": "…(redacted)"'),
        (f"token {GITHUB}.", GITHUB, "ghp_…(redacted)."),
        (f"curl -H 'X: {API_TOKEN}'", API_TOKEN[17:], "X: ann_3f9a0c12b4e7_…(redacted)'"),
        ("github_pat_" + "B2c3" * 10, "B2c3" * 10, "github_pat_…(redacted)"),
        (f"key: {ANTHROPIC}", ANTHROPIC, "sk-ant-…(redacted)"),
        (f"use {OPENAI} now", OPENAI, "sk-proj-…(redacted)"),
        ("sk-" + "b" * 40, "b" * 40, "sk-…(redacted)"),
        (SSH_KEY + "after", KEY_BODY[0], "-----BEGIN OPENSSH PRIVATE KEY-----…(redacted)\nafter"),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7\n", "MIIEowIBAAKCAQEA7", "-----BEGIN RSA PRIVATE KEY-----…(redacted)"),
        (f"Bearer token: {JWT}", JWT, "eyJ…(redacted)"),
        ("Authorization: Bearer abc123def456ghi789", "abc123def456ghi789", "Authorization: Bearer …(redacted)"),
        ("export GITHUB_TOKEN=abcdefghijklmnop", "abcdefghijklmnop", "GITHUB_TOKEN=…(redacted)"),
        ("STRIPE_SECRET=whsec9x8y7z6", "whsec9x8y7z6", "STRIPE_SECRET=…(redacted)"),
        ("MY_API_KEY=abcd1234efgh", "abcd1234efgh", "MY_API_KEY=…(redacted)"),
        ("DB_PASSWORD=hunter2hunter2", "hunter2hunter2", "DB_PASSWORD=…(redacted)"),
        ('password = "hunter2hunter2"', "hunter2hunter2", 'password = "…(redacted)"'),
        ("  password: hunter2hunter2", "hunter2hunter2", "  password: …(redacted)"),
        ("passwd: abc123xyz", "abc123xyz", "passwd: …(redacted)"),
        ('{"password": "s3cr3t-value"}', "s3cr3t-value", '{"password": "…(redacted)"}'),
        ("run --token=abcd1234efgh", "abcd1234efgh", "--token=…(redacted)"),
        ("postgres://app:s3cretpw@db:5432/x", "s3cretpw", "postgres://app:…(redacted)@db:5432/x"),
        ("redis://:r3dis-pw@cache:6379/0", "r3dis-pw", "redis://:…(redacted)@cache:6379/0"),
    ],
)  # fmt: skip
def test_it_redacts_each_kind_of_secret_keeping_a_prefix(text: str, secret: str, shown: str):
    redacted = redact(text)

    assert secret not in redacted
    assert shown in redacted
    assert redact(redacted) == redacted  # a mark is not taken for a secret again
    assert secrets_found(text) and secret not in " ".join(secrets_found(text))


def test_it_keeps_the_text_around_a_secret():
    text = f"before\nconfig = {{'key': '{ANTHROPIC}'}}\nafter"

    assert redact(text) == "before\nconfig = {'key': 'sk-ant-…(redacted)'}\nafter"


@pytest.mark.parametrize(
    "code",
    [
        "password = get_password()",
        "token_count = 5",
        "max_tokens=4096",
        'api_key = os.environ["API_KEY"]',
        "secret_key = settings.SECRET_KEY",
        "password = form.cleaned_data['password']",
        "def login(username: str, password: str) -> Token:",
        "api_key: Optional[str] = None",
        "if token == expected_token:",
        "self.token = new_token",
        'headers = {"Authorization": f"Bearer {token}"}',
        "primary_key=True",
        "sort_key=lambda row: row.name",
        "PASSWORD_MIN_LENGTH = 12",
        "monkey = 'banana-split'",
        "GITHUB_TOKEN=${{ secrets.GITHUB_TOKEN }}",
        "TOKEN=$(cat token.txt)",
        "postgres://postgres@127.0.0.1:55433/annihilation",
        "https://example.com:8080/path?q=1",
        "a0d7725 anthropic: the lost-connection errors named once",
        "The task-runner keeps its keys in a vault; ask for a token: nobody has one.",
    ],
)
def test_it_leaves_ordinary_code_and_prose_alone(code: str):
    assert redact(code) == code
    assert secrets_found(code) == []


def test_it_returns_text_without_secrets_as_it_is():
    for text in ("Running the tests.", "x" * 5000, "def f():\n    return 1\n" * 300):
        assert redact(text) is text


def test_it_redacts_the_processes_own_secrets_by_value(settings, monkeypatch):
    settings.SECRET_KEY = "x7-django-secret-key-for-this-test-only"
    settings.ANTHROPIC_API_KEY = "anthropic-configured-value-42"
    monkeypatch.setenv("DATABASE_URL", "postgres://app:pg-pw-7788@db.internal:5432/app")
    settings.REDIS_URL = "redis://:redis-pw-9911@127.0.0.1:6379/0"
    monkeypatch.setenv("DEPLOY_HOOK_TOKEN", "tok-5566-abcd")
    monkeypatch.setenv("MAILER_PASSWORD", "postgres")  # a word: not replaced wherever it occurs
    monkeypatch.setenv("SHORT_KEY", "ab12")
    redaction_reload()

    text = (
        "key x7-django-secret-key-for-this-test-only, llm anthropic-configured-value-42, "
        "db pg-pw-7788, cache redis-pw-9911, hook tok-5566-abcd; postgres ab12"
    )

    assert redact(text) == (
        "key …(redacted SECRET_KEY), llm …(redacted ANTHROPIC_API_KEY), "
        "db …(redacted DATABASE_URL password), cache …(redacted REDIS_URL password), "
        "hook …(redacted DEPLOY_HOOK_TOKEN); postgres ab12"
    )


def test_it_redacts_extra_patterns_from_the_settings(settings):
    settings.REDACT_EXTRA_PATTERNS = [r"corp_[a-z0-9]{12}", r"pin=(\d{4})"]
    redaction_reload()

    assert redact("id corp_abcdef123456 pin=4321") == "id …(redacted) pin=…(redacted)"


def test_it_refuses_an_invalid_extra_pattern(settings):
    settings.REDACT_EXTRA_PATTERNS = ["ok", "broken("]

    with pytest.raises(ImproperlyConfigured, match="ANNIHILATION_REDACT_PATTERNS"):
        extra_patterns_check()


def test_it_redacts_every_string_of_a_structure():
    data: dict[str, Any] = {
        "input": {"path": "a.env", "content": f"KEY={GITHUB}\n"},
        "list": [1, ("t", ANTHROPIC)],
        GITHUB: True,
    }
    clean = {"type": "text", "items": [1, 2, {"x": "y"}]}

    redacted = redact_data(data)

    assert GITHUB not in str(redacted) and ANTHROPIC not in str(redacted)
    assert redacted["input"]["path"] == "a.env"
    assert redacted["list"] == [1, ("t", "sk-ant-…(redacted)")]
    assert redacted["ghp_…(redacted)"] is True
    assert data["input"]["content"] == f"KEY={GITHUB}\n"  # the original is untouched
    assert redact_data(clean) is clean


def test_a_stream_never_shows_a_secret_cut_between_pieces():
    text = (
        f"My key is {ANTHROPIC} and the id {AWS_ID}.\n"
        "Here is the key file:\n" + SSH_KEY + "That is all."
    )
    for size in (1, 3, 7, 16, 40):
        stream = TextStream()
        pieces = [stream.feed(text[i : i + size]) for i in range(0, len(text), size)]
        pieces.append(stream.finish())

        shown = [p for p in pieces if p]
        assert "".join(shown) == redact(text)
        for piece in shown:
            for secret in (ANTHROPIC, AWS_ID, *KEY_BODY):
                assert secret[:12] not in piece
        assert all(p.endswith("\n") for p in shown[:-1])  # whole lines until the end


def test_a_stream_holds_an_unfinished_key_block_until_its_end():
    stream = TextStream()

    assert stream.feed("ok\n-----BEGIN OPENSSH PRIVATE KEY-----\n") == "ok\n"
    assert stream.feed(KEY_BODY[0] + "\n") == ""
    assert stream.finish() == "-----BEGIN OPENSSH PRIVATE KEY-----…(redacted)"


def test_every_log_record_is_redacted_message_and_traceback(caplog):
    logger = logging.getLogger("annihilation.tests.redaction")
    caplog.set_level(logging.INFO)

    logger.warning(
        "agent wrote %s and %s", GITHUB, {"aws_secret_access_key": AWS_SECRET, "id": AWS_ID}
    )
    try:
        raise RuntimeError(f"could not use {ANTHROPIC}")
    except RuntimeError:
        logger.exception("call failed for key=%s", ANTHROPIC)
    logging.getLogger("celery.worker").error(SSH_KEY)  # any logger, any handler

    for secret in (GITHUB, AWS_SECRET, AWS_ID, ANTHROPIC, *KEY_BODY):
        assert secret not in caplog.text
    assert "ghp_…(redacted)" in caplog.text
    assert "RuntimeError: could not use sk-ant-…(redacted)" in caplog.text
    assert "Traceback (most recent call last)" in caplog.text
    assert caplog.records[0].getMessage().startswith("agent wrote ghp_…(redacted) and")


def test_the_filter_redacts_a_record_made_elsewhere():
    record = logging.makeLogRecord({"msg": "token %s", "args": (GITHUB,), "levelno": 30})

    assert RedactingFilter().filter(record)

    assert record.getMessage() == "token ghp_…(redacted)"


@pytest.mark.django_db
def test_every_event_is_stored_redacted_whoever_publishes_it():
    publish("quanta", "comment_added", {"body": f"use {GITHUB}", "nested": [{"k": ANTHROPIC}]})
    publish_many("agent:a1", [("text", {"text": SSH_KEY}), ("tool_result", {"output": AWS_ID})])

    stored = str(list(Event.objects.values_list("payload", flat=True)))
    for secret in (GITHUB, ANTHROPIC, AWS_ID, *KEY_BODY):
        assert secret not in stored
    assert "use ghp_…(redacted)" in stored


# --- the table of real-world shapes (tests/core/secret_shapes.py) -------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=[shape.id for shape in SHAPES])
def test_each_shape_of_the_table_is_redacted_once_and_described(shape: Shape):
    redacted = redact(shape.text)

    assert not leaked(redacted, (shape,)), redacted
    assert redact(redacted) == redacted  # a mark is not taken for a secret again
    found = secrets_found(shape.text)
    assert found and not leaked(" ".join(found), (shape,))


@pytest.mark.parametrize(
    "form",
    [
        pytest.param(lambda text: text, id="as-written"),
        pytest.param(repr, id="repr"),
        pytest.param(lambda text: json.dumps({"output": text}), id="json"),
        pytest.param(lambda text: str({"env": text, "n": 1}), id="repr-of-a-dict"),
        pytest.param(lambda text: "\n".join("+" + line for line in text.splitlines()), id="diff"),
    ],
)
def test_the_whole_table_is_redacted_in_each_form_it_is_printed_in(form: Callable[[str], str]):
    text = form(ALL)
    assert len(leaked(text)) == len(SHAPES)

    assert leaked(redact(text)) == []


@pytest.mark.parametrize("size", [1, 7, 40, 333])
def test_a_stream_of_the_whole_table_never_shows_a_secret(size: int):
    stream = TextStream()
    shown = [stream.feed(ALL[i : i + size]) for i in range(0, len(ALL), size)]
    shown.append(stream.finish())

    assert "".join(shown) == redact(ALL)
    for piece in shown:
        assert leaked(piece) == []


def test_a_stream_holds_a_key_block_a_bounded_while_and_drops_it_to_its_end():
    stream = TextStream()
    line = "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0MjQyNDI0MjQyNDI0MjQyNDI0MjQy\n"

    shown = stream.feed("begin\n-----BEGIN RSA PRIVATE KEY-----\n")
    for _ in range(2000):  # 128 KiB of key: past what a stream holds
        shown += stream.feed(line)
    shown += stream.feed("-----END RSA PRIVATE KEY-----\nafter\n") + stream.finish()

    assert shown == "begin\n-----BEGIN RSA PRIVATE KEY-----…(redacted)\nafter\n"
    assert len(stream._parts) == 0


@pytest.mark.parametrize(
    "code",
    [
        "docker login --password-stdin registry.example.com",
        "ssh -p 2222 deploy@host",
        "docker run -u 1000:1000 image",
        "git push -u origin main",
        "password: str",
        "    secret: str  # the whole bearer token; shown once",
        "mysql -h db -P 3306 app",
        "The machine learning model needs a login step.",
        "keys: list[str] = []",
        "the token's kind stays readable (sk_…)",
        "xoxb-… is how a Slack bot token starts",
        "https://hooks.slack.com/services/ is where it posts",
    ],
)
def test_the_new_rules_leave_ordinary_commands_and_code_alone(code: str):
    assert redact(code) == code


def test_gitleaks_published_rules_are_all_read():
    import warnings

    from core.secret_rules import CONFIG, gitleaks_rules, go_regex

    gitleaks_rules.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a pattern Python reads differently warns: an error here
        rules, allowed = gitleaks_rules()
        for rule in rules:
            assert rule.pattern.pattern == rule.source  # compiled on first use

    published = CONFIG.read_text().count("[[rules]]")
    assert len(rules) >= published - 6  # all but the generic rule and those for some file names
    assert {"slack-bot-token", "stripe-access-token", "gcp-api-key", "jwt"} <= {r.id for r in rules}
    assert allowed  # the global allow-list (placeholders, known examples)
    # Go applies a flag group to the rest of its group; Python takes it only at the start.
    assert go_regex(r"\b(p8e-(?i)[a-z0-9]{32})\z") == r"\b(p8e-(?i:[a-z0-9]{32}))\Z"
    assert go_regex(r"[[a]x(?-i:B)") == r"[\[a]x(?-i:B)"


def test_a_rule_is_compiled_only_when_a_text_holds_its_keywords() -> None:
    """Loading the rule set compiles none of its ~200 patterns: a text is read by the rules its
    keywords call for, each compiled on first use."""
    from core.secret_rules import gitleaks_rules

    gitleaks_rules.cache_clear()
    redaction_reload()
    try:
        assert redact("nothing secret in this sentence at all") == (
            "nothing secret in this sentence at all"
        )
        rules, _ = gitleaks_rules()
        assert not [r.id for r in rules if "pattern" in vars(r)]
        token = "xoxb-" + "1234567890-1234567890123-" + "aB3dE5fG7hI9jK1lM3nO5pQ7"
        assert token not in redact(f"the bot token is {token}")
        assert "slack-bot-token" in {r.id for r in rules if "pattern" in vars(r)}
    finally:
        gitleaks_rules.cache_clear()
        redaction_reload()
