"""What a push uploads and leaves out, the content hash, the Hub card and references."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from envhub.errors import ConfigError
from envhub.hub.card import BEGIN, END, render_card, split_front_matter
from envhub.hub.client import HubRef, is_hub_ref, parse_ref
from envhub.hub.files import content_hash, file_hashes, select_files


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_secrets_and_junk_are_left_out_and_reported(tmp_path: Path) -> None:
    write(tmp_path, {
        "pyproject.toml": "", "README.md": "", "pkg/env.py": "", "pkg/data/tasks.jsonl": "",
        ".env": "HF_TOKEN=x", ".env.local": "", "deploy.pem": "", "id_rsa": "",
        "pkg/client_secret.json": "", ".git/config": "", ".venv/bin/python": "",
        "pkg/__pycache__/env.cpython-311.pyc": "", "dist/x.whl": "",
        "capital.egg-info/PKG-INFO": "", "notes.swp": "", "envhub.lock": "", "envhub.json": "",
    })  # fmt: skip
    selection = select_files(tmp_path)
    assert selection.files == ["README.md", "pkg/data/tasks.jsonl", "pkg/env.py", "pyproject.toml"]
    assert dict(selection.skipped) == {
        ".env": "looks like a secret", ".env.local": "looks like a secret",
        "deploy.pem": "looks like a secret", "id_rsa": "looks like a secret",
        "pkg/client_secret.json": "looks like a secret",
        ".git/": "junk (version control, environment, cache or build output)",
        ".venv/": "junk (version control, environment, cache or build output)",
        "pkg/__pycache__/": "junk (version control, environment, cache or build output)",
        "dist/": "junk (version control, environment, cache or build output)",
        "capital.egg-info/": "junk (version control, environment, cache or build output)",
        "notes.swp": "junk", "envhub.lock": "junk", "envhub.json": "junk",
    }  # fmt: skip


def test_content_hash_is_sha256_of_sorted_lines_without_card(tmp_path: Path) -> None:
    write(tmp_path, {"b.py": "b", "a.py": "a", "README.md": "card"})
    hashes = file_hashes(tmp_path, ["b.py", "a.py", "README.md"])
    sha = {c: hashlib.sha256(c.encode()).hexdigest() for c in ("a", "b")}
    expected = hashlib.sha256(f"{sha['a']}  a.py\n{sha['b']}  b.py\n".encode()).hexdigest()
    assert content_hash(hashes) == f"sha256:{expected}"
    assert content_hash({**hashes, "README.md": "0" * 64}) == content_hash(hashes)
    assert content_hash({**hashes, "a.py": "0" * 64}) != content_hash(hashes)


def test_card_gains_tag_library_and_a_replaceable_section() -> None:
    readme = "---\nlicense: mit\ntags:\n  - games\n---\n\n# my env\n\nText.\n"
    card = render_card(
        readme,
        repo_id="alice/my-env",
        version="1.0.0",
        envs={"my-env": "m:E"},
        description="d",
        report_markdown="REPORT\n",
    )
    meta, body = split_front_matter(card)
    assert meta == {"license": "mit", "tags": ["envhub", "games"], "library_name": "envhub"}
    assert body.startswith("# my env\n\nText.\n\n" + BEGIN) and body.endswith(f"REPORT\n{END}\n")
    assert "envhub install alice/my-env@1.0.0 --trust" in body
    again = render_card(
        card,
        repo_id="alice/my-env",
        version="1.1.0",
        envs={"my-env": "m:E"},
        description="d",
        report_markdown="NEW\n",
    )
    assert (
        again.count(BEGIN) == 1 and "NEW\n" in again and "REPORT" not in again and "@1.1.0" in again
    )
    assert yaml.safe_load(again.split("---")[1])["tags"] == ["envhub", "games"]


def test_card_without_front_matter_or_readme() -> None:
    meta, body = split_front_matter(
        render_card(
            "",
            repo_id="a/b",
            version="0.1.0",
            envs={"b": "m:E"},
            description="An env.",
            report_markdown=None,
        )
    )
    assert meta == {"tags": ["envhub"], "library_name": "envhub"}
    assert body.startswith("# a/b\n\nAn env.\n") and "skipped for this version" in body


@pytest.mark.parametrize(
    ("text", "ref"),
    [
        ("alice/env", HubRef("alice/env")),
        ("alice/env@0.1.0", HubRef("alice/env", "0.1.0")),
        ("a-b/c.d_e@main", HubRef("a-b/c.d_e", "main")),
    ],
)
def test_parse_ref(text: str, ref: HubRef) -> None:
    assert parse_ref(text) == ref and str(ref) == text and is_hub_ref(text)


@pytest.mark.parametrize("text", ["env", "alice/env@", "/env", "alice/env/x", "alice/"])
def test_parse_ref_rejects(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_ref(text)
