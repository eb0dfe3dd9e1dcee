"""Real-world shapes of secrets, with fake but format-valid values: each as it turns up in what an
agent reads, writes, says or runs (a file, a command line, repr or JSON output, a URL).

Every store is tested against the whole table (tests/core/test_redaction.py,
tests/core/test_redaction_stores.py); bench/redaction.py measures with it.
"""

from __future__ import annotations

from dataclasses import dataclass

# Strings put together so that no scanner reading this file takes them for live credentials.
AWS_ID = "AKIA" + "Q7X2M4K9P1R5T8W3"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzq8Vh3Tn2L"
GITHUB = "ghp_" + "Zx9Lm2Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0Lz9X"
ANTHROPIC = "sk-ant-api03-" + "Rt5Yu6Io7Pa8Sd9Fg0Hj1Kl2Zx3Cv4Bn5Mq6We7"
OPENAI = "sk-proj-" + "Nb4Vc5Xz6Lk7Jh8Gf9Ds0Aq1Wr2Et3Yu4"
PEM_BODY = "MIIEowIBAAKCAQEA7q3Vb9Xz2Lk4Jh6Gf8Ds0Aq1Wr3Et5Yu7Io9Pa2Sd4Fg6Hj8Kl0Zx"
PUTTY_PRIVATE = "AAABAQCx9Lm2Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0Lz9Xc8Vb7Nm6Qw5Er4Ty3Ui2Op1As"
SPACED_JWT = (
    "eyAiYWxnIjogIkhTMjU2IiwgInR5cCI6ICJKV1QiIH0"
    ".eyAic3ViIjogIjEyMzQ1Njc4OTAiLCAibmFtZSI6ICJBZGEiIH0"
    ".Qz8Xw7Vu6Ts5Rq4Po3Nm2Lk1Jh0Gf9Ed8Cb7Aa6Zy"
)


@dataclass(frozen=True)
class Shape:
    name: str
    text: str  # as it appears
    secret: str  # what must not survive redaction, nor any 8 characters of it

    @property
    def id(self) -> str:
        return self.name.replace(" ", "-")


def _s(*parts: str) -> str:
    return "".join(parts)


