"""The docs build with warnings as errors: every nav entry exists, every page is in the nav,
every internal link and anchor resolves, and every docstring the API reference renders parses."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def nav_pages(nav: list) -> list[str]:
    """Every page named in mkdocs.yml's nav, in order."""
    pages = []
    for entry in nav:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def mkdocs_config() -> dict:
    # mkdocs.yml holds no YAML tags, so a plain loader reads it
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def test_the_site_builds_strict_without_a_warning(built_site):
    assert built_site.returncode == 0, built_site.log
    assert not re.findall(r"^(WARNING|ERROR).*", built_site.log, re.MULTILINE)
    for page in nav_pages(mkdocs_config()["nav"]):
        html = built_site.folder / page.replace(".md", ".html")
        assert html.is_file(), f"{page} was not built"


def test_every_markdown_page_is_in_the_nav():
    pages = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))
    assert pages == sorted(nav_pages(mkdocs_config()["nav"]))


def test_the_api_reference_covers_the_public_api(built_site):
    import envhub

    html = (built_site.folder / "reference" / "envhub.html").read_text()
    for name in envhub.__all__:
        module = envhub._EXPORTS[name]
        assert f'id="{module}.{name}"' in html, f"envhub.{name} is missing from the reference"


def test_the_readme_links_into_pages_that_exist():
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert len(targets) > 20, "the README's table of links into the docs"
    missing = [target for target in targets if not (ROOT / target).is_file()]
    assert not missing, f"README links to missing pages: {missing}"


def test_the_api_reference_reads_the_package_as_installed(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    (tmp_path / "envhub").mkdir()
    (tmp_path / "envhub" / "gone.py").symlink_to(ROOT / "envhub" / "env.py")  # a stale entry
    view = hooks.package_view(ROOT, tmp_path)
    assert (view / "trainer" / "config" / "run.py").samefile(ROOT / "trainer" / "config" / "run.py")
    assert (view / "cli" / "app.py").samefile(ROOT / "cli" / "app.py")
    assert (view / "env.py").samefile(ROOT / "envhub" / "env.py")
    assert not (view / "gone.py").exists()
    assert hooks.package_view(ROOT, tmp_path) == view  # again: the same links, no error
