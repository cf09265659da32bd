"""The guessing games: number guessing and Wordle, move by move."""

from __future__ import annotations

import pytest

from envhub.audit import audit_env
from envhub.checks.checker import check_env
from envhub.envs.guessing import (
    WORDLE_LEVELS,
    GuessNumberEnv,
    WordleEnv,
    best_guess,
    binary_search_policy,
    binary_search_turns,
    default_words,
    number_tasks,
    parse_number,
    parse_word,
    score_guess,
)
from envhub.errors import EnvhubError
from envhub.types import assistant

SECRET_37 = {
    "question": "I am thinking of a whole number from 1 to 100. Guess it.",
    "answer": 37,
    "info": {"low": 1, "high": 100},
}


def replies(env, *actions: str) -> list[tuple[str, float, bool, bool]]:
    out = []
    for action in actions:
        observation, reward, terminated, truncated, _ = env.step(action)
        out.append((observation[0].content, reward, terminated, truncated))
    return out


# -- guess the number -----------------------------------------------------------------------


def test_secrets_come_from_the_task_not_the_reset_seed() -> None:
    assert [number_tasks(1, 100, 10, 0)[i]["answer"] for i in range(5)] == [11, 74, 81, 96, 92]
    env = GuessNumberEnv()
    secrets = set()
    for seed in range(5):  # the runner gives each sample of a group its own seed
        env.reset(seed=seed, options={"task_index": 4})
        secrets.add(env.state.answer)
    assert secrets == {92}
    assert env.state.info == {"low": 1, "high": 100, "level": "1-100"}
    assert all(1 <= t["answer"] <= 100 for t in number_tasks(1, 100, 500, 3))


def test_feedback_sequence_for_a_known_secret() -> None:
    env = GuessNumberEnv()
    prompt, _ = env.reset(seed=0, options={"task": SECRET_37})
    assert (
        prompt[-1].content
        == "I am thinking of a whole number from 1 to 100. Guess it. You have 7 guesses."
    )
    assert replies(env, "My first guess is 50.", "25", "hmm", "I say 150", "37") == [
        ("50 is too high. Guess lower. (6 guesses left)", 0.0, False, False),
        ("25 is too low. Guess higher. (5 guesses left)", 0.0, False, False),
        (
            "I found no number in your reply. "
            "Reply with one whole number from 1 to 100. (4 guesses left)",
            0.0,
            False,
            False,
        ),
        ("150 is not from 1 to 100. (3 guesses left)", 0.0, False, False),
        ("Correct! The number is 37.", 1.0, True, False),
    ]
    assert dict(env.state.metrics) == {"invalid_guesses": 2}
    assert env.state.reward_components == {"solved": 1.0}


def test_running_out_of_guesses_scores_zero() -> None:
    env = GuessNumberEnv()
    env.reset(seed=0, options={"task": SECRET_37})
    outcome = replies(env, *["1"] * 7)
    assert outcome[-2] == ("1 is too low. Guess higher. (1 guess left)", 0.0, False, False)
    assert outcome[-1] == ("1 is too low. Guess higher. (0 guesses left)", 0.0, False, True)
    assert env.state.stop_reason == "max_turns"


def test_progress_reward_pays_each_guess_its_share_of_the_information() -> None:
    # 1..100, secret 37, w = 0.5: 50 leaves 1..49 (log(100/49)/log 100), 60 is already ruled
    # out (0), 25 leaves 26..49 (log(49/24)/log 100), the win leaves 1 (log 24/log 100).
    import math

    env = GuessNumberEnv(progress_reward=0.5)
    assert (env.reward_range, env.pass_threshold, env.audit_floor) == ((0.0, 1.5), 1.5, 0.5)
    env.reset(seed=0, options={"task": SECRET_37})
    rewards = [r for _, r, _, _ in replies(env, "50", "60", "hmm", "25", "37")]
    share = [math.log(100 / 49), 0.0, 0.0, math.log(49 / 24), math.log(24)]
    assert rewards[:4] == pytest.approx([0.5 * x / math.log(100) for x in share[:4]], abs=1e-12)
    assert rewards[4] == pytest.approx(1.0 + 0.5 * share[4] / math.log(100), abs=1e-12)
    assert sum(rewards) == pytest.approx(1.5, abs=1e-12)  # a win earns all the progress
    assert env.state.reward_components == pytest.approx({"progress": 0.5, "solved": 1.0})


