"""The Hub card of an env package: the package README with Hub metadata and the check report.

The YAML front matter gains the ``envhub`` tag and ``library_name: envhub`` (the Hub indexes
both, ``envhub search`` filters on the tag); the body gains a section, between markers so that
the next push replaces it, with the install command and the ``envhub check`` report.
"""

from __future__ import annotations

from typing import Any

import yaml

from envhub.hub.client import TAG

BEGIN = "<!-- envhub:begin (written by envhub push; edits here are replaced) -->"
END = "<!-- envhub:end -->"


def split_front_matter(text: str) -> tuple[dict[str, Any], str]:
    """(metadata, body) of a README; no front matter gives ``({}, text)``."""
    if not text.startswith("---"):
        return {}, text
    block, sep, body = text[3:].partition("\n---")
    if not sep:
        return {}, text
    meta = yaml.safe_load(block) or {}
    return (meta if isinstance(meta, dict) else {}), body.lstrip("-").lstrip("\n")


def render_card(
    readme: str,
    *,
    repo_id: str,
    version: str,
    envs: dict[str, str],
    description: str,
    report_markdown: str | None,
) -> str:
    """The README.md uploaded for a package."""
    meta, body = split_front_matter(readme)
    tags = [str(t) for t in meta.get("tags") or []]
    meta["tags"] = [TAG, *(t for t in tags if t != TAG)]
    meta["library_name"] = "envhub"
    if BEGIN in body:
        before, _, rest = body.partition(BEGIN)
        body = before.rstrip("\n") + "\n" + rest.partition(END)[2].lstrip("\n")
    body = body.rstrip("\n") or f"# {repo_id}\n\n{description}"
    report = report_markdown or "`envhub check` was skipped for this version (`--skip-check`).\n"
    section = (
        f"{BEGIN}\n## Install with envhub\n\n"
        f"```bash\nenvhub install {repo_id}@{version} --trust\n```\n\n"
        f"Envs: {', '.join(f'`{n}`' for n in sorted(envs))}. "
        f'In Python: `envhub.make("{repo_id}@{version}", trust_remote_code=True)`.\n\n'
        f"### Checks of version {version}\n\n{report}{END}\n"
    )
    front = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True)
    return f"---\n{front}---\n\n{body}\n\n{section}"
