"""Training tasks behind one protocol (`zoo.training.tasks.base.Task`), looked up by name here only.

    seq2seq                    `zoo.training.tasks.seq2seq`          parallel text, teacher forcing, BLEU
    causal_lm, masked_lm       `zoo.training.tasks.language_model`   plain text, packing, BERT's masking
    sequence_classification    `zoo.training.tasks.classification`   labelled text, a classifier head,
    token_classification                                             accuracy (and token F1)
    chat                       `zoo.training.tasks.chat`             conversations (JSON lines), the loss on
                                                                     the assistant's turns, packing
    dpo                        `zoo.training.tasks.dpo`              preference pairs, DPO's loss, a frozen
                                                                     reference (or LoRA's base)

Setup (`zoo.training.prepare`) and the loop (`zoo.training.loop`) hold no task branches: they ask the
task. A new task is one module with a `Task` subclass and one row in `TASKS` (and its name in the config's
``Task`` literal, which validates configs without importing torch).
"""

from __future__ import annotations

from typing import get_args

from zoo.spec import ModelSpec
from zoo.training.config import ConfigError
from zoo.training.config import Task as TaskName
from zoo.training.tasks.base import Task
from zoo.training.tasks.chat import Chat
from zoo.training.tasks.classification import SequenceClassification, TokenClassification
from zoo.training.tasks.dpo import DPO
from zoo.training.tasks.language_model import CausalLM, MaskedLM
from zoo.training.tasks.seq2seq import Seq2Seq

TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Seq2Seq(),
        CausalLM(),
        MaskedLM(),
        SequenceClassification(),
        TokenClassification(),
        Chat(),
        DPO(),
    )
}
assert set(TASKS) == set(get_args(TaskName)), "every task the config accepts is registered, and only those"


def get_task(name: str) -> Task:
    """The task called ``name``."""
    return TASKS[name]


def resolve_task(name: str | None, spec: ModelSpec, *, where: str) -> Task:
    """The named task, or the natural one for the model (its family's, or its classifier's); a task the
    model cannot do is a `ConfigError`."""
    if name is None:
        task = next(task for task in TASKS.values() if task.natural_for(spec))
    else:
        task = TASKS[name]
    if task.family != spec.family:
        raise ConfigError(f"task {task.name} needs a {task.family} model, but the model is {spec.family}")
    task.check_model(spec, where=where)
    return task


__all__ = ["TASKS", "Task", "get_task", "resolve_task"]
