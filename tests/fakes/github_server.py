"""A local fake of GitHub: the REST endpoints the forge client calls, served on loopback, with
the objects shaped as GitHub's published schemas shape them (pull-request, pull-request-review,
review-comment, check-run, pull-request-merge-result, validation-error), and the webhook
payloads GitHub sends for what its users do (pull_request, pull_request_review, check_run).

Its git side is a bare repository: pushed branches land there, a pull request's head is the
branch's sha there, and a merge makes a real merge commit there.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

BOT = "annihilation-bot"
LOST = object()  # a fault's body: the request is carried out, its answer replaced by the status


def _git(bare: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(bare), *args], capture_output=True, text=True, check=False
    )


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class FakeGitHub:
    """One repository (`owner/name`) on a fake GitHub at `url`."""

    bare: Path
    slug: str = "acme/widgets"
    url: str = ""
    latency_s: float = 0.0
    pulls: dict[int, dict[str, Any]] = field(default_factory=dict)
    reviews: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    comments: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    check_runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    served_s: float = 0.0  # the time spent answering (latency included), all requests
    # The base branch requires GitHub's merge queue: the REST merge is refused, auto-merge
    # (GraphQL) enqueues, and `queue_merge` is the queue merging.
    merge_queue: bool = False
    faults: list[tuple[str, str, int, Any, dict[str, str]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _ids: Iterator[int] = field(default_factory=lambda: iter(range(1000, 10**9)))

    # --- what the tests do as GitHub's users ---------------------------------------------------

    def fail(
        self,
        method: str,
        path: str,
        status: int,
        *,
        times: int = 1,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """The next `times` requests `method` whose path matches `path` (a regular expression)
        are answered `status` with `body` (default: GitHub's error body for the status) and
        `headers`."""
        with self.lock:
            self.faults += [(method, path, status, body, headers or {})] * times

    def count(self, method: str, path: str) -> int:
        with self.lock:
            return sum(1 for m, p in self.requests if m == method and re.fullmatch(path, p))

    def branch_sha(self, branch: str) -> str:
        proc = _git(self.bare, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}")
        return proc.stdout.strip()

    def review(
        self,
        number: int | None,
        state: str,
        body: str = "",
        *,
        user: str = "octo-reviewer",
        comments: list[tuple[str, int, str]] = (),  # type: ignore[assignment]
    ) -> dict[str, Any]:
        """A review submitted on the pull request's head (state: APPROVED, CHANGES_REQUESTED,
        COMMENTED), with line comments; returns the `pull_request_review` delivery."""
        assert number is not None
        with self.lock:
            pull = self._pull(number)
            review = {
                "id": next(self._ids),
                "node_id": "PRR_fake",
                "user": self._user(user),
                "body": body,
                "state": state,
                "html_url": f"{pull['html_url']}#pullrequestreview-1",
                "pull_request_url": pull["url"],
                "author_association": "MEMBER",
                "_links": {
                    "html": {"href": pull["html_url"]},
                    "pull_request": {"href": pull["url"]},
                },
                "submitted_at": _now(),
                "commit_id": pull["head"]["sha"],
            }
            self.reviews.setdefault(number, []).append(review)
            for path, line, text in comments:
                self.comments.setdefault(number, []).append(
                    {
                        "id": next(self._ids),
                        "node_id": "PRRC_fake",
                        "url": f"{self._api}/pulls/comments/1",
                        "pull_request_review_id": review["id"],
                        "diff_hunk": "@@ -1 +1 @@",
                        "path": path,
                        "position": line,
                        "original_position": line,
                        "line": line,
                        "original_line": line,
                        "side": "RIGHT",
                        "commit_id": pull["head"]["sha"],
                        "original_commit_id": pull["head"]["sha"],
                        "user": self._user(user),
                        "body": text,
                        "created_at": _now(),
                        "updated_at": _now(),
                        "html_url": f"{pull['html_url']}#discussion_r1",
                        "pull_request_url": pull["url"],
                        "author_association": "MEMBER",
                        "_links": {},
                    }
                )
            hook_review = {**review, "state": state.lower()}
            return {
                "action": "submitted",
                "review": hook_review,
                "pull_request": pull,
                "repository": self._repository(),
                "sender": self._user(user),
            }

    def check(self, sha: str, name: str, conclusion: str, summary: str = "") -> dict[str, Any]:
        """A completed check run on `sha`; returns the `check_run` delivery."""
        with self.lock:
            numbers = [n for n, p in self.pulls.items() if self._head(p) == sha]
            run = {
                "id": next(self._ids),
                "node_id": "CR_fake",
                "head_sha": sha,
                "external_id": "",
                "url": f"{self._api}/check-runs/1",
                "html_url": f"https://github.com/{self.slug}/runs/1",
                "details_url": f"https://ci.example/{name}",
                "status": "completed",
                "conclusion": conclusion,
                "started_at": _now(),
                "completed_at": _now(),
                "output": {
                    "title": f"{name}: {conclusion}",
                    "summary": summary,
                    "text": None,
                    "annotations_count": 0,
                    "annotations_url": f"{self._api}/check-runs/1/annotations",
                },
                "name": name,
                "check_suite": {"id": next(self._ids), "head_branch": None, "head_sha": sha},
                "app": {"id": 1, "slug": "ci", "name": "CI"},
                "pull_requests": [self._pull_ref(self.pulls[n]) for n in numbers],
            }
            self.check_runs.setdefault(sha, []).append(run)
            return {
                "action": "completed",
                "check_run": run,
                "repository": self._repository(),
                "sender": self._user("ci[bot]"),
            }

    def close(self, number: int | None, *, user: str = "octo-maintainer") -> dict[str, Any]:
        assert number is not None
        with self.lock:
            pull = self.pulls[number]
            pull.update(state="closed", closed_at=_now())
            return {
                "action": "closed",
                "number": number,
                "pull_request": self._pull(number),
                "repository": self._repository(),
                "sender": self._user(user),
            }

    def queue_merge(self, number: int | None) -> dict[str, Any]:
        """GitHub's merge queue merges the pull request; returns the `pull_request` delivery."""
        assert number is not None
        with self.lock:
            status, _ = self._merge(number, None, "merge", queued=True)
            assert status == 200, status
            return {
                "action": "closed",
                "number": number,
                "pull_request": self._pull(number),
                "repository": self._repository(),
                "sender": self._user("github-merge-queue[bot]"),
            }

    def open_pulls(self) -> list[dict[str, Any]]:
        with self.lock:
            return [self._pull(n) for n, p in self.pulls.items() if p["state"] == "open"]

    # --- the server ----------------------------------------------------------------------------

    @property
    def _api(self) -> str:
        return f"{self.url}/repos/{self.slug}"

    def _user(self, login: str) -> dict[str, Any]:
        return {
            "login": login,
            "id": abs(hash(login)) % 10**8,
            "node_id": "U_fake",
            "avatar_url": "",
            "url": f"{self.url}/users/{login}",
            "html_url": f"https://github.com/{login}",
            "type": "Bot" if login.endswith("[bot]") or login == BOT else "User",
            "site_admin": False,
        }

    def _repository(self) -> dict[str, Any]:
        owner, name = self.slug.split("/")
        return {
            "id": 186853002,
            "node_id": "R_fake",
            "name": name,
            "full_name": self.slug,
            "private": True,
            "owner": self._user(owner),
            "html_url": f"https://github.com/{self.slug}",
            "url": self._api,
            "default_branch": "main",
        }

    def _head(self, pull: dict[str, Any]) -> str:
        if pull.get("merged"):
            return str(pull["head"]["sha"])
        return self.branch_sha(pull["head"]["ref"]) or str(pull["head"]["sha"])

    def _ref(self, branch: str, sha: str) -> dict[str, Any]:
        owner = self.slug.split("/")[0]
        return {
            "label": f"{owner}:{branch}",
            "ref": branch,
            "sha": sha,
            "user": self._user(owner),
            "repo": self._repository(),
        }

    def _pull_ref(self, pull: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": pull["id"],
            "number": pull["number"],
            "url": pull["url"],
            "head": {"ref": pull["head"]["ref"], "sha": self._head(pull), "repo": {"id": 1}},
            "base": {"ref": pull["base"]["ref"], "sha": pull["base"]["sha"], "repo": {"id": 1}},
        }

    def _pull(self, number: int) -> dict[str, Any]:
        pull = self.pulls[number]
        pull["head"] = self._ref(pull["head"]["ref"], self._head(pull))
        pull["base"] = self._ref(pull["base"]["ref"], self.branch_sha(pull["base"]["ref"]))
        copied: dict[str, Any] = json.loads(json.dumps(pull))
        return copied

    def _new_pull(self, title: str, head: str, base: str, body: str) -> dict[str, Any]:
        number = len(self.pulls) + 1
        html = f"https://github.com/{self.slug}/pull/{number}"
        self.pulls[number] = {
            "url": f"{self._api}/pulls/{number}",
            "id": next(self._ids),
            "node_id": f"PR_fake{number}",
            "html_url": html,
            "diff_url": f"{html}.diff",
            "patch_url": f"{html}.patch",
            "issue_url": f"{self._api}/issues/{number}",
            "commits_url": f"{self._api}/pulls/{number}/commits",
            "review_comments_url": f"{self._api}/pulls/{number}/comments",
            "review_comment_url": f"{self._api}/pulls/comments{{/number}}",
            "comments_url": f"{self._api}/issues/{number}/comments",
            "statuses_url": f"{self._api}/statuses/{self.branch_sha(head)}",
            "number": number,
            "state": "open",
            "locked": False,
            "title": title,
            "user": self._user(BOT),
            "body": body,
            "labels": [],
            "milestone": None,
            "active_lock_reason": None,
            "created_at": _now(),
            "updated_at": _now(),
            "closed_at": None,
            "merged_at": None,
            "merge_commit_sha": None,
            "assignee": None,
            "assignees": [],
            "requested_reviewers": [],
            "requested_teams": [],
            "head": self._ref(head, self.branch_sha(head)),
            "base": self._ref(base, self.branch_sha(base)),
            "_links": {},
            "author_association": "NONE",
            "auto_merge": None,
            "draft": False,
            "merged": False,
            "mergeable": True,
            "mergeable_state": "clean",
            "merged_by": None,
            "comments": 0,
            "review_comments": 0,
            "maintainer_can_modify": False,
            "commits": 1,
            "additions": 0,
            "deletions": 0,
            "changed_files": 0,
        }
        return self._pull(number)

    def _merge(
        self, number: int | None, sha: str | None, method: str, *, queued: bool = False
    ) -> tuple[int, Any]:
        assert number is not None
        pull = self.pulls[number]
        head = self._head(pull)
        if pull["state"] != "open":
            return 405, {"message": "Pull Request is not mergeable"}
        if self.merge_queue and not queued:
            return 405, {"message": "Changes must be made through the merge queue"}
        if sha and sha != head:
            return 409, {"message": "Head branch was modified. Review and try the merge again."}
        base = pull["base"]["ref"]
        tree = _git(self.bare, "merge-tree", "--write-tree", f"refs/heads/{base}", head)
        if tree.returncode != 0:
            return 405, {"message": "Pull Request is not mergeable"}
        env_message = f"Merge pull request #{number} from {pull['head']['label']}"
        commit = subprocess.run(
            ["git", "-C", str(self.bare), "commit-tree", tree.stdout.split()[0],
             "-p", f"refs/heads/{base}", "-p", head, "-m", env_message],
            capture_output=True, text=True, check=True,
            env={"GIT_AUTHOR_NAME": "GitHub", "GIT_AUTHOR_EMAIL": "noreply@github.com",
                 "GIT_COMMITTER_NAME": "GitHub", "GIT_COMMITTER_EMAIL": "noreply@github.com",
                 "PATH": "/usr/bin:/bin"},
        ).stdout.strip()  # fmt: skip
        _git(self.bare, "update-ref", f"refs/heads/{base}", commit)
        pull.update(
            state="closed", merged=True, merged_at=_now(), closed_at=_now(),
            merge_commit_sha=commit, merged_by=self._user(BOT),
        )  # fmt: skip
        pull["head"]["sha"] = head
        return 200, {"sha": commit, "merged": True, "message": "Pull Request successfully merged"}

    def _graphql(self, body: dict[str, Any]) -> tuple[int, Any, dict[str, str]]:
        """The one mutation the client sends: enablePullRequestAutoMerge."""
        given = body.get("variables", {}).get("input", {})
        found = [n for n, p in self.pulls.items() if p["node_id"] == given.get("pullRequestId")]
        if "enablePullRequestAutoMerge" not in body.get("query", "") or not found:
            error = {"type": "NOT_FOUND", "message": "Could not resolve to a node"}
            return 200, {"data": None, "errors": [error]}, {}
        self.pulls[found[0]]["auto_merge"] = {
            "enabled_by": self._user(BOT),
            "merge_method": str(given.get("mergeMethod", "MERGE")).lower(),
            "commit_title": None,
            "commit_message": None,
        }
        answer = {"actor": {"login": BOT}, "clientMutationId": None}
        return 200, {"data": {"enablePullRequestAutoMerge": answer}}, {}

    def handle(self, method: str, target: str, body: Any) -> tuple[int, Any, dict[str, str]]:
        with self.lock:
            self.requests.append((method, urlsplit(target).path))
            for n, (m, pattern, status, answer, headers) in enumerate(self.faults):
                if m == method and re.fullmatch(pattern, urlsplit(target).path):
                    del self.faults[n]
                    if answer is LOST:  # done, but the answer is lost on the way back
                        self._answer(method, target, body)
                        return status, {"message": "Server Error"}, headers
                    if answer is not None:
                        return status, answer, headers
                    message = {
                        403: "Resource not accessible by integration",
                        422: "Validation Failed",
                    }.get(status, "Server Error")
                    docs = "https://docs.github.com/rest"
                    return status, {"message": message, "documentation_url": docs}, headers
            return self._answer(method, target, body)

    def _answer(self, method: str, target: str, body: Any) -> tuple[int, Any, dict[str, str]]:
        parts = urlsplit(target)
        path, query = parts.path, parse_qs(parts.query)
        if path == "/graphql" and method == "POST":
            return self._graphql(body)
        prefix = f"/repos/{self.slug}"
        if not path.startswith(prefix):
            return 404, {"message": "Not Found"}, {}
        rest = path[len(prefix) :]
        if rest == "/pulls" and method == "GET":
            state, head = query.get("state", ["open"])[0], query.get("head", [""])[0]
            found = [
                self._pull(n) for n, p in sorted(self.pulls.items())
                if (state == "all" or p["state"] == state)
                and (not head or f"{self.slug.split('/')[0]}:{p['head']['ref']}" == head)
            ]  # fmt: skip
            return 200, found, {}
        if rest == "/pulls" and method == "POST":
            head, base = body.get("head", ""), body.get("base", "")
            if not self.branch_sha(head):
                return 422, {"message": "Validation Failed", "errors": [
                    {"resource": "PullRequest", "field": "head", "code": "invalid"}]}, {}  # fmt: skip
            if any(p["head"]["ref"] == head and p["state"] == "open" for p in self.pulls.values()):
                owner = self.slug.split("/")[0]
                return 422, {"message": "Validation Failed", "errors": [
                    {"resource": "PullRequest", "code": "custom",
                     "message": f"A pull request already exists for {owner}:{head}."}]}, {}  # fmt: skip
            return 201, self._new_pull(body["title"], head, base, body.get("body") or ""), {}
        match = re.fullmatch(r"/pulls/(\d+)(/reviews|/comments|/merge)?", rest)
        if match and int(match.group(1)) in self.pulls:
            number, tail = int(match.group(1)), match.group(2)
            if tail is None and method == "GET":
                return 200, self._pull(number), {}
            if tail is None and method == "PATCH":
                for key in ("title", "body", "state"):
                    if key in body:
                        self.pulls[number][key] = body[key]
                self.pulls[number]["updated_at"] = _now()
                return 200, self._pull(number), {}
            if tail == "/reviews":
                return 200, self.reviews.get(number, []), {}
            if tail == "/comments":
                return 200, self.comments.get(number, []), {}
            if tail == "/merge" and method == "PUT":
                status, answer = self._merge(
                    number, body.get("sha"), body.get("merge_method", "merge")
                )
                return status, answer, {}
        match = re.fullmatch(r"/issues/(\d+)/labels", rest)
        if match and method == "PUT" and int(match.group(1)) in self.pulls:
            names = body if isinstance(body, list) else body.get("labels", [])
            labels = [
                {"id": abs(hash(n)) % 10**8, "node_id": "LA_fake",
                 "url": f"{self._api}/labels/{n}", "name": n, "color": "ededed",
                 "default": False, "description": None}
                for n in names
            ]  # fmt: skip
            self.pulls[int(match.group(1))]["labels"] = labels
            return 200, labels, {}
        match = re.fullmatch(r"/commits/([0-9a-f]{40})/check-runs", rest)
        if match and method == "GET":
            runs = self.check_runs.get(match.group(1), [])
            return 200, {"total_count": len(runs), "check_runs": runs}, {}
        return 404, {"message": "Not Found"}, {}


@contextmanager
def github_served(
    bare: Path, *, slug: str = "acme/widgets", latency_s: float = 0.0
) -> Iterator[FakeGitHub]:
    fake = FakeGitHub(bare=bare, slug=slug, latency_s=latency_s)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else {}
            started = time.perf_counter()
            if fake.latency_s:
                time.sleep(fake.latency_s)
            status, answer, headers = fake.handle(self.command, self.path, body)
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("X-RateLimit-Limit", "5000")
            self.send_header("X-RateLimit-Remaining", "4999")
            self.send_header("X-RateLimit-Reset", str(int(time.time()) + 3600))
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)
            with fake.lock:
                fake.served_s += time.perf_counter() - started

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
