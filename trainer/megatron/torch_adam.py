"""Checkpoint loads of megatron-core's distributed optimizer when it runs torch's Adam.

Without Apex or Transformer Engine (a bare GPU image, as GPU.md's machines are) megatron-core
falls back to ``torch.optim.AdamW``, which keeps a ``step`` tensor per parameter. megatron-core
0.19's distributed optimizer mishandles that tensor when it loads a checkpoint, twice; both were
found by an H100 run and reproduced on the CPU (``tests/trainer/megatron``, layout ``dp2``):

- a ``fully_reshardable`` load hands each parameter's states to
  ``_set_main_param_and_optimizer_states`` without ``step``, which then fails with
  ``KeyError: 'step'`` (:func:`keep_states_a_load_leaves_out`);
- it restores ``step`` by putting one tensor into every parameter's state, and torch's Adam
  increments each parameter's ``step`` in place: the first update after a resume counted 1 + the
  number of parameters steps, and its bias correction shrank the update to 0.65 of the right one
  (:func:`unshare_steps`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch


def keep_states_a_load_leaves_out(optimizer: Any) -> None:
    """Make each distributed optimizer in ``optimizer`` keep the current value of a state that a
    checkpoint load does not hand over (``step``, already restored from the parameter groups)."""
    for inner in inner_optimizers(optimizer):
        setter = getattr(inner, "_set_main_param_and_optimizer_states", None)
        getter = getattr(inner, "_get_main_param_and_optimizer_states", None)
        if setter is None or getter is None:
            continue

        def set_states(
            model_param: torch.Tensor,
            tensors: dict[str, torch.Tensor],
            _set: Callable = setter,
            _get: Callable = getter,
        ) -> None:
            _set(model_param, {**_get(model_param), **tensors})

        inner._set_main_param_and_optimizer_states = set_states


def unshare_steps(optimizer: Any) -> None:
    """Give every parameter of the torch optimizers inside ``optimizer`` its own ``step`` tensor
    (after a checkpoint load, they may all hold the same one)."""
    seen: set[int] = set()
    for inner in inner_optimizers(optimizer):
        for state in getattr(inner, "optimizer", inner).state.values():
            step = state.get("step")
            if isinstance(step, torch.Tensor):
                if id(step) in seen:
                    state["step"] = step.clone()
                seen.add(id(state["step"]))


def inner_optimizers(optimizer: Any) -> Iterator[Any]:
    """The optimizers a megatron-core optimizer is made of (itself, unless chained)."""
    yield from getattr(optimizer, "chained_optimizers", [optimizer])
