"""Shared rich consoles (stdout for results, stderr for errors and progress)."""

from __future__ import annotations

from rich.console import Console

console = Console()
err_console = Console(stderr=True)
