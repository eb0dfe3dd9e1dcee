"""Where a repository lives: the form ANNIHILATION_REPO and the registry of repositories both
accept. Plain Python (the settings read it before any app is loaded)."""

from __future__ import annotations

from pathlib import Path

URL_SCHEMES = frozenset({"ssh", "git", "http", "https", "file", "git+ssh", "ssh+git"})


def location_parse(raw: str, *, what: str) -> Path | str:
    """A URL (`scheme://...`, or scp-like `user@host:path`) as written, or a local path made
    absolute; ValueError naming `what` (how the caller shows the value) for anything else.
    `raw` is stripped and must not be empty."""
    if any(c.isspace() or ord(c) < 32 for c in raw):
        raise ValueError(f"{what} holds whitespace")
    if "://" in raw:
        scheme, _, rest = raw.partition("://")
        if scheme.lower() not in URL_SCHEMES:
            raise ValueError(
                f"{what}: unknown scheme {scheme!r} "
                f"(one of {', '.join(sorted(URL_SCHEMES))}, or a local path)"
            )
        if not rest.strip("/") or (scheme != "file" and "/" not in rest.strip("/")):
            raise ValueError(f"{what} names no repository")
        return raw
    head, colon, tail = raw.partition(":")
    if colon and "/" not in head:
        user, at, host = head.partition("@")
        if not (at and user and host and tail):
            raise ValueError(
                f"{what} is neither a local path nor a URL (scheme://host/path, or user@host:path)"
            )
        return raw
    return Path(raw).expanduser().resolve()
