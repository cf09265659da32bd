"""The gsm8k env: loading GSM8K-format files, the shipped offline set and its generator."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import pytest

from envhub.envs.expressions import evaluate
from envhub.envs.gsm8k import SHIPPED_FILE, GSM8KEnv, final_answer, load_tasks
from envhub.errors import EnvhubError

ROOT = Path(__file__).resolve().parents[2]
ROWS = [
    {
        "question": "Ann has 3 bags of 4 apples. How many apples?",
        "answer": "3*4 = <<3*4=12>>12\n#### 12",
    },
    {
        "question": "A car costs $1,200 more than a bike that costs $34. What does the car cost?",
        "answer": "1200+34 = <<1200+34=1234>>1234\n#### 1,234",
    },
    {
        "question": "It is 2 degrees and gets 7 degrees colder. What is the temperature?",
        "answer": "2-7 = <<2-7=-5>>-5\n#### -5",
    },
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("solution", "number"),
    [
        ("so 12\n#### 12", "12"),
        ("#### 1,234", "1234"),
        ("#### -5", "-5"),
        ("#### 2.5 ", "2.5"),
        ("#### $30", "30"),
        ("#### 1\n#### 2", "2"),
    ],
)
def test_final_answer_reads_the_number_after_the_last_marker(solution: str, number: str) -> None:
    assert final_answer(solution) == number


@pytest.mark.parametrize("solution", ["the answer is 12", "#### twelve", "####"])
def test_final_answer_refuses_solutions_without_a_number(solution: str) -> None:
    with pytest.raises(ValueError, match="#### <number>"):
        final_answer(solution)


def test_a_local_jsonl_file_becomes_exactly_these_tasks(tmp_path: Path) -> None:
    env = GSM8KEnv(data_files=str(write_jsonl(tmp_path / "mine.jsonl", ROWS)))
    assert list(env.dataset) == [
        {"question": ROWS[0]["question"], "answer": "12", "info": {"solution": ROWS[0]["answer"]}},
        {
            "question": ROWS[1]["question"],
            "answer": "1234",
            "info": {"solution": ROWS[1]["answer"]},
        },
        {"question": ROWS[2]["question"], "answer": "-5", "info": {"solution": ROWS[2]["answer"]}},
    ]
    prompt, _ = env.reset(seed=0, options={"task_index": 1})
    assert [(m.role, m.content) for m in prompt] == [
        ("system", GSM8KEnv.system_prompt),
        ("user", ROWS[1]["question"]),
    ]
    _, reward, terminated, _, info = env.step("1200 + 34 = 1234, so the car costs \\boxed{1234}.")
    assert (reward, terminated, info["reward_components"]) == (
        pytest.approx(1.1),
        True,
        {"correct": 1.0, "format": 1.0},
    )


def test_splits_come_from_a_dict_of_files_and_slices(tmp_path: Path) -> None:
    train, test = (
        write_jsonl(tmp_path / "train.json", ROWS[:2]),
        write_jsonl(tmp_path / "test.json", ROWS[2:]),
    )
    files = {"train": str(train), "test": str(test)}
    assert [t["answer"] for t in GSM8KEnv(data_files=files, split="test").dataset] == ["-5"]
    assert [t["answer"] for t in GSM8KEnv(data_files=files, split="train[1:]").dataset] == ["1234"]


def test_loading_is_cached_until_the_file_changes(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "cached.jsonl", ROWS)
    first, second = GSM8KEnv(data_files=str(path)), GSM8KEnv(data_files=[str(path)])
    assert first.dataset is second.dataset
    write_jsonl(path, ROWS[:1])
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    assert [t["answer"] for t in GSM8KEnv(data_files=str(path)).dataset] == ["12"]


def test_bad_rows_and_arguments_are_reported(tmp_path: Path) -> None:
    bad = write_jsonl(
        tmp_path / "bad.jsonl", [*ROWS, {"question": "q", "answer": "no marker here"}]
    )
    with pytest.raises(EnvhubError, match="row 3"):
        load_tasks(data_files=str(bad))
    renamed = write_jsonl(tmp_path / "renamed.jsonl", [{"problem": "q", "answer": "#### 1"}])
    with pytest.raises(EnvhubError, match="missing \\['question'\\]"):
        load_tasks(data_files=str(renamed))
    with pytest.raises(EnvhubError, match="either source"):
        load_tasks(source="openai/gsm8k", data_files=str(bad))
    with pytest.raises(EnvhubError, match="Unknown split"):
        load_tasks(split="test")


def test_the_shipped_set_loads_by_default() -> None:
    env = GSM8KEnv()
    assert len(env.dataset) == 300
    # By hand: 2*9 + 4*4 = 34 dollars spent, 50 - 34 = 16 dollars back.
    assert (
        env.dataset[0]["question"]
        == "Ben buys 2 bagels for $9 each and 4 candles for $4 each. He pays with a $50 bill. "
        "How much change does he get back?"
    )
    assert env.dataset[0]["answer"] == "16"
    assert [len(GSM8KEnv(split=s).dataset) for s in ("train[:80%]", "train[80%:]")] == [240, 60]


def test_the_shipped_file_is_small_and_every_solution_checks_out() -> None:
    assert SHIPPED_FILE.stat().st_size < 200_000
    rows = [json.loads(line) for line in SHIPPED_FILE.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 300 and len({r["question"] for r in rows}) == 300
    for row in rows:
        assert set(row) == {"question", "answer"}
        *steps, last = row["answer"].split("\n")
        assert re.fullmatch(r"#### -?\d+", last), last
        values = []
        for expression, value in re.findall(r"<<([^=]+)=([^>]+)>>", row["answer"]):
            assert evaluate(expression) == int(value), (expression, value)
            values.append(value)
        assert steps and values and final_answer(row["answer"]) == values[-1]


def test_the_shipped_file_is_what_the_generator_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location(
        "make_gsm8k_style", ROOT / "scripts" / "make_gsm8k_style.py"
    )
    generator = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, generator)  # dataclasses look their module up there
    spec.loader.exec_module(generator)
    assert generator.to_jsonl(generator.generate(300, seed=0)) == SHIPPED_FILE.read_text(
        encoding="utf-8"
    )
    assert len(generator.TEMPLATES) == 16
