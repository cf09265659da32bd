"""The Hub catalog page: one HTML file with its style, glue script and document inlined, so it
opens offline from a file:// URL or any static server (the document: :mod:`envhub.hub.catalog`)."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from envhub.report.page import embed_json

_HERE = Path(__file__).parent


def render(document: dict[str, Any]) -> str:
    """The whole page for the catalog ``document``."""
    title = html.escape(f"envhub catalog: {document['hub']}")
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{title}</title>\n'
        f"<style>{(_HERE / 'catalog.css').read_text('utf-8')}</style>\n"
        f"</head><body>\n{(_HERE / 'catalog.html').read_text('utf-8')}\n"
        f'<script type="application/json" id="catalog-data">{embed_json(document)}</script>\n'
        f"<script>{(_HERE / 'catalog.js').read_text('utf-8')}</script>\n"
        "</body></html>\n"
    )
