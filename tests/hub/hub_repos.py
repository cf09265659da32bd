"""The state of the local Hub server: repos, commits, branches and tags, as git keeps them.

Every commit is a full snapshot with a parent; a file's id is its git blob sha1, as on the Hub.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import yaml


class HubHTTPError(Exception):
    """An error answer: status, ``X-Error-Code`` and message."""

    def __init__(self, status: int, code: str | None, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def git_blob_sha1(data: bytes) -> str:
    """The id git gives a file's content (what the Hub reports as a file's ``oid``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Commit:
    sha: str
    files: dict[str, bytes]
    parent: str | None
    title: str
    date: str


@dataclass
class PullRequest:
    """A pull request: its branch's head, the commit it started from, who opened it."""

    num: int
    head: str
    base: str
    author: str
    status: str = "open"


@dataclass
class Repo:
    type: str
    id: str
    private: bool
    owner: str
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    pulls: dict[int, PullRequest] = field(default_factory=dict)
    """Pull requests by number; PR ``n``'s branch is ``refs/pr/n``."""

    def resolve(self, revision: str) -> Commit:
        revision = unquote(revision)
        pull = self.pulls.get(int(revision[8:])) if revision.startswith("refs/pr/") else None
        sha = (
            self.branches.get(revision)
            or self.tags.get(revision)
            or (pull.head if pull else None)
            or (revision if revision in self.commits else None)
        )
        if sha is None:
            raise HubHTTPError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return self.commits[sha]

    def card_tags(self, commit: Commit) -> list[str]:
        """Tags from the README's YAML front matter, as the Hub indexes them."""
        meta = card_metadata(commit.files.get("README.md", b""))
        tags = [str(t) for t in meta.get("tags") or []]
        if meta.get("library_name"):
            tags.append(str(meta["library_name"]))
        return tags


def card_metadata(readme: bytes) -> dict[str, Any]:
    text = readme.decode("utf-8", "replace")
    if not text.startswith("---"):
        return {}
    block = text[3:].split("\n---", 1)[0]
    try:
        meta = yaml.safe_load(block)
    except yaml.YAMLError:
        return {}
    return meta if isinstance(meta, dict) else {}


def new_commit(repo: Repo, files: dict[str, bytes], parent: str | None, title: str) -> Commit:
    sha = hashlib.sha1(f"{parent}:{uuid.uuid4()}".encode()).hexdigest()
    commit = Commit(
        sha, files, parent, title, time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
    )
    repo.commits[sha] = commit
    return commit


def refs_listing(kind: str, items: dict[str, str]) -> list[dict[str, str]]:
    return [
        {"name": n, "ref": f"refs/{kind}/{n}", "targetCommit": s} for n, s in sorted(items.items())
    ]


def file_entry(path: str, data: bytes) -> dict[str, Any]:
    return {"type": "file", "oid": git_blob_sha1(data), "size": len(data), "path": path}


def json_reply(value: Any) -> tuple[int, dict[str, str], bytes]:
    return 200, {"Content-Type": "application/json"}, json.dumps(value).encode()
