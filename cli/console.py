"""Shared rich consoles (stdout for results, stderr for errors and progress), and the listing
that ``envhub list`` and ``envhub search`` print."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

console = Console()
err_console = Console(stderr=True)

GAP = 2
"""Spaces between a listing's columns."""


def listing(
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[str | Text]],
    width: int,
    *,
    under: dict[str, str],
    min_last: int,
) -> RenderableType:
    """Rows as a table in which only the last column wraps: names, ids and versions never do.

    When that would leave the last column fewer than ``min_last`` of ``width`` characters, each
    row takes two or more lines instead: the columns not in ``under`` on the first, then each
    column of ``under`` on its own indented line, after its prefix (``{"tools": "tools: "}``).
    Cells are plain text (docstrings and errors hold brackets) or rich ``Text``.
    """
    cells = [[Text(c) if isinstance(c, str) else c for c in row] for row in rows]
    fixed = _widths(headers[:-1], [row[:-1] for row in cells])
    if width - sum(fixed) - GAP * len(fixed) >= min_last:
        return _table(title, headers, cells)
    return _rows_and_lines(title, headers, cells, under)


def _widths(headers: Sequence[str], rows: Sequence[Sequence[Text]]) -> list[int]:
    return [max([len(h), *(row[i].cell_len for row in rows)]) for i, h in enumerate(headers)]


def _table(title: str, headers: Sequence[str], rows: list[list[Text]]) -> Table:
    table = Table(
        title=title, title_justify="left", box=None, pad_edge=False, padding=(0, GAP, 0, 0)
    )
    for header in headers:
        table.add_column(header, header_style="bold", no_wrap=header != headers[-1])
    for row in rows:
        table.add_row(*row)
    return table


def _rows_and_lines(
    title: str, headers: Sequence[str], rows: list[list[Text]], under: dict[str, str]
) -> Group:
    kept = [i for i, h in enumerate(headers) if h not in under]
    moved = [(headers.index(h), prefix) for h, prefix in under.items()]
    widths = _widths([headers[i] for i in kept], [[row[i] for i in kept] for row in rows])
    parts: list[RenderableType] = [Text(title, style="table.title")]
    parts.append(_line([Text(headers[i]) for i in kept], widths, style="bold"))
    for row in rows:
        parts.append(_line([row[i] for i in kept], widths))
        parts += [Padding(Text(p) + row[i], (0, 0, 0, 4)) for i, p in moved if row[i]]
    return Group(*parts)


def _line(cells: Sequence[Text], widths: Sequence[int], style: str = "") -> Text:
    """Cells padded to their columns' widths, ``GAP`` apart."""
    line = Text(style=style)
    for cell, width in zip(cells, widths, strict=True):
        line.append_text(cell)
        line.append(" " * (width - cell.cell_len + GAP))
    line.rstrip()
    return line
