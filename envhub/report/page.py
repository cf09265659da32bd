"""The report page: one HTML file with Plotly, the glue script, the document and the step blocks
inlined, so it opens offline from a file:// URL or any static server."""

from __future__ import annotations

import html
import importlib.util
import json
from pathlib import Path
from typing import Any

from envhub.errors import MissingDependencyError

_HERE = Path(__file__).parent


def plotly_js() -> str:
    """The text of the plotly.js bundle shipped inside the ``plotly`` Python package.

    Raises:
        MissingDependencyError: plotly is not installed.
    """
    spec = importlib.util.find_spec("plotly")  # only the file is needed: never import plotly
    if spec is None or spec.origin is None:
        raise MissingDependencyError.for_extra("plotly", "report")
    return (Path(spec.origin).parent / "package_data" / "plotly.min.js").read_text("utf-8")


def embed_json(value: Any) -> str:
    """``value`` as JSON that is safe inside a ``<script>`` element.

    ``<`` only appears inside JSON strings, where ``\\u003c`` means the same character, so no
    ``</script>`` or ``<!--`` in a message can end the element early.
    """
    return json.dumps(value, separators=(",", ":")).replace("<", "\\u003c")


def render(document: dict[str, Any], blocks: dict[str, dict[str, Any]]) -> str:
    """The whole page for ``document`` and its step ``blocks`` (keyed as in its steps)."""
    step_scripts = "\n".join(
        f'<script type="application/json" id="step-data-{html.escape(key)}">'
        f"{embed_json(block)}</script>"
        for key, block in blocks.items()
    )
    title = html.escape(f"envhub report: {document['name']}")
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{title}</title>\n'
        f"<style>{(_HERE / 'page.css').read_text('utf-8')}</style>\n"
        f"<script>{plotly_js()}</script>\n"
        f"</head><body>\n{(_HERE / 'page.html').read_text('utf-8')}\n"
        f'<script type="application/json" id="report-data">{embed_json(document)}</script>\n'
        f"{step_scripts}\n"
        f"<script>{(_HERE / 'page.js').read_text('utf-8')}</script>\n"
        "</body></html>\n"
    )
