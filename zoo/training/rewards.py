"""Reward functions for ``task: grpo``, named in the config and called on each batch's completions.

    task: {kind: grpo, rewards: ["examples/rewards.py:correct", "my_package.rewards:short"], reward_weights: [1.0, 0.5]}

A name is ``file.py:function`` (a path, relative to the working directory, loaded as a module of its own) or
``module:function`` (imported). A reward function is called as TRL calls one:

    fn(prompts: list, completions: list[str], **columns) -> list[float | None]

``prompts``: each completion's prompt as its JSON line wrote it (a string, or a list of chat messages), one per
completion (a prompt's group_size completions are consecutive); ``completions``: the generated text (special
tokens left out, cut before an end-of-turn token); ``columns``: every other key of the JSON lines, as a list
per key aligned with the completions. It returns one number per completion; None where it does not apply
(that completion's reward is the others' weighted sum: TRL's ``nansum``).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from zoo.training.config import ConfigError

RewardFunction = Callable[..., Sequence[float | None]]


def load_reward(name: str) -> RewardFunction:
    """The function ``name`` ("file.py:function" or "module:function") names, or a `ConfigError`."""
    where, _, attribute = name.rpartition(":")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise ConfigError(f"task.rewards: {name}: no file {path} (relative to {Path.cwd()})")
        module_name = f"zoo_rewards_{path.stem}_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # dataclasses and pickling look the module up by name
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as error:
            raise ConfigError(f"task.rewards: {name}: cannot import {where} ({error})") from None
    function = getattr(module, attribute, None)
    if not callable(function):
        raise ConfigError(f"task.rewards: {name}: {where} has no function {attribute}")
    return function


class Rewards:
    """The config's reward functions and their weights: `score` gives each completion's reward from each."""

    def __init__(self, names: Sequence[str], weights: Sequence[float]) -> None:
        self.names = [name.rpartition(":")[2] for name in names]
        self.functions = [load_reward(name) for name in names]
        self.weights = torch.tensor(list(weights), dtype=torch.float32)  # (F,)
        self._full = list(names)

    def score(
        self, prompts: Sequence[Any], completions: Sequence[str], columns: Mapping[str, Sequence[Any]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(R,) each completion's weighted reward and (R, F) each function's (NaN where it returned None)."""
        found = torch.empty(len(completions), len(self.functions), dtype=torch.float32)  # (R, F)
        for f, (name, function) in enumerate(zip(self._full, self.functions)):
            values = function(prompts=list(prompts), completions=list(completions), **columns)
            if not isinstance(values, Sequence) or len(values) != len(completions):
                got = f"{len(values)} values" if isinstance(values, Sequence) else type(values).__name__
                raise ValueError(
                    f"reward {name} returned {got} for {len(completions)} completions: one number each"
                )
            for i, value in enumerate(values):
                if value is None:
                    found[i, f] = math.nan
                elif isinstance(value, int | float) and math.isfinite(value):  # a bool counts as 0 / 1
                    found[i, f] = float(value)
                else:
                    raise ValueError(
                        f"reward {name} returned {value!r} for completion {i}: a finite number or None"
                    )
        return (found * self.weights).nansum(dim=1), found  # (R,), (R, F)
