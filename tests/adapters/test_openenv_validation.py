"""Whose fault a validation error is, read from pydantic's own errors as OpenEnv sends them."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, ValidationError

from envhub.adapters.openenv.validation import blames_action


class Move(BaseModel):
    piece: str
    to: list[int]


class Board(BaseModel):
    cells: int


def errors_of(model: type[BaseModel], data: dict) -> list[dict]:
    """The errors as OpenEnv's server sends them (through JSON)."""
    with pytest.raises(ValidationError) as caught:
        model.model_validate(data)
    return json.loads(json.dumps(caught.value.errors(), default=str))


def test_errors_about_the_sent_action_blame_it_and_others_do_not() -> None:
    wrong_type = {"piece": "rook", "to": [1, "x"]}
    assert blames_action(errors_of(Move, wrong_type), wrong_type)
    missing = {"piece": "rook"}
    assert blames_action(errors_of(Move, missing), missing)
    # The env's own model failing while the action was fine: not the action's fault, even
    # where a field name is shared.
    fine = {"piece": "rook", "to": [1, 2], "cells": 3}
    assert not blames_action(errors_of(Board, {"cells": "many"}), fine)
    assert not blames_action(errors_of(Board, {}), {"piece": "rook", "to": [1]} | {"x": 1})
    assert blames_action(None, fine)  # a server that sends no errors: as OpenEnv blames
