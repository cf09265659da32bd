"""``envhub search`` / ``envhub list --hub``: env packages on the Hub, found by their tag."""

from __future__ import annotations

from dataclasses import dataclass, field

from envhub.hub import client


@dataclass(frozen=True)
class HubPackage:
    """An env package repo as the Hub lists it."""

    repo_id: str
    tags: list[str] = field(default_factory=list)
    last_modified: str = ""
    private: bool = False


def search(
    query: str | None = None,
    *,
    author: str | None = None,
    limit: int = 50,
    token: str | None = None,
) -> list[HubPackage]:
    """Env packages (repos tagged ``envhub``) whose name contains ``query``; all without one."""
    with client.hub_errors("search", query or "*"):
        models = client.api(token).list_models(
            filter=client.TAG, search=query or None, author=author, limit=limit
        )
        found = [
            HubPackage(m.id, sorted(m.tags or []), str(m.last_modified or ""), bool(m.private))
            for m in models
        ]
    return sorted(found, key=lambda p: p.repo_id)
