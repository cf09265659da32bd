"""The Terminus-style agent's reply format: commands and completion read from one JSON object
(prose around it allowed), durations capped, anything else refused with the reason."""

from __future__ import annotations

import pytest

from envhub.harness.terminus import KEY_NAME, MAX_WAIT_S, Command, parse_reply


def test_a_reply_gives_its_commands_and_completion() -> None:
    text = (
        'Sure.\n{"commands": [{"keystrokes": "ls\\n", "duration": 99}, {"keystrokes": "C-c"}],'
        ' "task_complete": false}\nThanks'
    )
    assert parse_reply(text) == ([Command("ls\n", MAX_WAIT_S), Command("C-c", 1.0)], False)
    assert parse_reply('{"task_complete": true}') == ([], True)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("no braces", "no JSON object in the reply"),
        ("{not json}", "the JSON object does not parse"),
        ('{"commands": "ls"}', '"commands" must be a list'),
        ('{"commands": [{"keys": "ls"}]}', '"commands" must be a list'),
    ],
)
def test_other_replies_are_refused_with_the_reason(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_reply(text)


def test_key_names_are_pressed_and_text_is_typed() -> None:
    assert all(KEY_NAME.fullmatch(k) for k in ("C-c", "Enter", "Escape", "M-x", "Up"))
    assert not any(KEY_NAME.fullmatch(k) for k in ("ls\n", "echo hi", "C-c\n"))
