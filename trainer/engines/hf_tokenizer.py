"""A :class:`~envhub.inference.base.ChatTokenizer` over a Hugging Face tokenizer's chat template."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from envhub.errors import ConfigError
from envhub.inference.messages import chat_template_message
from envhub.types import Message

# Tokenizers without a configured limit report this huge sentinel as their model_max_length.
_NO_LIMIT = 10**9


class HFChatTokenizer:
    """Renders conversations with ``tokenizer.apply_chat_template`` (the model's own template).

    Assistant turns are rendered from their raw sampled text (tool-call markup included), as
    :func:`~envhub.inference.messages.chat_template_message` prepares them, so a conversation
    re-rendered after a turn starts with the tokens that were sampled whenever the text
    re-tokenises to them.

    Args:
        tokenizer: A ``transformers`` tokenizer with a chat template.
        max_length: Longest context (prompt + completion); defaults to the tokenizer's
            ``model_max_length`` when it sets a real one. :class:`HFEngine` passes the model
            config's ``max_position_embeddings``.
        generation_config: The model's ``GenerationConfig``; its ``eos_token_id`` (one id or a
            list) is where a turn ends, together with the tokenizer's EOS token.
    """

    def __init__(
        self, tokenizer: Any, max_length: int | None = None, generation_config: Any = None
    ) -> None:
        self.tokenizer = tokenizer
        if max_length is None:
            limit = getattr(tokenizer, "model_max_length", None)
            max_length = int(limit) if isinstance(limit, int) and 0 < limit < _NO_LIMIT else None
        self._max_length = max_length
        configured = getattr(generation_config, "eos_token_id", None)
        self._eos_token_ids = _unique_ids([configured, getattr(tokenizer, "eos_token_id", None)])

    def __repr__(self) -> str:
        return f"HFChatTokenizer({type(self.tokenizer).__name__}, max_length={self._max_length})"

    @property
    def max_length(self) -> int | None:
        """Longest context (prompt + completion) the model accepts, if known."""
        return self._max_length

    @property
    def chat_template(self) -> str | dict[str, str] | None:
        """The template text prompts are rendered with (what provenance hashes)."""
        return getattr(self.tokenizer, "chat_template", None)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Token ids that end an assistant turn (generation config's first, then the
        tokenizer's)."""
        return self._eos_token_ids

    @property
    def pad_token_id(self) -> int:
        """Id used for left padding: the tokenizer's pad token, else the first EOS id."""
        pad = getattr(self.tokenizer, "pad_token_id", None)
        if pad is not None:
            return int(pad)
        if not self._eos_token_ids:
            raise ValueError(
                "the tokenizer has neither a pad nor an EOS token; set tokenizer.pad_token"
            )
        return self._eos_token_ids[0]

    async def render(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> list[int]:
        """Token ids of ``messages`` rendered with the chat template.

        Runs inline: rendering one conversation takes about a millisecond, less than handing
        it to a worker thread would cost.
        """
        return self.render_sync(messages, tools, add_generation_prompt)

    def render_sync(
        self,
        messages: Sequence[Message],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> list[int]:
        """The blocking twin of :meth:`render`."""
        ids = self.tokenizer.apply_chat_template(
            [chat_template_message(m) for m in messages],
            tools=tools or None,
            add_generation_prompt=add_generation_prompt,
            tokenize=True,
            return_dict=False,
        )
        return [int(i) for i in ids]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` exactly as sampled: special tokens kept, no whitespace clean-up
        (the text goes back into the next turn's prompt and must re-tokenise to ``ids``)."""
        return self.tokenizer.decode(
            list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )

    def stop_cut(self, ids: Sequence[int], stops: Sequence[str]) -> int:
        """Fewest leading ``ids`` whose text contains one of ``stops`` (``len(ids)`` if none
        does). A binary search: once a prefix's text holds a stop string, longer ones do too."""
        low, high = 1, len(ids)
        while low < high:
            middle = (low + high) // 2
            if any(s in self.decode(ids[:middle]) for s in stops):
                high = middle
            else:
                low = middle + 1
        return high


def generation_config(model_path: str) -> Any:
    """The model's generation config (its EOS ids), as transformers gives a loaded model: the
    folder's ``generation_config.json``, else one derived from ``config.json``."""
    from transformers import AutoConfig, GenerationConfig

    try:
        return GenerationConfig.from_pretrained(model_path)
    except OSError:
        return GenerationConfig.from_model_config(AutoConfig.from_pretrained(model_path))


def policy_chat_tokenizer(model_path: str, tokenizer: Any = None) -> HFChatTokenizer:
    """The chat tokenizer a trainer's engine renders ``model_path``'s prompts with: its
    context limit from the model's config and its turns ending on the generation config's EOS
    ids (``tokenizer``: already loaded, else loaded from the folder)."""
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = tokenizer or AutoTokenizer.from_pretrained(model_path)
    limit = getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", None)
    return HFChatTokenizer(
        tokenizer, max_length=limit, generation_config=generation_config(model_path)
    )


def load_chat_tokenizer(model: str) -> HFChatTokenizer:
    """The chat tokenizer of ``model`` (a local folder, a Hub id already in the cache, or an
    alias such as ``smollm2-135m``), loaded offline: nothing is downloaded.

    Raises:
        ConfigError: The model is not on this machine, or has no chat template.
    """
    from transformers import AutoTokenizer

    from envhub.trainer.models import resolve_model

    path = resolve_model(model)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except OSError:
        raise ConfigError(
            f"the tokenizer of {model!r} is not on this machine (nothing is downloaded) — give "
            "a local folder or smollm2-135m (installed by the set-up), or fetch it first with "
            f"`hf download {model}`"
        ) from None
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"{model!r} has no chat template: it is not a chat model")
    return HFChatTokenizer(tokenizer)


def _unique_ids(values: Iterable[int | Sequence[int] | None]) -> tuple[int, ...]:
    out: list[int] = []
    for value in values:
        if value is None:
            continue
        for i in [value] if isinstance(value, int) else value:
            if int(i) not in out:
                out.append(int(i))
    return tuple(out)
