"""A local server of the Hugging Face Hub's HTTP API, for tests of envhub's Hub support.

The unmodified ``huggingface_hub`` client talks to it through ``HF_ENDPOINT`` (or an explicit
``endpoint=``). It keeps repos in memory with real git-like state: every commit is a full
snapshot with a parent, branches and tags point at commits, file ids are git blob sha1s, and
private repos need the owner's bearer token. Status codes and the ``X-Error-Code`` /
``X-Error-Message`` headers follow the Hub, because the client turns them into its exception
types (``RepositoryNotFoundError``, ``RevisionNotFoundError``, ``EntryNotFoundError``, ...).

Faults for tests: :meth:`HubServer.fail_next` drops the connection of the next request to an
endpoint after reading half its body (a network failure mid-push); :meth:`HubServer.tamper`
serves other bytes for a file than the commit holds (a corrupted or tampered download).

Listings (``GET /api/models``) carry each repo's card metadata (``cardData``: the README's YAML
front matter, every key kept) when asked with ``cardData=True`` or ``expand=cardData``, as the
Hub does for ``HfApi.list_models(cardData=True)``; the client parses it into
``ModelInfo.card_data``, keeping keys it does not know (envhub's ``envhub:`` block).

Pull requests: a commit with ``create_pr=1`` (the client's ``create_pr=True``) may come from any
signed-in user who can read the repo; it opens PR ``n`` on branch ``refs/pr/n``, and the owner
merges it (``HfApi.merge_pull_request``), which applies the files it changed onto ``main``.

What it leaves out: LFS/xet uploads (every upload is "regular", sent base64 inside the commit),
discussions other than merging a PR, organisations, pagination (every listing fits one page).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from hub_repos import (
    Commit,
    HubHTTPError,
    PullRequest,
    Repo,
    card_metadata,
    file_entry,
    git_blob_sha1,
    json_reply,
    new_commit,
    refs_listing,
)

TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
_API_REPO = re.compile(r"^/api/(models|datasets|spaces)/([^/]+)/([^/]+)(?:/(.*))?$")
_RESOLVE = re.compile(r"^(?:/(datasets|spaces))?/([^/]+)/([^/]+)/resolve/([^/]+)/(.+)$")


class HubServer:
    """The server's state and its HTTP endpoints. Start it with :meth:`start`."""

    def __init__(self, users: dict[str, str]) -> None:
        self.tokens = {token: user for user, token in users.items()}
        self.repos: dict[tuple[str, str], Repo] = {}
        self.lock = threading.Lock()
        self.failures: dict[str, int] = {}
        self.fail_after = False
        self.tampered: dict[tuple[str, str], bytes] = {}
        self.requests: list[str] = []
        self.url = ""
        self._httpd: ThreadingHTTPServer | None = None

    # -- test controls ---------------------------------------------------------------------

    def start(self) -> HubServer:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        ).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    def fail_next(self, endpoint: str, times: int = 1, *, after: bool = False) -> None:
        """Drop the connection of the next ``times`` requests whose API path contains ``/endpoint/``
        (``commit``, ``tag``, ``preupload``): after reading half of the request body, or with
        ``after``, once the request is done but before the answer is sent (the answer is lost)."""
        self.failures[endpoint] = times
        self.fail_after = after

    def tamper(self, repo_id: str, path: str, data: bytes) -> None:
        """Serve ``data`` for ``path`` of ``repo_id`` (any revision), with the original headers."""
        self.tampered[(repo_id, path)] = data

    # -- dispatch --------------------------------------------------------------------------

    def user(self, authorization: str | None) -> str | None:
        """The user a bearer token belongs to; a token nobody owns is a 401, as on the Hub."""
        if not authorization:
            return None
        token = authorization.removeprefix("Bearer ").strip()
        if token not in self.tokens:
            raise HubHTTPError(401, None, "Invalid credentials in Authorization header")
        return self.tokens[token]

    def repo(self, type_: str, repo_id: str, user: str | None, write: bool = False) -> Repo:
        repo = self.repos.get((type_, repo_id))
        visible = repo is not None and (not repo.private or user == repo.owner)
        if not visible:
            # The Hub answers 401 to anonymous callers and 404 to signed-in ones, and never says
            # whether a private repo exists.
            raise HubHTTPError(404 if user else 401, "RepoNotFound", "Repository not found")
        if write and user != repo.owner:
            raise HubHTTPError(403, None, f"You don't have the rights to write to {repo_id}")
        return repo

    def handle(
        self, method: str, path: str, query: dict[str, list[str]], body: bytes, user: str | None
    ) -> tuple[int, dict[str, str], bytes]:
        if path == "/api/whoami-v2":
            if user is None:
                raise HubHTTPError(401, None, "Invalid username or password.")
            return json_reply(
                {
                    "type": "user",
                    "name": user,
                    "orgs": [],
                    "auth": {"type": "access_token", "accessToken": {"role": "write"}},
                }
            )
        if path == "/api/validate-yaml":
            return json_reply({"errors": [], "warnings": []})
        if path == "/api/repos/create" and method == "POST":
            return self.create_repo(json.loads(body or b"{}"), user)
        if method == "GET" and path in ("/api/models", "/api/datasets", "/api/spaces"):
            return self.list_repos(TYPES[path.rsplit("/", 1)[1]], query, user)
        match = _API_REPO.match(path)
        if match:
            kind, ns, name, rest = match.groups()
            return self.repo_api(method, TYPES[kind], f"{ns}/{name}", rest or "", query, body, user)
        match = _RESOLVE.match(path)
        if match and method in ("GET", "HEAD"):
            kind, ns, name, revision, file = match.groups()
            return self.resolve(
                TYPES.get(f"{kind}", "model") if kind else "model",
                f"{ns}/{name}",
                revision,
                unquote(file),
                user,
            )
        raise HubHTTPError(404, None, f"no route {method} {path}")

    def create_repo(
        self, payload: dict[str, Any], user: str | None
    ) -> tuple[int, dict[str, str], bytes]:
        if user is None:
            raise HubHTTPError(401, None, "You must be authenticated to create a repo")
        namespace = payload.get("organization") or user
        if namespace != user:
            raise HubHTTPError(
                403, None, f"You don't have the rights to create a repo under {namespace}"
            )
        type_ = payload.get("type") or "model"
        repo_id = f"{namespace}/{payload['name']}"
        url = f"{self.url}/{'' if type_ == 'model' else type_ + 's/'}{repo_id}"
        if (type_, repo_id) in self.repos:
            return (
                409,
                {"Content-Type": "application/json"},
                json.dumps({"error": "You already created this repo", "url": url}).encode(),
            )
        private = bool(payload.get("private")) or payload.get("visibility") == "private"
        repo = Repo(type_, repo_id, private, user)
        first = new_commit(
            repo,
            {".gitattributes": b"*.bin filter=lfs diff=lfs merge=lfs -text\n"},
            None,
            "initial commit",
        )
        repo.branches["main"] = first.sha
        self.repos[(type_, repo_id)] = repo
        return json_reply({"url": url, "name": repo_id})

    def list_repos(
        self, type_: str, query: dict[str, list[str]], user: str | None
    ) -> tuple[int, dict[str, str], bytes]:
        wanted = set(query.get("filter", []))
        asked = [*query.get("cardData", []), *query.get("expand", [])]
        card_data = any(value.lower() == "true" or value == "cardData" for value in asked)
        search = (query.get("search") or [""])[0].lower()
        author = (query.get("author") or [None])[0]
        found = []
        for repo in self.repos.values():
            if repo.type != type_ or (repo.private and repo.owner != user):
                continue
            head = repo.commits[repo.branches["main"]]
            tags = repo.card_tags(head)
            if (
                wanted - set(tags)
                or search not in repo.id.lower()
                or (author and repo.id.split("/")[0] != author)
            ):
                continue
            found.append({"id": repo.id, "_id": repo.id, "modelId": repo.id,
                          "private": repo.private, "tags": tags, "sha": head.sha,
                          "lastModified": head.date, "downloads": 0, "likes": 0})  # fmt: skip
            if card_data:
                found[-1]["cardData"] = card_metadata(head.files.get("README.md", b"")) or None
        limit = int((query.get("limit") or [1000])[0])
        return json_reply(sorted(found, key=lambda r: r["id"])[:limit])

    def repo_api(
        self,
        method: str,
        type_: str,
        repo_id: str,
        rest: str,
        query: dict[str, list[str]],
        body: bytes,
        user: str | None,
    ) -> tuple[int, dict[str, str], bytes]:
        head, _, tail = rest.partition("/")
        pull_request = "1" in query.get("create_pr", [])
        if pull_request and user is None:
            raise HubHTTPError(401, None, "You must be authenticated to open a pull request")
        write = method == "POST" and head in ("preupload", "commit", "tag", "branch")
        # Anyone who can read a repo may open a pull request on it; merging is the owner's.
        repo = self.repo(type_, repo_id, user, write=write and not pull_request)
        if method == "GET" and head in ("", "revision"):
            return json_reply(self.info(repo, repo.resolve(tail or "main")))
        if method == "GET" and head == "refs":
            return json_reply(
                {
                    "branches": refs_listing("heads", repo.branches),
                    "tags": refs_listing("tags", repo.tags),
                    "converts": [],
                }
            )
        if method == "GET" and head == "tree":
            revision, _, prefix = tail.partition("/")
            return json_reply(
                self.tree(
                    repo,
                    repo.resolve(revision),
                    unquote(prefix),
                    "true" in query.get("recursive", []),
                )
            )
        if method == "GET" and head == "commits":
            return json_reply(self.history(repo, repo.resolve(tail)))
        if method == "POST" and head == "paths-info":
            commit = repo.resolve(tail)
            paths = parse_qs(body.decode()).get("paths", [])
            return json_reply([file_entry(p, commit.files[p]) for p in paths if p in commit.files])
        if method == "POST" and head == "preupload":
            commit = repo.resolve(tail)
            files = json.loads(body)["files"]
            return json_reply(
                {
                    "files": [
                        {
                            "path": f["path"],
                            "uploadMode": "regular",
                            "shouldIgnore": False,
                            "oid": git_blob_sha1(commit.files[f["path"]])
                            if f["path"] in commit.files
                            else None,
                        }
                        for f in files
                    ]
                }
            )
        if method == "POST" and head == "commit":
            return self.commit(repo, unquote(tail), body, pull_request, user)
        if method == "POST" and head == "discussions" and tail.endswith("/merge"):
            return self.merge(repo, int(tail.split("/")[0]), user)
        if method == "POST" and head == "tag":
            return self.tag(repo, repo.resolve(tail), json.loads(body))
        raise HubHTTPError(404, None, f"no route {method} {rest}")

    def info(self, repo: Repo, commit: Commit) -> dict[str, Any]:
        meta = card_metadata(commit.files.get("README.md", b""))
        return {"id": repo.id, "_id": repo.id, "modelId": repo.id, "author": repo.owner,
                "sha": commit.sha, "private": repo.private, "disabled": False, "gated": False,
                "lastModified": commit.date, "tags": repo.card_tags(commit),
                "cardData": meta or None, "downloads": 0, "likes": 0,
                "siblings": [{"rfilename": p} for p in sorted(commit.files)]}  # fmt: skip

    def tree(
        self, repo: Repo, commit: Commit, prefix: str, recursive: bool
    ) -> list[dict[str, Any]]:
        base = f"{prefix.rstrip('/')}/" if prefix else ""
        entries: dict[str, dict[str, Any]] = {}
        for path, data in sorted(commit.files.items()):
            if not path.startswith(base):
                continue
            parts = path[len(base) :].split("/")
            if recursive:
                for i in range(1, len(parts)):
                    folder = base + "/".join(parts[:i])
                    entries.setdefault(
                        folder,
                        {
                            "type": "directory",
                            "oid": hashlib.sha1(folder.encode()).hexdigest(),
                            "path": folder,
                            "size": 0,
                        },
                    )
                entries[path] = file_entry(path, data)
            elif len(parts) == 1:
                entries[path] = file_entry(path, data)
            else:
                folder = base + parts[0]
                entries.setdefault(
                    folder,
                    {
                        "type": "directory",
                        "oid": hashlib.sha1(folder.encode()).hexdigest(),
                        "path": folder,
                        "size": 0,
                    },
                )
        if prefix and not entries:
            raise HubHTTPError(404, "EntryNotFound", f"{prefix} does not exist on {commit.sha}")
        return list(entries.values())

    def history(self, repo: Repo, commit: Commit | None) -> list[dict[str, Any]]:
        out = []
        while commit is not None:
            out.append(
                {
                    "id": commit.sha,
                    "title": commit.title,
                    "message": "",
                    "authors": [{"user": repo.owner}],
                    "date": commit.date,
                }
            )
            commit = repo.commits.get(commit.parent) if commit.parent else None
        return out

    def commit(
        self, repo: Repo, branch: str, body: bytes, pull_request: bool = False, user: str = ""
    ) -> tuple[int, dict[str, str], bytes]:
        if branch not in repo.branches:
            raise HubHTTPError(404, "RevisionNotFound", f"Invalid rev id: {branch}")
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        header = next(item["value"] for item in lines if item["key"] == "header")
        head = repo.commits[repo.branches[branch]]
        if pull_request:  # a new PR starts from the parent commit given, else the branch's head
            head = repo.commits[header.get("parentCommit") or head.sha]
        elif header.get("parentCommit") and header["parentCommit"] != head.sha:
            raise HubHTTPError(
                412, None, "A commit has happened since. Please refresh and try again."
            )
        new = new_commit(
            repo, apply_operations(head.files, lines), head.sha, header.get("summary") or "update"
        )
        pr_url = None
        if pull_request:
            num = len(repo.pulls) + 1
            repo.pulls[num] = PullRequest(num, new.sha, head.sha, user)
            pr_url = f"{self.url}/{repo.id}/discussions/{num}"
        else:
            repo.branches[branch] = new.sha
        return json_reply(
            {
                "commitUrl": f"{self.url}/{repo.id}/commit/{new.sha}",
                "commitOid": new.sha,
                "pullRequestUrl": pr_url,
            }
        )

    def merge(self, repo: Repo, num: int, user: str | None) -> tuple[int, dict[str, str], bytes]:
        """Merge PR ``num`` into ``main``: the files it changed from its base, onto main's head."""
        if user != repo.owner:
            raise HubHTTPError(403, None, f"You don't have the rights to merge into {repo.id}")
        pull = repo.pulls.get(num)
        if pull is None or pull.status != "open":
            raise HubHTTPError(404, None, f"no open pull request #{num}")
        base, ours = repo.commits[pull.base].files, repo.commits[pull.head].files
        files = dict(repo.commits[repo.branches["main"]].files)
        files.update({p: d for p, d in ours.items() if base.get(p) != d})
        for path in set(base) - set(ours):
            files.pop(path, None)
        merged = new_commit(repo, files, repo.branches["main"], f"Merge pull request #{num}")
        repo.branches["main"], pull.status = merged.sha, "merged"
        return json_reply({})

    def tag(
        self, repo: Repo, commit: Commit, payload: dict[str, Any]
    ) -> tuple[int, dict[str, str], bytes]:
        name = payload["tag"]
        if name in repo.tags or name in repo.branches:
            raise HubHTTPError(409, None, f"Tag {name} already exists")
        repo.tags[name] = commit.sha
        return json_reply({})

    def resolve(
        self, type_: str, repo_id: str, revision: str, path: str, user: str | None
    ) -> tuple[int, dict[str, str], bytes]:
        repo = self.repo(type_, repo_id, user)
        commit = repo.resolve(revision)
        if path not in commit.files:
            raise HubHTTPError(404, "EntryNotFound", f"{path} does not exist on {commit.sha}")
        data = commit.files[path]
        headers = {
            "ETag": f'"{git_blob_sha1(data)}"',
            "X-Repo-Commit": commit.sha,
            "Content-Type": "application/octet-stream",
        }
        return 200, headers, self.tampered.get((repo_id, path), data)


