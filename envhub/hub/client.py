"""The ``huggingface_hub`` client as envhub uses it: one place for the endpoint, the token,
the repo type, and the translation of the client's errors into envhub's.

``huggingface_hub`` is imported inside the functions here, so ``import envhub`` stays light.
The endpoint is read from ``HF_ENDPOINT`` at each call (the client itself reads it once, at its
own import) and passed explicitly to every client call.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from envhub.errors import ConfigError, HubAuthError, HubError, HubNotFoundError

REPO_TYPE = "model"
"""Env packages live in model repos; docs/guides/hub.md ("Why model repos") says why."""
TAG = "envhub"
"""The tag every env package's card carries; ``envhub search`` filters on it."""
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class HubRef:
    """``owner/name`` with an optional ``@revision`` (a version tag, a branch or a commit)."""

    repo_id: str
    revision: str | None = None

    def __str__(self) -> str:
        return f"{self.repo_id}@{self.revision}" if self.revision else self.repo_id


def is_hub_ref(name: str) -> bool:
    """True when ``name`` looks like ``owner/name[@revision]``, not an installed env's name."""
    return _REPO_ID.match(name.partition("@")[0]) is not None


def parse_ref(text: str) -> HubRef:
    """``"owner/name@1.0.0"`` -> ``HubRef("owner/name", "1.0.0")``.

    Raises:
        ConfigError: The text is not ``owner/name`` with an optional ``@revision``.
    """
    repo_id, sep, revision = text.strip().partition("@")
    if not _REPO_ID.match(repo_id) or (sep and not revision):
        raise ConfigError(
            f"{text!r} is not a Hub reference; "
            "write owner/name, owner/name@VERSION or owner/name@COMMIT"
        )
    return HubRef(repo_id, revision or None)


def is_commit(revision: str | None) -> bool:
    """True when ``revision`` is a full 40-character commit id (not a tag or a branch)."""
    return revision is not None and _COMMIT.match(revision) is not None


def endpoint() -> str:
    """The Hub's address: ``HF_ENDPOINT`` if set, else huggingface.co."""
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def api(token: str | None = None) -> Any:
    """An ``HfApi`` for :func:`endpoint`.

    ``token`` falls back to ``HF_TOKEN`` or the one saved by ``hf auth login``.
    """
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint(), token=token)


@contextmanager
def hub_errors(what: str, repo_id: str, revision: str | None = None) -> Iterator[None]:
    """Turn the client's exceptions, raised while doing ``what``, into envhub's errors."""
    from huggingface_hub import errors

    try:
        yield
    except errors.RevisionNotFoundError as e:
        raise HubNotFoundError(
            f"{repo_id} has no version or revision {revision!r}; "
            f"`envhub pull {repo_id} --list` shows its versions"
        ) from e
    except errors.RepositoryNotFoundError as e:
        raise HubNotFoundError(
            f"{what}: no repo {repo_id} on {endpoint()}. "
            "If it is private, give a token that can read it (--token, HF_TOKEN or `hf auth login`)"
        ) from e
    except errors.EntryNotFoundError as e:
        raise HubNotFoundError(f"{what}: {repo_id}@{revision} lacks a file: {e}") from e
    except errors.HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else None
        if status == 401:
            raise HubAuthError(
                f"{what}: the Hub rejected the token (401); "
                "check HF_TOKEN / --token or run `hf auth login`"
            ) from e
        if status == 403:
            raise HubAuthError(
                f"{what}: the token may not write to {repo_id} (403); "
                "use a write token of its owner"
            ) from e
        raise HubError(f"{what} failed: {e}") from e
    except OSError as e:  # connection refused, reset, timed out (httpx errors are not OSErrors)
        raise HubError(f"{what}: cannot reach {endpoint()}: {e}") from e
    except Exception as e:
        if type(e).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore", "httpcore2"):
            raise HubError(
                f"{what}: the connection to {endpoint()} failed: {type(e).__name__}: {e}"
            ) from e
        raise


def require_token(token: str | None, what: str) -> str:
    """The token to write with; raises a clear error when there is none."""
    from huggingface_hub.utils import get_token

    found = token or get_token()
    if not found:
        raise HubAuthError(
            f"{what} needs a Hub token with write access: "
            "pass --token, set HF_TOKEN, or run `hf auth login`"
        )
    return found
