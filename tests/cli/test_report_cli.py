"""``envhub report`` resolves the run's model name before the report loads its tokenizer (the
report itself never imports the trainer)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")

from envhub.cli.report import _model_folder  # noqa: E402
from envhub.report import load_decoder  # noqa: E402


def test_a_model_folder_resolves_and_its_tokenizer_decodes(tiny_model_dir: Path) -> None:
    folder = _model_folder(str(tiny_model_dir))
    assert folder == str(tiny_model_dir.resolve())
    decode = load_decoder(folder)
    assert decode is not None and decode(28) == ","  # SmolLM2's vocabulary


def test_a_name_that_does_not_resolve_falls_back_to_token_ids(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-model")
    assert _model_folder(missing) == missing
    assert load_decoder(missing) is None