def test_progress_reward_is_reported_even_when_nothing_narrowed() -> None:
    env = GuessNumberEnv(progress_reward=0.5, max_turns=2)
    env.reset(seed=0, options={"task": SECRET_37})
    assert [r for _, r, _, _ in replies(env, "no idea", "still none")] == [0.0, 0.0]
    assert env.state.reward_components == {"progress": 0.0, "solved": 0.0}
    with pytest.raises(EnvhubError, match="progress_reward must be >= 0"):
        GuessNumberEnv(progress_reward=-1)


def test_guess_number_with_progress_passes_the_env_checks_and_the_audit() -> None:
    import envhub

    env = envhub.make("guess-number", low=1, high=16, progress_reward=0.5)
    assert envhub.check_env(env).passed
    assert envhub.audit_env(env).passed


@pytest.mark.parametrize(
    ("text", "number"), [("42", 42), ("between 10 and 20: 15", 15), ("-3", -3), ("no idea", None)]
)
def test_parse_number_takes_the_last_whole_number(text: str, number: int | None) -> None:
    assert parse_number(text) == number


def test_turn_budget_fits_binary_search() -> None:
    assert [binary_search_turns(1, h) for h in (1, 2, 3, 100, 127, 128, 1000)] == [
        1,
        2,
        2,
        7,
        7,
        8,
        10,
    ]
    assert GuessNumberEnv().max_turns == 7
    assert GuessNumberEnv(low=1, high=1000).max_turns == 10
    assert GuessNumberEnv(max_turns=6).reference_policy is None
    with pytest.raises(EnvhubError):
        GuessNumberEnv(low=5, high=4)


@pytest.mark.parametrize(("low", "high"), [(1, 100), (-20, 20)])
def test_binary_search_finds_every_secret_in_time(low: int, high: int) -> None:
    env = GuessNumberEnv(low=low, high=high)
    for secret in range(low, high + 1):
        task = {
            **SECRET_37,
            "question": f"I am thinking of a whole number from {low} to {high}. Guess it.",
            "answer": secret,
            "info": {"low": low, "high": high},
        }
        messages, _ = env.reset(seed=0, options={"task": task})
        while True:
            guess = binary_search_policy(messages, None)
            observation, reward, terminated, truncated, _ = env.step(guess)
            messages = [*messages, assistant(guess), *observation]
            if terminated or truncated:
                break
        assert (reward, terminated) == (1.0, True), secret


# -- Wordle ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("guess", "target", "pattern"),
    [
        ("crane", "crane", "GGGGG"),
        ("mouse", "crane", "XXXXG"),
        ("nacre", "crane", "YYYYG"),
        # worked by hand: the one E of CRANE is green at the end, so the first two E's are X
        ("eerie", "crane", "XXYXG"),
        # SHEEP has two E's, both elsewhere: the first two E's of EERIE are Y, the third is X
        ("eerie", "sheep", "YYXXX"),
        # SPEED: E at 3 is green, the one E left is claimed by the E at 2; S is elsewhere
        ("geese", "speed", "XYGYX"),
        # ABBEY: the B at 3 is green, the other B of ABBEY makes the first B yellow
        ("babes", "abbey", "YYGGX"),
        # PLANT has one L, taken by the green L: the first L is X
        ("llama", "plant", "XGGXX"),
    ],
)
def test_wordle_feedback_handles_repeated_letters(guess: str, target: str, pattern: str) -> None:
    assert score_guess(guess, target) == pattern


@pytest.mark.parametrize(
    ("text", "word"),
    [
        ("<guess>Crane</guess>", "crane"),
        ("CRANE.", "crane"),
        ("<guess>ab</guess> no, <guess>plant</guess>", "plant"),
        ("I think it is crane", None),
        ("<guess>cranes</guess>", None),
        ("", None),
    ],
)
def test_parse_word(text: str, word: str | None) -> None:
    assert parse_word(text) == word


