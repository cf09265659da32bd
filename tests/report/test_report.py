"""The report generator without a browser: what goes into the page, escaping, eval folders, the
server and the command."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from envhub.cli.app import app
from envhub.errors import ConfigError
from envhub.report import make_server, write_report
from envhub.report.data import build, chart_specs
from envhub.report.page import embed_json
from envhub.rollout.io import TrajectoryWriter
from envhub.types import EnvRef, ErrorRecord, Message, ToolCall, Trajectory

pytest.importorskip("plotly")

HOSTILE = "</script><script>window.PWNED = 1</script><!--"


def _trajectory(task: int, reward: float, content: str = "ok") -> Trajectory:
    return Trajectory(
        env=EnvRef(name="letters", version="0.0.1"),
        task_index=task,
        group_id=f"g{task}",
        messages=[
            Message(role="user", content="Write a word."),
            Message(
                role="assistant",
                content=content,
                tool_calls=(ToolCall.make("c1", "add", {"a": 1}),),
            ),
            Message(role="tool", content="2", tool_call_id="c1", name="add"),
        ],
        prompt_length=1,
        token_ids=[5, 6, 7, 8],
        loss_mask=[0, 0, 1, 1],
        sampler_logprobs=[0.0, 0.0, -0.12345, -2.5],
        reward=reward,
        reward_components={"letters": reward},
        errors=[ErrorRecord(stage="tool:add", type="ValueError", message="bad")] if task else [],
        token_drift=[{"turn": 1, "position": 3}] if task else [],
    )


def _run(folder: Path) -> Path:
    rows = [
        {"step": 0, "eval/letters/reward": 0.1, "eval/reward": 0.1},
        {"step": 1, "reward/mean": 0.25, "reward/std": 0.5, "train/kl": 0.01, "time/step": 2.0},
        {"step": 2, "reward/mean": 0.75, "reward/std": 0.1, "train/kl": 0.02, "time/step": 1.5},
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "config.json").write_text(json.dumps({"steps": 2, "model": {"name": "tiny"}}))
    for sub, step in (("", 1), ("", 2), ("eval", 0)):
        with TrajectoryWriter(folder / "trajectories" / sub / f"step-{step:06d}.jsonl") as w:
            w.write(_trajectory(0, 0.0))
            w.write(_trajectory(1, 1.0, HOSTILE))
    return folder


def test_chart_specs_group_metrics_and_keep_each_series_own_steps(tmp_path: Path) -> None:
    charts = chart_specs(
        [json.loads(line) for line in _run(tmp_path).joinpath("metrics.jsonl").open()]
    )
    assert [(c["title"], [(s["name"], s["x"], s["y"]) for s in c["series"]]) for c in charts] == [
        ("Reward per component", [("reward/mean", [1, 2], [0.25, 0.75])]),
        (  # one env's reward is the mean: drawn once, under both names
            "Held-out eval: reward and pass@k",
            [("eval/letters/reward = eval/reward", [0], [0.1])],
        ),
        ("KL and entropy", [("train/kl", [1, 2], [0.01, 0.02])]),
        ("Time by phase", [("time/step", [1, 2], [2.0, 1.5])]),
    ]


def test_build_lists_training_steps_then_evals_with_their_episodes(tmp_path: Path) -> None:
    document, blocks = build(_run(tmp_path), decode=lambda i: f"<t{i}>")
    assert document["kind"] == "train"
    assert document["steps"] == [
        {"key": "step-1", "label": "step 1", "episodes": 2},
        {"key": "step-2", "label": "step 2", "episodes": 2},
        {"key": "eval-0", "label": "eval at step 0", "episodes": 2},
    ]
    episode = blocks["step-2"]["episodes"][1]
    assert episode["loss_mask"] == [0, 0, 1, 1]
    assert episode["logprobs"] == [0.0, 0.0, -0.123, -2.5]
    assert episode["drift"] == [{"turn": 1, "position": 3}]
    assert episode["errors"][0]["stage"] == "tool:add"
    assert episode["messages"][1]["tool_calls"][0]["function"]["name"] == "add"
    assert blocks["step-2"]["vocab"] == {"5": "<t5>", "6": "<t6>", "7": "<t7>", "8": "<t8>"}


def test_page_embeds_one_parseable_block_per_step_and_no_raw_closing_tags(tmp_path: Path) -> None:
    page = write_report(_run(tmp_path)).read_text()
    assert "PWNED" in page and HOSTILE not in page
    blocks = dict(
        re.findall(r'<script type="application/json" id="step-data-([\w-]+)">(.*?)</script>', page)
    )
    assert sorted(blocks) == ["eval-0", "step-1", "step-2"]
    assert json.loads(blocks["step-1"])["episodes"][1]["messages"][1]["content"] == HOSTILE
    assert json.loads(blocks["step-1"])["vocab"] == {}  # no decoder: the page shows ids


def test_embed_json_round_trips_and_escapes_every_angle_bracket() -> None:
    value = {"a": HOSTILE, "b": [1, 2.5, None]}
    text = embed_json(value)
    assert "<" not in text and json.loads(text) == value


def test_eval_folder_gives_one_eval_step_its_summary_and_a_reward_chart(tmp_path: Path) -> None:
    with TrajectoryWriter(tmp_path / "trajectories.jsonl") as w:
        for task, reward in enumerate((0.0, 1.0, 0.5)):
            w.write(_trajectory(task, reward))
    (tmp_path / "summary.json").write_text(json.dumps({"episodes": 3, "reward_mean": 0.5}))
    document, blocks = build(tmp_path)
    assert document["kind"] == "eval"
    assert document["summary"] == {"episodes": 3, "reward_mean": 0.5}
    assert document["steps"] == [{"key": "eval", "label": "eval", "episodes": 3}]
    assert document["charts"][0]["series"][0]["y"] == [0.0, 1.0, 0.5]
    assert [e["reward"] for e in blocks["eval"]["episodes"]] == [0.0, 1.0, 0.5]


def test_a_folder_without_results_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no metrics.jsonl and no trajectories"):
        build(tmp_path)


def test_server_answers_the_page_at_root_and_404_elsewhere(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text("<html>hi</html>")
    server = make_server(page, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        root = httpx.get(url + "/")
        assert (root.status_code, root.text) == (200, "<html>hi</html>")
        assert root.headers["content-type"] == "text/html; charset=utf-8"
        assert httpx.get(url + "/etc/passwd").status_code == 404
    finally:
        server.shutdown()
        server.server_close()


def test_command_writes_report_html_in_the_run_folder(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["report", str(_run(tmp_path)), "--token-ids"])
    assert result.exit_code == 0, result.output
    assert f"wrote {tmp_path / 'report.html'}" in result.output.replace("\n", "")
    assert 'id="step-data-eval-0"' in (tmp_path / "report.html").read_text()


def test_a_run_with_a_critic_gets_a_chart_of_its_explained_variance_and_loss() -> None:
    rows = [
        {"step": 1, "critic/explained_variance": -0.5, "critic/value_loss": 0.2},
        {"step": 2, "critic/value_loss": 0.1},  # returns that did not vary: no EV that step
    ]
    (chart,) = chart_specs(rows)
    assert chart["title"] == "Critic: explained variance and value loss"
    assert [(s["name"], s["x"], s["y"]) for s in chart["series"]] == [
        ("critic/explained_variance", [1], [-0.5]),
        ("critic/value_loss", [1, 2], [0.2, 0.1]),
    ]


def test_a_run_with_a_curriculum_gets_charts_of_its_skipped_share_and_levels() -> None:
    rows = [
        {"step": 1, "curriculum/skipped_share": 0.0, "curriculum/level/arithmetic": 0.0},
        {
            "step": 2,
            "curriculum/skipped_share": 0.25,
            "curriculum/drawn_pass_rate": 0.5,
            "curriculum/level/arithmetic": 1.0,
            "curriculum/skipped": 2.0,  # a count: in the table, not charted
        },
    ]
    shares, levels = chart_specs(rows)
    assert shares["title"] == "Curriculum: skipped share and pass rate of drawn tasks"
    assert [(s["name"], s["x"], s["y"]) for s in shares["series"]] == [
        ("curriculum/skipped_share", [1, 2], [0.0, 0.25]),
        ("curriculum/drawn_pass_rate", [2], [0.5]),
    ]
    assert levels["title"] == "Curriculum: each env's difficulty level"
    assert [(s["name"], s["y"]) for s in levels["series"]] == [
        ("curriculum/level/arithmetic", [0.0, 1.0])
    ]
