"""The code blocks of the docs pages, as the docs tests read them.

Conventions (written down for authors in docs/developers.md):

- ```` ```python ````, ```` ```bash ```` and ```` ```yaml ```` blocks run in the suite:
  Python in a process of its own from the repository root; bash with ``bash -e`` in an empty
  temporary folder (``examples/`` linked in), the venv's commands first on ``PATH``; YAML is a
  fragment of a training config, validated on top of ``examples/quickstart.yaml``.
- ``<!-- not-run: REASON -->`` on the line before a block keeps it from running; the reason is
  required (installs, GPUs, training runs, servers).
- ``<!-- continued -->`` before a Python block runs it after the page's Python blocks before it,
  in one process: a tutorial page builds one program block by block.
- ```` ```text ```` blocks are output or a file tree, never code; no other language is allowed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RUNNABLE = ("python", "bash", "yaml")
LANGUAGES = (*RUNNABLE, "text")
FENCE = re.compile(r"^```(\S*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
MARKER = re.compile(r"<!--\s*(not-run|continued)\s*(?::\s*(.*?))?\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    language: str
    code: str
    marker: str | None  # "not-run", "continued" or None
    reason: str = ""

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def page_blocks(path: Path) -> list[Block]:
    """Every fenced block of one page, with the marker on the line before it."""
    text = path.read_text()
    page = str(path.relative_to(DOCS))
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.search(before)
        found.append(
            Block(
                page=page,
                line=text.count("\n", 0, match.start()) + 1,
                language=match.group(1),
                code=match.group(2),
                marker=marker.group(1) if marker else None,
                reason=(marker.group(2) or "") if marker else "",
            )
        )
    return found


def all_blocks() -> list[Block]:
    """Every block of every page under docs/, page by page."""
    return [block for path in sorted(DOCS.rglob("*.md")) for block in page_blocks(path)]


def python_program(block: Block, blocks: list[Block]) -> str:
    """The code a Python block runs: itself, after the blocks it continues."""
    same_page = [b for b in blocks if b.page == block.page and b.language == "python"]
    chain = [block]
    index = same_page.index(block)
    while chain[0].marker == "continued" and index > 0:
        index -= 1
        chain.insert(0, same_page[index])
    return "\n".join(b.code for b in chain)
