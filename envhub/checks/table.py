"""The table of check results that ``envhub check`` prints and ``print(check_env(env))`` shows.

One renderer for both: a rich :class:`~rich.table.Table` (rich is imported only when a table
is made), with skipped rows in their own colour and word.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rich.table import Table

_STYLES = {"ok": "green", "fail": "red", "skipped": "yellow"}


class Row(Protocol):
    """What a row shows of a check's result (:class:`envhub.checks.checker.CheckResult` is one)."""

    @property
    def name(self) -> str:
        """The check's name (the first column)."""
        ...

    @property
    def outcome(self) -> str:
        """``ok``, ``fail`` or ``skipped``."""
        ...

    @property
    def detail(self) -> str:
        """What was checked, what went wrong, or why nothing was."""
        ...


def results_table(
    subject: str,
    results: Iterable[Row],
    *,
    passed: bool,
    note: str = "",
    first_column: str = "check",
) -> Table:
    """A table of ``results`` (check, result, detail) titled ``SUBJECT: passed|FAILED NOTE``."""
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    verdict = "[green]passed[/]" if passed else "[red]FAILED[/]"
    table = Table(title=f"{escape(subject)}: {verdict}{escape(note)}", title_justify="left")
    table.add_column(first_column, overflow="fold")
    table.add_column("result")
    table.add_column("detail", overflow="fold")
    for r in results:
        table.add_row(r.name, f"[{_STYLES[r.outcome]}]{r.outcome}[/]", Text(r.detail))
    return table


def render_text(table: Table, width: int = 100) -> str:
    """``table`` as plain text, ``width`` columns wide (what ``print`` shows)."""
    from rich.console import Console

    console = Console(width=width, record=True, color_system=None, file=_Discard())
    console.print(table)
    return "\n".join(line.rstrip() for line in console.export_text().splitlines())


class _Discard:
    """A file that drops what is written (the console records it instead)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass
