"""Held-out evaluation during training: when it runs, what it logs, and that it never changes
what the run trains on (the same run with and without ``eval``, step by step)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from envhub.errors import ConfigError
from envhub.evaluation import summarize
from envhub.rollout.io import read_trajectories
from envhub.testing import LetterEnv
from envhub.trainer.config import validate_config
from envhub.trainer.held_out import HeldOutEval
from envhub.trainer.loop import train

pytestmark = pytest.mark.usefixtures("letter_env")

EVAL = {"envs": [{"name": LetterEnv.name, "label": "letters", "num_tasks": 4}], "every": 2}


def _config(model_dir: Path, out: Path, name: str, **extra: Any) -> dict[str, Any]:
    return {
        "steps": 3,
        "seed": 5,
        "model": {"name": str(model_dir)},
        "envs": [{"name": LetterEnv.name}],
        "rollout": {"tasks_per_step": 2, "samples_per_task": 2, "max_tokens": 6},
        "algorithm": {"mismatch": "none"},
        "optimizer": {"lr": 1e-3},
        "backend": {"device": "cpu"},
        "logging": {"output_dir": str(out), "run_name": name, "plot": False},
        "checkpoint": {"every": 10, "export_hf": False},
        **extra,
    }


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    import envhub
    from envhub import registry

    envhub.register(LetterEnv.name, LetterEnv, override=True)  # module scope: the fixture's own
    out = tmp_path_factory.mktemp("held-out")
    try:
        plain = validate_config(_config(tiny_model_dir, out, "plain"))
        evaluated = validate_config(_config(tiny_model_dir, out, "eval", eval=EVAL))
        train(plain)
        train(evaluated)
    finally:
        registry._registered.pop(LetterEnv.name, None)
    return plain.run_dir, evaluated.run_dir


def test_eval_does_not_change_what_the_run_trains_on(runs: tuple[Path, Path]) -> None:
    plain, evaluated = runs
    for step in (1, 2, 3):
        name = f"trajectories/step-{step:06d}.jsonl"
        a, b = read_trajectories(plain / name), read_trajectories(evaluated / name)
        assert [(t.task_index, t.token_ids, t.reward) for t in a] == [
            (t.task_index, t.token_ids, t.reward) for t in b
        ], f"step {step}"
    trained = [{k: v for k, v in r.items() if k.startswith("train/")} for r in _rows(plain)]
    assert trained == [
        {k: v for k, v in r.items() if k.startswith("train/")} for r in _rows(evaluated)[1:]
    ]


def test_eval_runs_before_the_first_step_every_n_and_after_the_last(
    runs: tuple[Path, Path],
) -> None:
    _, evaluated = runs
    rows = _rows(evaluated)
    evals = [r["step"] for r in rows if "eval/letters/reward" in r]
    assert evals == [0, 2, 3]
    assert set(rows[0]) == {"step", "eval/letters/reward", "eval/letters/pass@1", "eval/reward",
                            "time/eval"}  # fmt: skip
    assert "eval/letters/reward" not in rows[1] and "reward/mean" in rows[1]


def test_eval_metrics_summarise_the_saved_episodes(runs: tuple[Path, Path]) -> None:
    _, evaluated = runs
    rows = {r["step"]: r for r in _rows(evaluated)}
    for step in (0, 2, 3):
        episodes = read_trajectories(evaluated / f"trajectories/eval/step-{step:06d}.jsonl")
        assert sorted(t.task_index for t in episodes) == [0, 1, 3, 5]  # spread over 6 tasks
        assert rows[step]["eval/letters/reward"] == pytest.approx(
            summarize(episodes).reward_mean, abs=0
        )
        assert rows[step]["eval/reward"] == rows[step]["eval/letters/reward"]
    # greedy: the baseline's episodes of the same task are the same every time it is asked
    again = read_trajectories(evaluated / "trajectories/eval/step-000000.jsonl")
    assert all(t.turns[0].completion_tokens is not None for t in again)


def test_due_steps(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = validate_config(_config(tiny_model_dir, tmp_path, "x", steps=7, eval=EVAL))
    held_out = HeldOutEval(config)
    assert [s for s in range(8) if held_out.due(s)] == [0, 2, 4, 6, 7]
    quiet = EVAL | {"every": None, "baseline": False}
    held_out = HeldOutEval(
        validate_config(_config(tiny_model_dir, tmp_path, "y", steps=7, eval=quiet))
    )
    assert [s for s in range(8) if held_out.due(s)] == [7]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"envs": [{"name": "arithmetic"}, {"name": "arithmetic"}]},
         "eval.envs: give each a distinct label (arithmetic twice)"),
        ({"samples_per_task": 4},
         "eval.samples_per_task > 1 with greedy decoding gives identical samples"),
    ],
)  # fmt: skip
def test_bad_eval_configs_say_what_to_change(
    tiny_model_dir: Path, tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate_config(_config(tiny_model_dir, tmp_path, "z", eval=EVAL | change))


def test_an_unknown_eval_env_fails_before_any_engine_starts(tiny_model_dir, tmp_path) -> None:
    bad = EVAL | {"envs": [{"name": "arithmetc"}]}
    with pytest.raises(Exception, match="Did you mean 'arithmetic'"):
        train(validate_config(_config(tiny_model_dir, tmp_path, "w", eval=bad)))
    assert not (tmp_path / "w" / "metrics.jsonl").exists()


def test_labels_that_repeat_once_references_name_their_envs_are_refused(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    # Two env files whose classes share a name: their references differ, their labels would not.
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "env.py").write_text(
            "from envhub.testing import LetterEnv\n\n\n"
            "class Letters(LetterEnv):\n    name = 'my-letters'\n"
        )
    refs = [f"{tmp_path / folder / 'env.py'}:Letters" for folder in ("a", "b")]
    evaluation = {"envs": [{"name": ref, "num_tasks": 2} for ref in refs]}
    config = validate_config(_config(tiny_model_dir, tmp_path, "run", eval=evaluation))
    with pytest.raises(ConfigError) as clash:
        HeldOutEval(config)
    assert str(clash.value) == (
        f"eval.envs: two envs would report under one label ('my-letters' from {refs[0]}, "
        f"{refs[1]}); give each a distinct `label:`"
    )
    labelled = [{"name": ref, "num_tasks": 2, "label": f"l{i}"} for i, ref in enumerate(refs)]
    config = validate_config(_config(tiny_model_dir, tmp_path, "run", eval={"envs": labelled}))
    assert [t.label for t in HeldOutEval(config).targets] == ["l0", "l1"]
