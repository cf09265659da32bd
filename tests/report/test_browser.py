"""The report of a real 3-step run, opened from a file:// URL in headless Chromium (Debian's, driven
through its ChromeDriver): no console errors, the curves carry the run's numbers, and a chosen
episode's tokens are coloured by its loss mask."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from envhub.report import load_decoder, write_report
from envhub.rewards.rubric import Rubric, reward
from envhub.rollout.io import read_trajectories
from envhub.testing import LetterEnv, letter_e_share

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
    reason="needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver;"
    " .ci/run installs them)",
)


@reward
def letters_but_task_1_tied(response: str, task: dict[str, Any]) -> float:
    """:func:`letter_e_share`, except that every sample of task 1 scores 0.5."""
    return 0.5 if task["question"] == "Write a word (1)." else letter_e_share(response)


class TiedTaskLetterEnv(LetterEnv):
    """:class:`LetterEnv` whose task 1 is tied: the run's first step draws it first (seed 5),
    so its first group has no signal and is dropped, and the first episode it trains on is #2."""

    def default_rubric(self) -> Rubric:
        """One reward: :func:`letters_but_task_1_tied`."""
        return Rubric([letters_but_task_1_tied])


@pytest.fixture(scope="module")
def run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import envhub
    from envhub import registry
    from envhub.trainer.config import validate_config
    from envhub.trainer.loop import train

    envhub.register(LetterEnv.name, TiedTaskLetterEnv, override=True)
    out = tmp_path_factory.mktemp("report-run")
    config = {
        "steps": 3,
        "seed": 5,
        "model": {"name": str(tiny_model_dir)},
        "envs": [{"name": LetterEnv.name}],
        "rollout": {"tasks_per_step": 2, "samples_per_task": 2, "max_tokens": 6},
        "algorithm": {"mismatch": "none"},
        "backend": {"device": "cpu"},
        "logging": {"output_dir": str(out), "run_name": "r", "plot": False},
        "checkpoint": {"every": 10, "export_hf": False},
        "eval": {
            "envs": [{"name": LetterEnv.name, "label": "letters", "num_tasks": 2}],
            "every": 2,
        },
    }
    try:
        validated = validate_config(config)
        train(validated)
    finally:
        registry._registered.pop(LetterEnv.name, None)
    return validated.run_dir


@pytest.fixture(scope="module")
def page(run: Path, tiny_model_dir: Path, browser: Any) -> Any:
    decode = load_decoder(str(tiny_model_dir))
    assert decode is not None  # the tiny model carries SmolLM2's tokenizer
    browser.get(write_report(run, decode=decode).as_uri())
    return browser


def test_page_loads_without_console_errors(page: Any) -> None:
    severe = [e for e in page.get_log("browser") if e["level"] == "SEVERE"]
    assert severe == []
    assert page.execute_script("return typeof Plotly") == "object"


def metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def traces(page: Any, title: str) -> list[tuple[list[str], list[float], list[float]]]:
    """``(names, x, y)`` of each line drawn in the chart titled ``title`` (a merged series'
    legend label names every metric it stands for, joined with " = ")."""
    drawn = page.execute_script(
        "return document.querySelector(`[data-title='${arguments[0]}']`).data"
        ".map(t => [t.name, Array.from(t.x), Array.from(t.y)]);",
        title,
    )
    return [(name.split(" = "), x, y) for name, x, y in drawn]


def drawn_as(page: Any, title: str, key: str) -> tuple[list[float], list[float]]:
    """The points of the line that carries metric ``key`` in chart ``title``."""
    return next((x, y) for names, x, y in traces(page, title) if key in names)


def test_curves_carry_the_runs_numbers(page: Any, run: Path) -> None:
    rows = metrics(run)
    expected = [(r["step"], r["reward/mean"]) for r in rows if "reward/mean" in r]
    assert drawn_as(page, "Reward per component", "reward/mean") == (
        [x for x, _ in expected],
        [y for _, y in expected],
    )
    evals = drawn_as(page, "Held-out eval: reward and pass@k", "eval/reward")[1]
    assert evals == [r["eval/reward"] for r in rows if "eval/reward" in r]


