import asyncio
import re

from envhub.checks.doctor import CONVERSATIONS, check_prefix_property
from envhub.testing import ByteChatTokenizer
from envhub.types import Message


class ThinkStrippingTokenizer(ByteChatTokenizer):
    """Like Qwen3's template: drops the reasoning of assistant turns before the last user turn."""

    def render_sync(self, messages, tools, add_generation_prompt):
        last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
        kept = [
            m.model_copy(
                update={
                    "content": re.sub(r"<think>.*?</think>", "", m.content or "", flags=re.DOTALL)
                }
            )
            if m.role == "assistant" and i < last_user
            else m
            for i, m in enumerate(messages)
        ]
        return super().render_sync(kept, tools, add_generation_prompt)


def test_concatenative_template_has_no_findings():
    checked, findings = asyncio.run(check_prefix_property(ByteChatTokenizer()))
    assert (checked, findings) == (6, [])  # two followed assistant turns per conversation


def test_history_rewriting_template_is_reported_at_the_rewritten_turns():
    checked, findings = asyncio.run(check_prefix_property(ThinkStrippingTokenizer()))
    assert checked == 6
    assert [(f.conversation, f.turn) for f in findings] == [("reasoning", 0), ("reasoning", 1)]
    tok = ByteChatTokenizer()
    messages, _ = CONVERSATIONS["reasoning"]
    # The first difference is right where the removed "<think>" started in the history.
    prefix = tok.render_sync(messages[:1], None, True)
    assert findings[0].position == len(prefix)
    assert tok.decode(findings[0].expected).startswith("<think>")


def test_custom_conversations():
    convo = {
        "one": (
            [
                Message(role="user", content="a"),
                Message(role="assistant", content="b"),
                Message(role="user", content="c"),
            ],
            None,
        )
    }
    assert asyncio.run(check_prefix_property(ByteChatTokenizer(), convo)) == (1, [])