def apply_operations(files: dict[str, bytes], lines: list[dict[str, Any]]) -> dict[str, bytes]:
    """``files`` after a commit's file, deletedFile and deletedFolder operations."""
    files = dict(files)
    for item in lines:
        value = item["value"]
        if item["key"] == "file":
            files[value["path"]] = (
                base64.b64decode(value["content"])
                if value.get("encoding") == "base64"
                else value["content"].encode()
            )
        elif item["key"] == "deletedFile":
            files.pop(value["path"], None)
        elif item["key"] == "deletedFolder":
            files = {
                p: d for p, d in files.items() if not p.startswith(value["path"].rstrip("/") + "/")
            }
        elif item["key"] == "lfsFile":
            raise HubHTTPError(400, None, "this test server takes regular uploads only")
    return files


def _handler(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # without it every answer waits ~45 ms for a delayed ACK

        def log_message(self, *args: Any) -> None:
            pass

        def _serve(self) -> None:
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            fail = self._should_fail(url.path)
            if fail and not hub.fail_after:
                self.rfile.read(length // 2)
                self._drop()
                return
            # Read the whole body before answering, even with an error: an unread body would be
            # taken for the next request on this keep-alive connection.
            body = self.rfile.read(length) if length else b""
            hub.requests.append(f"{self.command} {url.path}")
            try:
                with hub.lock:
                    user = hub.user(self.headers.get("Authorization"))
                    status, headers, data = hub.handle(
                        self.command, url.path, parse_qs(url.query), body, user
                    )
            except HubHTTPError as e:
                status, data = e.status, json.dumps({"error": e.message}).encode()
                headers = {"Content-Type": "application/json", "X-Error-Message": e.message}
                if e.code:
                    headers["X-Error-Code"] = e.code
            if fail:
                self._drop()
                return
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _drop(self) -> None:
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True

        def _should_fail(self, path: str) -> bool:
            with hub.lock:
                for endpoint, left in hub.failures.items():
                    if left > 0 and f"/{endpoint}/" in path:
                        hub.failures[endpoint] = left - 1
                        return True
            return False

        do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = _serve

    return Handler