SHAPES: tuple[Shape, ...] = (
    # Keys and tokens by their format.
    Shape("Anthropic key", f"ANTHROPIC key {ANTHROPIC} set", ANTHROPIC),
    Shape("OpenAI project key", f"use {OPENAI} now", OPENAI[8:]),
    Shape(
        "OpenAI legacy key",
        _s("key: sk-", "T3BlbkFJ", "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8s9"),
        _s("T3BlbkFJ", "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8s9"),
    ),
    Shape("AWS access key id", f"id {AWS_ID} here", AWS_ID),
    Shape("AWS secret key without its id", f"The AWS secret key is {AWS_SECRET}.", AWS_SECRET),
    Shape("AWS secret key in an env file", f"AWS_SECRET_ACCESS_KEY={AWS_SECRET}", AWS_SECRET),
    Shape("GitHub classic token", f"token {GITHUB}.", GITHUB),
    Shape(
        "GitHub fine-grained token",
        _s(
            "github_pat_",
            "11ABCDEFG0",
            "aB3dE5gH7jK9mN1pQ3sT5vW7yZ_",
            "Ab2Cd4Ef6Gh8Ij0Kl2Mn4Op6Qr8St0Uv2Wx4Yz6Ab8Cd0Ef2Gh4Ij6Kl",
        ),
        "aB3dE5gH7jK9mN1pQ3sT5vW7yZ",
    ),
    Shape(
        "GitLab token", _s("GITLAB=", "glpat-", "Xy9Zw8Vu7Ts6Rq5Po4Nm"), _s("Xy9Zw8Vu7Ts6Rq5Po4Nm")
    ),
    Shape(
        "Slack bot token",
        _s("slack: xoxb-", "1234567890-1234567890123-", "AbCdEfGhIjKlMnOpQrStUvWx"),
        "AbCdEfGhIjKlMnOpQrStUvWx",
    ),
    Shape(
        "Slack user token",
        _s("xoxp-", "1234567890-1234567890-1234567890123-", "0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d"),
        "0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d",
    ),
    Shape(
        "Slack webhook URL",
        _s(
            "post to https://hooks.slack.com/services/",
            "T01ABCDEF/B01ABCDEF/",
            "Qw8Er7Ty6Ui5Op4As3Df2Gh1",
        ),
        "Qw8Er7Ty6Ui5Op4As3Df2Gh1",
    ),
    Shape(
        "Stripe live secret key",
        _s("stripe.api_key = 'sk_", "live_", "4eC39HqLyjWDarjtT1zdp7dc'"),
        "4eC39HqLyjWDarjtT1zdp7dc",
    ),
    Shape(
        "Stripe restricted key",
        _s("rk_", "live_", "51Hx9Lm2Qw8Er7Ty6Ui5Op4As"),
        "51Hx9Lm2Qw8Er7Ty6Ui5Op4As",
    ),
    Shape(
        "Google API key",
        _s("maps key AIza", "SyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY", " ok"),
        "SyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY",
    ),
    Shape(
        "JWT",
        _s(
            "cookie=",
            "eyJhbGciOiJIUzI1NiJ9",
            ".eyJzdWIiOiIxMjM0NTY3ODkwIn0",
            ".dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        ),
        "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    ),
    Shape("JWT with a spaced header", f"session {SPACED_JWT} end", SPACED_JWT[10:]),
    Shape(
        "npm token",
        _s("//registry.npmjs.org/:_authToken=npm_", "Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0Uv1Wx2"),
        "Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0Uv1Wx2",
    ),
    Shape(
        "PyPI token",
        _s(
            "password = pypi-",
            "AgEIcHlwaS5vcmc",
            "CJDk5ZmEtNzQwMC00ZjA4LWI2ZTMtZjVhNmI3YzhkOWUwAAIqWzMsIjFi",
        ),
        "CJDk5ZmEtNzQwMC00ZjA4LWI2ZTMtZjVhNmI3YzhkOWUw",
    ),
    Shape(
        "SendGrid key",
        _s("SG.", "ngeVfQFYQlKU0ufo8x5d1A", ".TwL2iGABf9DHoTf-09kqeF8tAmbihYzrnopKc-1s5cr"),
        "TwL2iGABf9DHoTf-09kqeF8tAmbihYzrnopKc-1s5cr",
    ),
    Shape(
        "Twilio API key",
        _s("twilio SK", "0123456789abcdef0123456789abcdef"),
        "0123456789abcdef0123456789abcdef",
    ),
    Shape(
        "DigitalOcean token",
        _s("dop_v1_", "a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d2e3f4a5b6c7d8e9f0a1b2"),
        "a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d2e3f4a5b6c7d8e9f0a1b2",
    ),
    Shape(
        "Shopify token",
        _s("shpat_", "a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6"),
        "a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6",
    ),
    Shape(
        "Databricks token",
        _s("dapi", "a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6"),
        "a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6",
    ),
    Shape(
        "Hugging Face token",
        _s("HF hf_", "QwErTyUiOpAsDfGhJkLzXcVbNmQaZwSxEd"),
        "QwErTyUiOpAsDfGhJkLzXcVbNmQaZwSxEd",
    ),
    Shape(
        "age secret key",
        _s("AGE-SECRET-KEY-1", "QYPZRY9X8GF2TVDW0S3JN54KHCE6MUA7LQYPZRY9X8GF2TVDW0S3JN54KH"),
        "QYPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L",
    ),
    Shape(
        "Vault token",
        _s(
            "VAULT_TOKEN hvs.",
            "CAESIJlU6Hh2Xz9Lm2Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0Lz9XGh4KHGh2cy5",
            "Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0Uv1Wx2Yz3Ab4Cd5Ef6Gh7Ij8",
        ),
        "CAESIJlU6Hh2Xz9Lm2Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0Lz9XGh4KHGh2cy5",
    ),
    Shape(
        "Azure storage connection string",
        _s(
            "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=",
            "Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFy",
            "==;EndpointSuffix=core.windows.net",
        ),
        "Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFy",
    ),
    # Private keys.
    Shape(
        "OpenSSH private key",
        _s(
            "-----BEGIN OPENSSH PRIVATE KEY-----\n",
            PEM_BODY,
            "\n-----END OPENSSH PRIVATE KEY-----\nafter",
        ),
        PEM_BODY,
    ),
    Shape(
        "RSA private key",
        _s("-----BEGIN RSA PRIVATE KEY-----\n", PEM_BODY, "\n-----END RSA PRIVATE KEY-----"),
        PEM_BODY,
    ),
    Shape(
        "PKCS8 private key in JSON",
        _s(
            '{"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----\\n',
            PEM_BODY,
            '\\n-----END PRIVATE KEY-----\\n"}',
        ),
        PEM_BODY,
    ),
    Shape(
        "PuTTY private key",
        _s(
            "PuTTY-User-Key-File-3: ssh-rsa\nEncryption: none\nComment: deploy\nPublic-Lines: 1\nAAAAB3NzaC1yc2EAAAADAQABAAABAQ\nPrivate-Lines: 1\n",
            PUTTY_PRIVATE,
            "\nPrivate-MAC: 8a4f0c2e9b7d6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a1f\n",
        ),
        PUTTY_PRIVATE,
    ),
    # Passwords where they are written.
    Shape("password in an env file", "DB_PASSWORD=hunter2hunter2", "hunter2hunter2"),
    Shape("short YAML password", "database:\n  user: app\n  password: pw12\n", "pw12"),
    Shape("short quoted YAML password", "- name: db\n  password: 'x9!'\n", "x9!"),
    Shape("password in JSON", '{"password": "s3cr3t-value"}', "s3cr3t-value"),
    Shape("password option with a space", "mysql --password Zq9xW2vB7n db", "Zq9xW2vB7n"),
    Shape("password option with =", "psql --password=Zq9xW2vB7n", "Zq9xW2vB7n"),
    Shape("mysql -p with the value attached", "mysql -uroot -pZq9xW2vB7n -h db app", "Zq9xW2vB7n"),
    Shape("sshpass -p", "sshpass -p 'Tr0ub4dor&3x' ssh deploy@host", "Tr0ub4dor&3x"),
    Shape(
        "curl -u user:pass",
        "curl -u admin:Sup3rS3cretPw https://api.example.com/x",
        "Sup3rS3cretPw",
    ),
    Shape("curl --user user:pass", "curl --user 'bob:Sup3rS3cretPw' https://x", "Sup3rS3cretPw"),
    Shape(
        "netrc password", "machine api.example.com login bob password Zx8Cv7Bn6Mq", "Zx8Cv7Bn6Mq"
    ),
    Shape("token option with a space", "gh auth --token Zx8Cv7Bn6Mq5Wr4", "Zx8Cv7Bn6Mq5Wr4"),
    Shape("URL password", "postgres://app:s3cretpw99@db:5432/x", "s3cretpw99"),
    Shape(
        "URL password containing @",
        "https://deploy:p@ss@word99@git.example.com/r.git",
        "p@ss@word99",
    ),
    Shape(
        "URL token as the password",
        _s("git clone https://oauth2:glpat-", "Xy9Zw8Vu7Ts6Rq5Po4Nm", "@gitlab.com/g/r.git"),
        "Xy9Zw8Vu7Ts6Rq5Po4Nm",
    ),
    Shape(
        "Authorization Bearer header",
        "Authorization: Bearer abc123def456ghi789jkl",
        "abc123def456ghi789jkl",
    ),
    Shape(
        "Authorization Basic header",
        "authorization: Basic dXNlcjpwYXNzd29yZDEyMw==",
        "dXNlcjpwYXNzd29yZDEyMw==",
    ),
    # After an escape: repr and JSON of text with newlines and tabs.
    Shape(
        "env line after an escaped newline",
        "{'log': 'starting\\nDB_PASSWORD=Zq9xW2vB7nM4\\n'}",
        "Zq9xW2vB7nM4",
    ),
    Shape("token after an escaped tab", f"'name\\t{GITHUB}'", GITHUB),
    Shape("key id after an escaped newline", f'"out": "ok\\n{AWS_ID}\\n"', AWS_ID),
    Shape(
        "API key after an escaped newline in JSON",
        '{"env": "A=1\\nAPI_KEY=Zq9xW2vB7nM4Lk"}',
        "Zq9xW2vB7nM4Lk",
    ),
)


def leaked(text: str, shapes: tuple[Shape, ...] = SHAPES) -> list[str]:
    """The shapes of which `text` still holds the secret, or 8 characters of it (a short secret:
    the secret itself)."""
    found = []
    for shape in shapes:
        secret = shape.secret
        if len(secret) < 10:
            hit = _short_in(secret, text)
        else:
            hit = any(secret[i : i + 8] in text for i in range(len(secret) - 7))
        if hit:
            found.append(shape.name)
    return found


def _short_in(secret: str, text: str) -> bool:
    """A short secret as a word of its own (`pw12` but not inside `pw123x` of another value)."""
    at = text.find(secret)
    while at >= 0:
        before = text[at - 1 : at]
        after = text[at + len(secret) : at + len(secret) + 1]
        if not (before.isalnum() or after.isalnum()):
            return True
        at = text.find(secret, at + 1)
    return False


# Every shape on a line of its own: the text of one file, one message, one payload.
ALL = "\n".join(shape.text for shape in SHAPES) + "\n"
