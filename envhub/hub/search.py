"""``envhub search`` / ``envhub list --hub``: env packages on the Hub, found by their tag.

The listing asks the Hub for each repo's card metadata (``cardData``, the README's YAML front
matter), where ``envhub push`` put the performance numbers ``envhub check`` measured: no
package is downloaded to show them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from envhub.hub import client


@dataclass(frozen=True)
class HubPackage:
    """An env package repo as the Hub lists it."""

    repo_id: str
    tags: list[str] = field(default_factory=list)
    last_modified: str = ""
    private: bool = False
    performance: dict[str, Any] = field(default_factory=dict)
    """``{"machine": ..., "envs": {NAME: Performance}}`` from the card (see
    :mod:`envhub.evaluation.perf`); empty for a package pushed without them."""

    def slowest(self) -> tuple[str, dict[str, Any]] | None:
        """The env with the fewest episodes/s and its numbers (``None`` without numbers): the
        one a training run would wait on."""
        envs = self.performance.get("envs") or {}
        if not envs:
            return None
        return min(envs.items(), key=lambda item: item[1]["episodes_per_s"])


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
            filter=client.TAG, search=query or None, author=author, limit=limit, cardData=True
        )
        found = [
            HubPackage(m.id, sorted(m.tags or []), str(m.last_modified or ""), bool(m.private),
                       _performance(m.card_data))
            for m in models
        ]  # fmt: skip
    return sorted(found, key=lambda p: p.repo_id)


def _performance(card_data: Any) -> dict[str, Any]:
    """The ``envhub.performance`` block of a card's metadata; ``{}`` when it has none or it is
    malformed (a hand-edited card must not break the listing)."""
    ours = card_data.get("envhub") if card_data is not None else None
    performance = ours.get("performance") if isinstance(ours, dict) else None
    envs = performance.get("envs") if isinstance(performance, dict) else None
    if isinstance(envs, dict) and envs and all(map(_has_numbers, envs.values())):
        return performance
    return {}


def _has_numbers(numbers: Any) -> bool:
    return isinstance(numbers, dict) and all(
        isinstance(numbers.get(key), (int, float)) for key in ("episodes_per_s", "step_p50_ms")
    )
