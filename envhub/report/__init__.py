"""``envhub report``: one self-contained HTML page for a training run or an ``envhub eval`` folder.

The page holds learning curves (drawn by plotly.js, inlined from the ``plotly`` package) and a
trajectory browser whose episodes are stored one step per ``<script type="application/json">``
block, parsed only when that step is chosen, so a long run opens quickly. It needs no network.

Policy tokens are shaded by the gap between the sampler's logprob (on the trajectory) and the
trainer's (saved by the trainer in ``trajectories/trainer/``), or by the sampler's probability
where no trainer logprobs exist (an eval, a backend that returns none: Megatron with one update
per step).
"""

from __future__ import annotations

import logging
from functools import cache
from pathlib import Path

from envhub.report.data import Decode, build
from envhub.report.page import render
from envhub.report.server import make_server

__all__ = ["load_decoder", "make_server", "write_report"]

logger = logging.getLogger(__name__)


def write_report(
    folder: str | Path, out: str | Path | None = None, decode: Decode | None = None
) -> Path:
    """Write the report for ``folder`` (a run folder or an ``envhub eval`` folder).

    Args:
        folder: What ``envhub train`` or ``envhub eval`` wrote.
        out: The HTML file to write; ``folder/report.html`` by default.
        decode: Token id to text; without it the page shows token ids.

    Returns:
        The path written.
    """
    folder = Path(folder)
    document, blocks = build(folder, decode)
    target = Path(out) if out is not None else folder / "report.html"
    target.write_text(render(document, blocks), encoding="utf-8")
    return target


def load_decoder(model: str) -> Decode | None:
    """A token decoder from the tokenizer of ``model`` (a model folder or a Hub id in the local
    cache; ``envhub report`` resolves the run's model name to one), read from local files only;
    ``None`` (the page then shows ids) when transformers or the tokenizer is not available here."""
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    except Exception as e:  # any failure only costs the token text, never the report
        logger.warning(
            "token text unavailable (%s: %s); the report shows token ids", type(e).__name__, e
        )
        return None

    @cache
    def decode(token_id: int) -> str:
        return tokenizer.decode([token_id])

    return decode
