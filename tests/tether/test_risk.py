"""The deterministic risk rules and the secret scan."""

from __future__ import annotations

import pytest

from tether.risk import FileChange, redact, risk_assess, secrets_found


def change(path: str, status: str = "M", additions: int = 1, deletions: int = 0) -> FileChange:
    return {"path": path, "status": status, "additions": additions, "deletions": deletions}


@pytest.mark.parametrize(
    ("secret", "shown"),
    [
        ("sk-ant-api03-" + "a" * 40, "sk-ant-…(redacted)"),
        ("sk-" + "b" * 40, "sk-…(redacted)"),
        ("AKIA" + "ABCDEFGHIJKLMNOP", "AKIA…(redacted)"),
        ("ghp_" + "c" * 36, "ghp_…(redacted)"),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----", "-----BEGIN RSA PRIVATE KEY-----…(redacted)"),
        ('password = "hunter2hunter2"', 'password = "…(redacted)'),
    ],
)  # fmt: skip
def test_it_finds_and_redacts_each_kind_of_secret(secret: str, shown: str) -> None:
    text = f"before\n{secret}\nafter"
    assert secrets_found(text)
    redacted = redact(text)
    assert shown in redacted
    assert secret not in redacted
    assert redacted.startswith("before\n") and redacted.endswith("\nafter")


def test_it_rates_a_small_ordinary_change_low() -> None:
    verdict = risk_assess(files=[change("notes/a.md", additions=5)], diff="+hello\n")
    assert (verdict.risk, verdict.reasons) == ("low", [])


@pytest.mark.parametrize(
    "path",
    ["app/migrations/0002_x.py", "proj/settings.py", ".github/workflows/ci.yml", "auth/login.py",
     "requirements.txt", "package.json", "pyproject.toml"],
)  # fmt: skip
def test_it_rates_sensitive_paths_medium(path: str) -> None:
    assert risk_assess(files=[change(path)], diff="+x\n").risk == "medium"


def test_it_rates_deletions_and_size() -> None:
    assert risk_assess(files=[change("a.py", "D", 0, 3)], diff="-x\n").risk == "medium"
    assert risk_assess(files=[change("a.py", additions=400)], diff="").risk == "medium"
    assert risk_assess(files=[change("a.py", additions=1200)], diff="").risk == "high"


def test_it_rates_an_added_secret_high_but_not_a_removed_one() -> None:
    key = "sk-ant-api03-" + "z" * 40
    added = risk_assess(files=[change("a.py")], diff=f"+KEY = '{key}'\n")
    removed = risk_assess(files=[change("a.py")], diff=f"-KEY = '{key}'\n")
    assert added.risk == "high" and key not in " ".join(added.reasons)
    assert removed.risk == "low"


@pytest.mark.parametrize(
    "path",
    [".gitconfig", "sub/.gitconfig", ".config/git/config", "a/.config/git/attributes",
     ".gitattributes", "docs/.gitattributes", ".gitmodules", ".githooks/pre-commit",
     ".husky/pre-push", "vendor/x/.git/config", ".git/hooks/post-merge", ".lfsconfig",
     ".GitAttributes", '"odd\\tname/.gitconfig"'],
)  # fmt: skip
def test_it_rates_git_configuration_attributes_hooks_and_modules_high(path: str) -> None:
    verdict = risk_assess(files=[change(path)], diff="+x\n")
    assert verdict.risk == "high"
    assert any(r.startswith("high: git configuration") and path in r for r in verdict.reasons)


@pytest.mark.parametrize(
    "path", ["gitconfig.md", "src/git.py", ".gitignore", "docs/config/git.md", "a.github.io"]
)
def test_it_leaves_paths_that_only_look_like_git_ones_alone(path: str) -> None:
    assert risk_assess(files=[change(path)], diff="+x\n").risk == "low"


def test_it_rates_a_submodule_high() -> None:
    diff = (
        "diff --git a/vendor/evil b/vendor/evil\nnew file mode 160000\nindex 0000000..1234567\n"
        "--- /dev/null\n+++ b/vendor/evil\n@@ -0,0 +1 @@\n+Subproject commit 1234567\n"
    )
    verdict = risk_assess(files=[change("vendor/evil", "A")], diff=diff)
    assert verdict.risk == "high"
    assert "high: a submodule (a repository inside the tree): vendor/evil" in verdict.reasons
    moved = "diff --git a/v b/v\nindex 1111111..2222222 160000\n--- a/v\n+++ b/v\n"
    assert risk_assess(files=[change("v")], diff=moved).risk == "high"