def test_wordle_episode_with_an_invalid_guess() -> None:
    env = WordleEnv()
    prompt, _ = env.reset(
        seed=0,
        options={"task": {"question": "Guess the secret word.", "answer": "sheep", "info": {}}},
    )
    assert prompt[-1].content == "Guess the secret word. You have 6 guesses."
    assert replies(env, "<guess>eerie</guess>", "hello there", "<guess>SHEEP</guess>") == [
        ("EERIE: YYXXX (5 guesses left)", 0.0, False, False),
        (
            "Reply with one five-letter word, e.g. <guess>crane</guess>. (4 guesses left)",
            0.0,
            False,
            False,
        ),
        ("SHEEP: GGGGG Solved!", 1.0, True, False),
    ]
    assert dict(env.state.metrics) == {"invalid_guesses": 1}


def test_six_misses_lose() -> None:
    env = WordleEnv()
    env.reset(seed=0, options={"task_index": 0})
    assert env.state.answer == "every"
    outcome = replies(env, *["<guess>crane</guess>"] * 6)
    assert outcome[-1] == ("CRANE: XYXXY (0 guesses left)", 0.0, False, True)


def test_the_word_list_and_task_order() -> None:
    words = default_words()
    assert len(words) == 619 and list(words) == sorted(set(words))
    assert all(len(w) == 5 and w.isascii() and w.isalpha() and w.islower() for w in words)
    env = WordleEnv()
    assert [t["answer"] for t in env.dataset[:3]] == ["every", "forth", "woman"]
    assert sorted(t["answer"] for t in env.dataset) == list(words)
    assert [t["answer"] for t in WordleEnv(task_seed=1).dataset[:3]] != ["every", "forth", "woman"]


def test_custom_words() -> None:
    env = WordleEnv(words=["Crane", "plant", "crane"])
    assert sorted(t["answer"] for t in env.dataset) == ["crane", "plant"]
    assert env.reference_policy is not None  # both are shipped words
    assert WordleEnv(words=["zzzzz"]).reference_policy is None
    assert WordleEnv(max_turns=4).reference_policy is not None  # minimax needs 4 at most
    assert WordleEnv(max_turns=3).reference_policy is None
    with pytest.raises(EnvhubError, match="five letters"):
        WordleEnv(words=["toolong"])


def test_minimax_solves_every_shipped_word_within_six_guesses() -> None:
    worst = 0
    for target in default_words():
        history: tuple[tuple[str, str], ...] = ()
        for turn in range(1, 7):
            guess = best_guess(history)
            pattern = score_guess(guess, target)
            if pattern == "GGGGG":
                worst = max(worst, turn)
                break
            history += ((guess, pattern),)
        else:
            pytest.fail(f"{target} is not found in 6 guesses")
    assert worst == 4  # two guesses to spare


def test_levels_select_the_range_and_the_guesses_binary_search_needs() -> None:
    assert GuessNumberEnv.levels == ("1-10", "1-100", "1-1000", "1-10000")
    for level, high, turns in [("1-10", 10, 4), ("1-1000", 1000, 10)]:
        env = GuessNumberEnv(level=level, num_tasks=2)
        assert (env.low, env.high, env.max_turns, env.current_level()) == (1, high, turns, level)
        assert env.dataset[0]["info"] == {"low": 1, "high": high, "level": level}
    assert GuessNumberEnv().current_level() == "1-100"  # the default range is a level
    assert GuessNumberEnv(low=1, high=10).current_level() == "1-10"
    assert GuessNumberEnv(low=5, high=9).current_level() is None  # no level has this range
    assert GuessNumberEnv(low=5, high=9).dataset[0]["info"] == {"low": 5, "high": 9}
    with pytest.raises(EnvhubError, match="level must be one of 1-10, 1-100"):
        GuessNumberEnv(level="1-5")
    with pytest.raises(EnvhubError, match="either level or low/high"):
        GuessNumberEnv(level="1-10", high=20)


# -- Wordle's levels ------------------------------------------------------------------------