def test_identical_series_are_drawn_once_under_a_combined_name(page: Any, run: Path) -> None:
    rows = [r for r in metrics(run) if "train/loss" in r]
    # What a user saw: four legend entries and two lines, `loss` drawn exactly on `policy_loss`.
    assert [r["train/loss"] for r in rows] == [r["train/policy_loss"] for r in rows]
    assert [names for names, _, _ in traces(page, "Loss")] == [["train/loss", "train/policy_loss"]]
    titles = page.execute_script(
        "return Array.from(document.querySelectorAll('.chart')).map(d => d.dataset.title);"
    )
    for title in titles:
        lines = [(x, y) for _, x, y in traces(page, title)]
        assert len(lines) == len({json.dumps(line) for line in lines}), title
    keys = {k for r in metrics(run) for k in r if k.startswith("train/clip_frac")}
    drawn = {name for title in titles for names, _, _ in traces(page, title) for name in names}
    assert keys <= drawn  # every metric still named in some legend


def test_an_all_zero_chart_starts_at_zero_and_says_so(page: Any, run: Path) -> None:
    assert {r[k] for r in metrics(run) for k in r if k.startswith("train/clip_frac")} == {0.0}
    layout = page.execute_script(
        "const gd = document.querySelector(\"[data-title='Clip fraction']\");"
        "return [gd.layout.yaxis.range, gd.layout.title.text];"
    )
    assert layout == [[-0.05, 1], "Clip fraction (all zero)"]
    reward = page.execute_script(
        "return document.querySelector(\"[data-title='Reward per component']\").layout.yaxis.range;"
    )
    values = [r["reward/mean"] for r in metrics(run) if "reward/mean" in r]
    assert -0.5 < reward[0] <= min(values) and max(values) <= reward[1] < 1  # plotly's own


