"""The env contract.

Covers reset/step, seeding, terminated vs truncated, rewards, sync/async bridging and close.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import warnings
from typing import Any

import pytest

from envhub.env import Env, SingleTurnEnv, TaskEnv, as_turn
from envhub.errors import EnvhubError, EnvLoadError
from envhub.multiturn import MultiTurnEnv
from envhub.rewards.match import exact_match
from envhub.rewards.rubric import Rubric, group_reward, reward
from envhub.spaces import AssistantTurnSpace, MessagesSpace
from envhub.state import State
from envhub.types import AssistantTurn, ErrorRecord, Message, assistant, system, user

TASKS = [{"question": f"Say {i}", "answer": str(i)} for i in range(50)]


class Echo(MultiTurnEnv):
    """Replies "again" until the model says "stop"; scores the number of turns / 10."""

    name = "echo"
    system_prompt = "Play along."

    async def env_response(self, state: State, turn: AssistantTurn) -> list[Message]:
        if turn.message.content == "stop":
            state.done = True
            return []
        return [user("again")]

    def default_rubric(self) -> Rubric:
        @reward
        def turns(state: State) -> float:
            return state.turn / 10

        return Rubric([turns])


def quiz(**kwargs: Any) -> SingleTurnEnv:
    kwargs.setdefault("rubric", Rubric([exact_match(extract=False)]))
    return SingleTurnEnv(TASKS, **kwargs)


# -- reset and step ---------------------------------------------------------------------------


def test_reset_returns_the_prompt_and_the_task_index() -> None:
    env = quiz(system_prompt="Answer briefly.")
    observation, info = env.reset(seed=0, options={"task_index": 3})
    assert observation == [system("Answer briefly."), user("Say 3")]
    assert info == {"task_index": 3}
    assert env.state is not None and env.state.messages == observation
    assert env.observation_space.contains(observation)


def test_single_turn_step_ends_the_episode_with_the_reward() -> None:
    env = quiz()
    env.reset(options={"task_index": 7})
    observation, reward_value, terminated, truncated, info = env.step("7")
    assert (observation, reward_value, terminated, truncated) == ([], 1.0, True, False)
    assert info == {
        "turn": 1,
        "stop_reason": "terminated",
        "reward_components": {"exact_match": 1.0},
        "metrics": {},
        "errors": [],
    }
    assert env.state is not None and env.state.messages == [user("Say 7"), assistant("7")]


def test_seeding_is_deterministic() -> None:
    env = quiz()
    first = [env.reset(seed=seed)[1]["task_index"] for seed in range(10)]
    again = [env.reset(seed=seed)[1]["task_index"] for seed in range(10)]
    assert first == again
    assert len(set(first)) > 1
    env.reset(seed=123)
    unseeded_after_seed = [env.reset()[1]["task_index"] for _ in range(5)]
    env.reset(seed=123)
    assert [env.reset()[1]["task_index"] for _ in range(5)] == unseeded_after_seed


def test_options_choose_the_task() -> None:
    env = quiz()
    assert env.reset(options={"task": {"question": "Custom?", "answer": "x"}}) == (
        [user("Custom?")],
        {"task_index": -1},
    )
    with pytest.raises(EnvhubError, match=r"^env: task_index 50 is outside 0\.\.49$"):
        env.reset(options={"task_index": 50})


def test_prompt_formats() -> None:
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    env = SingleTurnEnv([{"prompt": chat}, {"prompt": "text prompt"}], system_prompt="sys")
    assert env.reset(options={"task_index": 0})[0] == [system("S"), user("U")]
    assert env.reset(options={"task_index": 1})[0] == [system("sys"), user("text prompt")]
    # A dataset row without either is refused when the env is made (test_required_fields); a
    # task passed in directly is refused when its prompt is built.
    with pytest.raises(
        EnvhubError, match=r"^env: task has neither 'prompt' nor 'question' \(\['answer'\]\)$"
    ):
        env.reset(options={"task": {"answer": "1"}})


def test_dataset_errors_and_iterables() -> None:
    with pytest.raises(EnvhubError, match="^env: the dataset is empty$"):
        SingleTurnEnv([])
    with pytest.raises(EnvhubError, match=r"^env: pass `dataset=` or override `load_dataset\(\)`$"):
        SingleTurnEnv()
    env = SingleTurnEnv(row for row in TASKS[:3])
    assert len(env.dataset) == 3
    assert env.reset(options={"task_index": 2})[0] == [user("Say 2")]


@reward
def close_enough(response: str, answer: Any) -> float:
    return float(response.strip() == str(answer))


@reward
def answer_optional(response: str, answer: Any = None) -> float:
    return float(answer is None or response == answer)


@group_reward
def best_of_group(responses: list[str], answers: list[Any]) -> list[float]:
    return [float(r == a) for r, a in zip(responses, answers, strict=True)]


def rows_without(field: str, missing: list[int], size: int = 20) -> list[dict[str, Any]]:
    """``size`` quiz rows; those in ``missing`` lack ``field`` (every other one sets it to None)."""
    rows = [{"question": f"Say {i}", "answer": str(i)} for i in range(size)]
    for n, index in enumerate(missing):
        if n % 2:
            rows[index][field] = None
        else:
            del rows[index][field]
    return rows


@pytest.mark.parametrize(
    ("rows", "rubric", "message"),
    [
        (
            rows_without("answer", [3]),
            Rubric([exact_match()]),
            "env: task 3 has no 'answer', needed by the reward `exact_match`",
        ),
        (
            rows_without("answer", [1, 2, 4, 5, 6, 7, 9]),
            Rubric([exact_match(), close_enough, answer_optional]),
            "env: tasks 1, 2, 4, 5, 6 and 2 more (7 of 20) have no 'answer', "
            "needed by the rewards `exact_match`, `close_enough`",
        ),
        (
            rows_without("answer", [19]),
            Rubric([best_of_group]),
            "env: task 19 has no 'answer', needed by the reward `best_of_group`",
        ),
        (
            rows_without("question", [0, 2]),
            Rubric(),
            "env: tasks 0, 2 (2 of 20) have neither 'prompt' nor 'question', "
            "needed by format_prompt",
        ),
    ],
    ids=["one-row", "many-rows-and-none", "group-reward", "no-prompt"],
)
def test_a_row_without_a_field_the_env_needs_is_named_when_the_env_is_made(
    rows: list[dict[str, Any]], rubric: Rubric, message: str
) -> None:
    # Before, such a row passed `envhub check` unless a seed drew it, then scored 0.0 in silence.
    with pytest.raises(EnvLoadError) as info:
        SingleTurnEnv(rows, rubric=rubric)
    assert str(info.value) == message


def test_fields_nothing_needs_may_be_missing() -> None:
    class OwnPrompt(SingleTurnEnv):
        def format_prompt(self, task: dict[str, Any]) -> list[Message]:
            return [user(f"Say {task['n']}")]

    no_answers = [{"question": "Say 1"}, {"question": "Say 2", "answer": None}]
    assert len(SingleTurnEnv(no_answers).dataset) == 2  # no reward asks for the answer
    assert len(SingleTurnEnv(no_answers, rubric=Rubric([answer_optional])).dataset) == 2
    assert len(OwnPrompt([{"n": 1, "answer": "1"}], rubric=Rubric([exact_match()])).dataset) == 1
    assert [f.names for f in quiz().required_fields()] == [("answer",), ("prompt", "question")]


def test_a_datasets_dataset_is_checked_by_column_in_its_own_row_order() -> None:
    import datasets  # a core dependency, imported here to keep this module's import light

    table = datasets.Dataset.from_list(rows_without("answer", [3, 4]))
    reordered = table.select(list(reversed(range(20))))  # rows 3 and 4 are now 16 and 15
    for dataset, message in [
        (table, "env: tasks 3, 4 (2 of 20) have no 'answer'"),
        (reordered, "env: tasks 15, 16 (2 of 20) have no 'answer'"),
    ]:
        with pytest.raises(EnvLoadError) as info:
            SingleTurnEnv(dataset, rubric=Rubric([exact_match()]))
        assert str(info.value) == f"{message}, needed by the reward `exact_match`"


def test_actions_in_every_form() -> None:
    env = quiz()
    for action in (
        "3",
        assistant("3"),
        {"role": "assistant", "content": "3"},
        AssistantTurn(message=assistant("3")),
    ):
        env.reset(options={"task_index": 3})
        assert env.step(action)[1] == 1.0
    env.reset()
    with pytest.raises(
        EnvhubError, match="^an action must be an assistant message, got role 'user'$"
    ):
        env.step(user("3"))
    assert as_turn("x") == AssistantTurn(message=assistant("x"))


def test_step_before_reset_and_after_the_end_raise() -> None:
    env = quiz()
    with pytest.raises(EnvhubError, match=r"^env: call reset\(\) before step\(\)$"):
        env.step("1")
    env.reset()
    env.step("1")
    with pytest.raises(
        EnvhubError, match=r"^env: the episode has ended \(terminated\); call reset\(\)$"
    ):
        env.step("1")


# -- multi-turn: terminated vs truncated ---------------------------------------------------------


def test_terminated_when_the_env_says_done_reward_only_at_the_end() -> None:
    env = Echo(TASKS)
    env.reset(seed=0)
    assert env.step("go") == ([user("again")], 0.0, False, False, {"turn": 1})
    assert env.step("go") == ([user("again")], 0.0, False, False, {"turn": 2})
    observation, reward_value, terminated, truncated, info = env.step("stop")
    assert (observation, reward_value, terminated, truncated) == ([], 0.3, True, False)
    assert (info["stop_reason"], info["reward_components"]) == ("terminated", {"turns": 0.3})


def test_truncated_by_max_turns() -> None:
    env = Echo(TASKS, max_turns=2)
    env.reset(seed=0)
    assert env.step("go")[1:4] == (0.0, False, False)
    observation, reward_value, terminated, truncated, info = env.step("go")
    assert (observation, reward_value, terminated, truncated) == ([user("again")], 0.2, False, True)
    assert info["stop_reason"] == "max_turns"
    assert info["reward_components"] == {"turns": 0.2}
    with pytest.raises(EnvhubError, match=r"the episode has ended \(max_turns\)"):
        env.step("go")


def test_truncated_by_max_tokens_counted_from_assistant_turns() -> None:
    env = Echo(TASKS, max_tokens=10)
    assert env.remaining_tokens is None  # no episode yet
    env.reset(seed=0)
    remaining = [env.remaining_tokens]
    for _ in range(2):
        result = env.step(AssistantTurn(message=assistant("go"), num_tokens=4))
        assert result[2:4] == (False, False)
        remaining.append(env.remaining_tokens)
    _, reward_value, terminated, truncated, info = env.step(
        AssistantTurn(message=assistant("go"), num_tokens=4, finish_reason="length")
    )
    assert remaining + [env.remaining_tokens] == [10, 6, 2, 0]
    assert (reward_value, terminated, truncated, info["stop_reason"]) == (
        0.3,
        False,
        True,
        "max_tokens",
    )
    assert info["metrics"] == {"length_stopped_turns": 1}
    assert env.state is not None and env.state.tokens == 12


def test_the_rubric_runs_once_per_episode() -> None:
    calls = []

    @reward
    def counted() -> float:
        calls.append(1)
        return 1.0

    env = Echo(TASKS, rubric=Rubric([counted]), max_turns=5)
    env.reset(seed=0)
    rewards = [env.step(text)[1] for text in ("a", "b", "stop")]
    assert rewards == [0.0, 0.0, 1.0]
    assert calls == [1]


def test_reward_errors_are_in_the_final_info() -> None:
    @reward
    def broken() -> float:
        raise RuntimeError("judge down")

    env = quiz(rubric=Rubric([broken]))
    env.reset()
    _, reward_value, _, _, info = env.step("x")
    assert reward_value == 0.0
    assert info["errors"] == [
        ErrorRecord(stage="reward:broken", type="RuntimeError", message="judge down")
    ]
    assert info["reward_components"] == {"broken": 0.0}


def test_atruncate_ends_the_episode_from_outside_and_scores_it() -> None:
    env = Echo(TASKS)
    env.reset(seed=0)
    env.step("go")
    reward_value, info = asyncio.run(env.atruncate("max_context"))
    assert reward_value == 0.1
    assert info == {
        "turn": 1,
        "stop_reason": "max_context",
        "reward_components": {"turns": 0.1},
        "metrics": {},
        "errors": [],
    }
    with pytest.raises(EnvhubError, match=r"the episode has ended \(max_context\)"):
        env.step("go")


def test_render() -> None:
    env = quiz()
    assert env.render() == ""
    env.reset(options={"task_index": 1})
    env.step("1")
    assert env.render() == "[user] Say 1\n\n[assistant] 1"


# -- sync-only and async-only custom envs ---------------------------------------------------------


class SyncOnly(Env):
    name = "sync-only"

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[int] = []

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        self.threads.append(threading.get_ident())
        return [user("hi")], {"seed": seed}

    def step(self, action: Any) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        self.threads.append(threading.get_ident())
        return [], 1.0, True, False, {"action": as_turn(action).message.content}


class AsyncOnly(Env):
    name = "async-only"

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        await asyncio.sleep(0)
        return [user("hi")], {"seed": seed}

    async def astep(self, action: Any) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        await asyncio.sleep(0)
        return [], 0.5, True, False, {"action": as_turn(action).message.content}


def test_a_sync_only_env_works_through_the_async_methods_in_a_worker_thread() -> None:
    env = SyncOnly()

    async def main() -> tuple[Any, Any]:
        return await env.areset(seed=4), await env.astep("x")

    assert asyncio.run(main()) == (
        ([user("hi")], {"seed": 4}),
        ([], 1.0, True, False, {"action": "x"}),
    )
    assert threading.get_ident() not in env.threads


def test_an_async_only_env_works_through_the_sync_methods() -> None:
    env = AsyncOnly()
    assert env.reset(seed=2) == ([user("hi")], {"seed": 2})
    assert env.step("y") == ([], 0.5, True, False, {"action": "y"})


def test_an_async_only_env_works_through_the_sync_methods_inside_a_running_loop() -> None:
    env = AsyncOnly()

    async def main() -> tuple[Any, Any]:
        return env.reset(seed=2), env.step("y")

    gc.collect()  # earlier tests' garbage must not be blamed on this one
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert asyncio.run(main()) == (
            ([user("hi")], {"seed": 2}),
            ([], 0.5, True, False, {"action": "y"}),
        )
        gc.collect()
    # each call ran on a helper thread's own event loop, which must be closed, not leaked
    assert [str(w.message) for w in caught if "unclosed event loop" in str(w.message)] == []


def test_an_env_with_neither_method_says_what_to_implement() -> None:
    class Nothing(Env):
        pass

    env = Nothing()
    with pytest.raises(
        NotImplementedError, match=r"^Nothing must implement reset\(\) or areset\(\)$"
    ):
        env.reset()
    with pytest.raises(
        NotImplementedError, match=r"^Nothing must implement step\(\) or astep\(\)$"
    ):
        asyncio.run(env.astep("x"))


# -- lifecycle, spaces, state ----------------------------------------------------------------------


def test_close_is_idempotent_and_envs_are_context_managers() -> None:
    closed = []

    class Closing(SyncOnly):
        def on_close(self) -> None:
            closed.append(1)

    env = Closing()
    with env as same:
        assert same is env
    env.close()
    env.close()
    assert closed == [1]


def test_spaces() -> None:
    env = quiz()
    assert env.observation_space == MessagesSpace() and env.action_space == AssistantTurnSpace()
    assert env.observation_space.contains([{"role": "user", "content": "x"}, user("y")])
    assert not env.observation_space.contains([{"role": "robot", "content": "x"}])
    assert not env.observation_space.contains("text")
    assert env.action_space.contains("text") and env.action_space.contains(assistant("a"))
    assert not env.action_space.contains(user("u"))
    assert not env.action_space.contains(AssistantTurn(message=user("u")))


@pytest.mark.parametrize("space", [MessagesSpace(), AssistantTurnSpace()])
def test_seeded_spaces_sample_reproducibly(space: Any) -> None:
    space.seed(7)
    first = [space.sample() for _ in range(3)]
    space.seed(7)
    assert [space.sample() for _ in range(3)] == first


def test_spaces_sample_what_gymnasiums_text_space_samples() -> None:
    from gymnasium import spaces

    # The text space is made on first use; seeding before or at construction is the same.
    expected = spaces.Text(max_length=256, seed=3)
    late = AssistantTurnSpace()
    late.seed(3)
    assert [AssistantTurnSpace(seed=3).sample(), late.sample()] == [expected.sample()] * 2
    messages = MessagesSpace(seed=5).sample()
    assert messages == [user(spaces.Text(max_length=64, seed=5).sample())]


def test_state_views() -> None:
    prompt = [user("q")]
    state = State(
        task={"answer": 3, "info": {"k": 1}},
        task_index=0,
        prompt=prompt,
        messages=[*prompt, assistant("a"), user("b")],
    )
    assert (state.response, state.answer, state.info) == ("a", 3, {"k": 1})
    assert state.completion == [assistant("a"), user("b")]
    assert State(task={}, task_index=0, prompt=prompt, messages=prompt).response == ""
    assert State(task={}, task_index=0, prompt=prompt, messages=prompt).info == {}


def test_task_env_metadata() -> None:
    env = quiz()
    assert isinstance(env, TaskEnv)
    assert (env.ref.name, env.ref.version, env.reward_range, env.max_turns) == (
        "env",
        "0.0.0",
        (0.0, 1.0),
        1,
    )
    assert Echo(TASKS).max_turns == 10
    assert env.tool_schemas is None


def test_pay_once_pays_a_component_the_first_time_only() -> None:
    state = State(task={}, task_index=0, prompt=[], messages=[])
    assert state.pay_once(0.5, "tool_use") is True
    assert state.pay_once(0.5, "tool_use") is False
    assert (state.step_reward, state.paid) == (0.5, {"tool_use": 0.5})
    state.paid["bonus"] = 0.0  # reserved (reported even if never paid), not yet paid
    assert state.pay_once(0.25, "bonus") is True and state.paid["bonus"] == 0.25
