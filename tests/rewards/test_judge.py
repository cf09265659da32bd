"""The LLM judge: strict verdict parsing, and our real HTTP client against a protocol server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from envhub.rewards.judge import DEFAULT_TEMPLATE, SCORE_TEMPLATE, judge_reward, parse_verdict
from envhub.rewards.rubric import Rubric
from envhub.state import State
from envhub.types import ErrorRecord, assistant, system, user


@pytest.mark.parametrize(
    ("text", "scale", "expected"),
    [
        ("yes", None, 1.0),
        ("Yes.", None, 1.0),
        ("**YES**", None, 1.0),
        ("no", None, 0.0),
        (" No, it is wrong", None, 0.0),
        ("7", 10, 0.7),
        ("**8**", 10, 0.8),
        ("10", 10, 1.0),
        ("0", 10, 0.0),
        ("3.5/10", 10, 0.35),
        ("4", 4, 1.0),
    ],
)
def test_parse_verdict(text: str, scale: int | None, expected: float) -> None:
    assert parse_verdict(text, scale) == expected


@pytest.mark.parametrize(
    ("text", "scale", "message"),
    [
        ("maybe", None, "judge answered 'maybe', expected yes or no"),
        ("yesterday", None, "judge answered 'yesterday', expected yes or no"),
        ("noted", None, "judge answered 'noted', expected yes or no"),
        ("", None, "judge answered '', expected yes or no"),
        ("The answer is yes", None, "judge answered 'The answer is yes', expected yes or no"),
        ("11", 10, "judge answered '11', expected a number from 0 to 10"),
        ("-3", 10, "judge answered '-3', expected a number from 0 to 10"),
        (".5", 10, "judge answered '.5', expected a number from 0 to 10"),
        ("Score: 7", 10, "judge answered 'Score: 7', expected a number from 0 to 10"),
        ("yes", 10, "judge answered 'yes', expected a number from 0 to 10"),
    ],
)
def test_parse_verdict_is_strict(text: str, scale: int | None, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_verdict(text, scale)
    assert str(info.value) == message


def _completion(content: str) -> dict[str, Any]:
    return {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ]
    }


def _judge_server(http_server: Any, verdict: str) -> Any:
    def handle(method: str, path: str, body: Any) -> tuple[int, Any]:
        if (method, path) == ("GET", "/v1/models"):
            return 200, {"object": "list", "data": [{"id": "grader-1", "object": "model"}]}
        if (method, path) == ("POST", "/v1/chat/completions"):
            return 200, _completion(verdict)
        return 404, {"error": {"message": f"no route {path}"}}

    return http_server(handle)


def _state(response: str) -> State:
    prompt = [system("Be brief."), user("What is the capital of France?")]
    return State(
        task={"question": "q", "answer": "Paris"},
        task_index=0,
        prompt=prompt,
        messages=[*prompt, assistant(response)],
    )


def test_judge_reward_end_to_end(http_server: Any) -> None:
    server = _judge_server(http_server, "Yes")
    judge = judge_reward(server.url + "/v1/")
    score = asyncio.run(Rubric([judge]).score(_state("It is Paris.")))
    assert (score.total, score.components, score.errors) == (1.0, {"judge": 1.0}, [])

    assert server.paths() == ["GET /v1/models", "POST /v1/chat/completions"]
    body = server.requests[1][2]
    expected_prompt = DEFAULT_TEMPLATE.format(
        question="What is the capital of France?",
        answer="Paris",
        response="It is Paris.",
        scale=None,
    )
    assert body["messages"] == [
        {"role": "system", "content": "You are a strict grader."},
        {"role": "user", "content": expected_prompt},
    ]
    assert "Question:\nWhat is the capital of France?" in expected_prompt
    assert "Reference answer:\nParis" in expected_prompt
    assert "Response to grade:\nIt is Paris." in expected_prompt
    assert body["model"] == "grader-1"
    assert (body["temperature"], body["max_tokens"]) == (0.0, 8)
    assert "logprobs" not in body
    assert "tools" not in body


def test_judge_with_a_scale_and_a_named_model(http_server: Any) -> None:
    server = _judge_server(http_server, "7")
    judge = judge_reward(server.url, "grader-2", scale=10, weight=2.0, name="quality")
    score = asyncio.run(Rubric([judge]).score(_state("Paris")))
    assert (score.total, score.components) == (1.4, {"quality": 0.7})
    assert server.paths() == ["POST /v1/chat/completions"]
    body = server.requests[0][2]
    assert body["model"] == "grader-2"
    assert body["messages"][1]["content"] == SCORE_TEMPLATE.format(
        question="What is the capital of France?", answer="Paris", response="Paris", scale=10
    )


def test_an_unparseable_verdict_is_recorded_and_scores_zero(http_server: Any) -> None:
    server = _judge_server(http_server, "It depends.")
    score = asyncio.run(Rubric([judge_reward(server.url, "m")]).score(_state("Paris")))
    assert (score.total, score.components) == (0.0, {"judge": 0.0})
    assert score.errors == [
        ErrorRecord(
            stage="reward:judge",
            type="ValueError",
            message="judge answered 'It depends.', expected yes or no",
        )
    ]


def test_an_unreachable_judge_is_recorded_and_scores_zero(http_server: Any) -> None:
    server = http_server(lambda method, path, body: (500, {"error": {"message": "overloaded"}}))
    from envhub.inference.openai_http import OpenAIEngine

    engine = OpenAIEngine(server.url, "m", mode="chat", max_retries=1, backoff=0.0)
    score = asyncio.run(Rubric([judge_reward(server.url, engine=engine)]).score(_state("Paris")))
    assert score.components == {"judge": 0.0}
    assert [(e.stage, e.type) for e in score.errors] == [("reward:judge", "EngineUnavailableError")]
    assert "failed after 2 attempts (HTTP 500: overloaded)" in score.errors[0].message
    assert len(server.requests) == 2


def test_one_judge_serves_several_event_loops(http_server: Any) -> None:
    # env.step runs rewards on a private loop and the rollout runner on its own: the same
    # judge (and its pooled connections) must work from both, one after the other.
    server = _judge_server(http_server, "no")
    rubric = Rubric([judge_reward(server.url, "m")])
    for _ in range(3):
        score = asyncio.run(rubric.score(_state("Lyon")))
        assert (score.components, score.errors) == ({"judge": 0.0}, [])
    assert len(server.requests) == 3