def test_wordle_levels_set_the_listed_words_and_the_guesses() -> None:
    assert WordleEnv.levels == ("list-4", "list-16", "6-guesses", "5-guesses", "4-guesses")
    turns = {level: WordleEnv(level=level).max_turns for level in WORDLE_LEVELS}
    assert turns == {"list-4": 6, "list-16": 6, "6-guesses": 6, "5-guesses": 5, "4-guesses": 4}
    assert all(WordleEnv(level=level).current_level() == level for level in WORDLE_LEVELS)
    # The default game is the level 6-guesses, task for task; a level's tasks record it.
    default, six = WordleEnv().dataset, WordleEnv(level="6-guesses").dataset
    assert WordleEnv().current_level() == "6-guesses" and list(default) == list(six)
    assert default[0] == {
        "question": "Guess the secret word.", "answer": "every", "info": {"level": "6-guesses"},
    }  # fmt: skip
    assert WordleEnv(max_turns=4).current_level() == "4-guesses"
    assert WordleEnv(max_turns=7).current_level() is None
    assert WordleEnv(max_turns=7).dataset[0]["info"] == {}


def test_a_list_level_names_the_secret_among_words_drawn_from_seed_level_and_index() -> None:
    listed = WordleEnv(level="list-4").dataset
    assert listed[0] == {
        "question": "Guess the secret word. "
        "It is one of these 4 words: every, forum, jelly, meter.",
        "answer": "every",
        "info": {"level": "list-4", "listed": ["every", "forum", "jelly", "meter"]},
    }
    assert listed[1]["info"]["listed"] == ["begin", "forth", "prime", "thing"]
    sixteen = WordleEnv(level="list-16").dataset[0]["info"]["listed"]
    assert sixteen == [
        "again", "break", "crane", "every", "flood", "gross", "limit", "noise",
        "onion", "pedal", "piano", "silly", "solid", "stain", "stair", "table",
    ]  # fmt: skip
    # The same secrets in the same order as the open game; another seed, other secrets.
    assert [t["answer"] for t in listed] == [t["answer"] for t in WordleEnv().dataset]
    assert list(WordleEnv(level="list-4").dataset) == list(listed)  # rebuilt, the same
    other = WordleEnv(level="list-4", task_seed=1).dataset[0]
    assert other["info"]["listed"] == ["dwarf", "onion", "spoon", "straw"]
    assert other["answer"] == "onion"
    assert all(t["answer"] in t["info"]["listed"] for t in listed)


def test_wordle_levels_refuse_bad_arguments() -> None:
    with pytest.raises(EnvhubError, match="level must be one of list-4, list-16, 6-guesses"):
        WordleEnv(level="list-8")
    with pytest.raises(EnvhubError, match="either level or max_turns"):
        WordleEnv(level="list-4", max_turns=6)
    with pytest.raises(EnvhubError, match="'list-16' lists 16 words, but words has only 3"):
        WordleEnv(words=["crane", "plant", "every"], level="list-16")
    assert WordleEnv(words=["crane", "plant", "every", "woman"], level="list-4").dataset[0]["info"][
        "listed"
    ] == ["crane", "every", "plant", "woman"]


def test_minimax_finds_the_listed_secret_in_two_or_three_guesses() -> None:
    for level, expected in [("list-4", {1: 10, 2: 22}), ("list-16", {1: 1, 2: 30, 3: 1})]:
        turns: dict[int, int] = {}
        for task in WordleEnv(level=level).dataset[:32]:
            history: tuple[tuple[str, str], ...] = ()
            for turn in range(1, 7):
                guess = best_guess(history, tuple(task["info"]["listed"]))
                pattern = score_guess(guess, task["answer"])
                if pattern == "GGGGG":
                    turns[turn] = turns.get(turn, 0) + 1
                    break
                history += ((guess, pattern),)
        assert turns == expected, level


@pytest.mark.parametrize("level", ["list-4", "list-16", "4-guesses"])
def test_wordle_levels_pass_the_env_checks_and_the_audit(level: str) -> None:
    with WordleEnv(level=level) as env:
        report = check_env(env)
        assert report.passed, report.failures
        assert next(r.detail for r in report.results if r.name == "reference policy at top") == (
            "1.0"
        )
        assert audit_env(env).passed