def test_the_first_episode_shown_is_one_the_run_trained_on(page: Any, run: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from envhub.report.data import read_trainer_logprobs

    step_file = run / "trajectories" / "step-000001.jsonl"
    first_step = read_trajectories(step_file)
    assert [t.task_index for t in first_step] == [1, 1, 0, 0]  # the tied task's group first
    assert sorted(read_trainer_logprobs(step_file)) == [2, 3]  # dropped: nothing to learn
    page.get(page.current_url)  # as opened, before other tests chose episodes
    assert (
        Select(page.find_element(By.ID, "step")).first_selected_option.get_attribute("value")
        == "step-1"
    )
    assert Select(page.find_element(By.ID, "episode")).first_selected_option.text.startswith(
        "#2 task 0"
    )
    group = first_step[2].group_id
    assert page.find_element(By.ID, "first-note").text == (
        f"Shown first: step 1, episode #2 (task 0, group {group}), the first episode the run "
        "trained on."
    )
    facts = page.find_element(By.CSS_SELECTOR, ".facts").text
    assert f"group {group}" in facts and "trained on" in facts and "not trained" not in facts
    Select(page.find_element(By.ID, "episode")).select_by_value("0")
    assert "not trained on" in page.find_element(By.CSS_SELECTOR, ".facts").text


def test_chosen_episode_tokens_follow_its_loss_mask(page: Any, run: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(page.find_element(By.ID, "step")).select_by_value("step-2")
    Select(page.find_element(By.ID, "episode")).select_by_value("3")
    trajectory = read_trajectories(run / "trajectories" / "step-000002.jsonl")[3]
    spans = page.execute_script(
        "return Array.from(document.querySelectorAll('#tokens .tok'))"
        ".map(s => [s.classList.contains('policy') ? 1 : 0, s.title.split(' ')[2]]);"
    )
    assert [mask for mask, _ in spans] == trajectory.loss_mask
    assert [int(token_id) for _, token_id in spans] == trajectory.token_ids
    assert sum(trajectory.loss_mask or []) > 0  # the episode has policy tokens to colour
    text = page.find_element(By.ID, "tokens").text
    assert "<|im_start|>" in text  # decoded with the run's tokenizer, not shown as ids


def test_eval_steps_are_browsable(page: Any, run: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(page.find_element(By.ID, "step")).select_by_value("eval-3")
    episodes = Select(page.find_element(By.ID, "episode")).options
    assert len(episodes) == len(read_trajectories(run / "trajectories/eval/step-000003.jsonl"))
    assert [e["level"] for e in page.get_log("browser") if e["level"] == "SEVERE"] == []


def test_policy_tokens_carry_the_sampler_trainer_gap(page: Any, run: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from envhub.report.data import read_trainer_logprobs

    step_file = run / "trajectories" / "step-000002.jsonl"
    trainer = read_trainer_logprobs(step_file)
    index = min(trainer)  # an episode the step trained on
    trajectory = read_trajectories(step_file)[index]
    mask, sampler = trajectory.loss_mask or [], trajectory.sampler_logprobs or []
    # The trainer scored exactly the policy tokens (token 0 is never a target).
    assert [lp is not None for lp in trainer[index]] == [m == 1 for m in mask]
    # The HF engine samples with the policy module itself, in fp32: the two sides agree.
    gap = max(abs(s - t) for s, t, m in zip(sampler, trainer[index], mask, strict=True) if m)
    assert gap < 1e-3

    Select(page.find_element(By.ID, "step")).select_by_value("step-2")
    Select(page.find_element(By.ID, "episode")).select_by_value(str(index))
    assert Select(page.find_element(By.ID, "shade")).first_selected_option.text.startswith(
        "sampler/trainer"
    )
    shown = page.execute_script(
        "return Array.from(document.querySelectorAll('#tokens .tok'))"
        ".map(s => [s.dataset.gap ?? null, s.style.background !== '']);"
    )
    expected = [
        abs(round(s, 3) - round(t, 3)) if t is not None else None
        for s, t in zip(sampler, trainer[index], strict=True)
    ]
    assert [g is not None for g, _ in shown] == [e is not None for e in expected]
    for (gap, _), want in zip(shown, expected, strict=True):
        if want is not None:
            assert abs(float(gap) - want) < 1.5e-3
    assert [coloured for _, coloured in shown] == [m == 1 for m in mask]


# -- an episode with several roles -------------------------------------------------------------


@pytest.fixture(scope="module")
def roles_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real training step on setter-solver, the setter a fixed random policy: each episode
    is a problem the env's setter wrote and two solver attempts, one trajectory each."""
    import envhub
    from envhub import registry
    from envhub.envs.setter_solver import SetterSolverEnv
    from envhub.trainer.config import validate_config
    from envhub.trainer.loop import train

    envhub.register("setter-solver", SetterSolverEnv, override=True)
    out = tmp_path_factory.mktemp("report-roles")
    config = {
        "steps": 1,
        "seed": 5,
        "model": {"name": str(tiny_model_dir)},
        "envs": [
            {"name": "setter-solver", "args": {"attempts": 2, "policies": {"setter": "random"}}}
        ],
        "rollout": {"tasks_per_step": 1, "samples_per_task": 2, "max_tokens": 6},
        "algorithm": {"mismatch": "none", "dynamic_sampling": False},
        "backend": {"device": "cpu"},
        "logging": {"output_dir": str(out), "run_name": "roles", "plot": False},
        "checkpoint": {"every": 10, "export_hf": False},
    }
    try:
        validated = validate_config(config)
        train(validated)
    finally:
        registry._registered.pop("setter-solver", None)
    return validated.run_dir


def test_a_multi_role_episode_shows_whose_turn_each_message_was(
    roles_run: Path, tiny_model_dir: Path, browser: Any
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    trajectories = read_trajectories(roles_run / "trajectories" / "step-000001.jsonl")
    assert [t.role for t in trajectories] == ["solver#0", "solver#1"] * 2
    metrics = json.loads((roles_run / "metrics.jsonl").read_text().splitlines()[-1])
    assert metrics["rollout/episodes/solver"] == 4.0
    assert metrics["reward/solver"] == sum(t.reward for t in trajectories) / 4
    browser.get(write_report(roles_run, decode=load_decoder(str(tiny_model_dir))).as_uri())
    options = [o.text for o in Select(browser.find_element(By.ID, "episode")).options]
    assert [o.split(" · ")[1] for o in options] == ["solver#0", "solver#1"] * 2
    Select(browser.find_element(By.ID, "episode")).select_by_value("1")
    labels = browser.execute_script(
        "return Array.from(document.querySelectorAll('#episode-view .role'))"
        ".map(e => e.textContent);"
    )
    assert labels == [
        "system · setter's turn",
        "user · setter's turn",
        "assistant · solver#1's turn",
    ]
    facts = browser.find_element(By.CSS_SELECTOR, "#episode-view .facts").text
    assert facts.startswith(f"role solver#1 ({trajectories[1].info['role_result']})")
    spans = browser.execute_script(
        "return Array.from(document.querySelectorAll('#tokens .tok'))"
        ".map(s => s.classList.contains('policy') ? 1 : 0);"
    )
    assert spans == trajectories[1].loss_mask and sum(spans) > 0
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
