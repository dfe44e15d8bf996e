"""Training tasks behind one protocol (`zoo.training.tasks.base.Task`), looked up by name here only.

    seq2seq                    `zoo.training.tasks.seq2seq`          parallel text, teacher forcing, BLEU, packing
    causal_lm, masked_lm       `zoo.training.tasks.language_model`   plain text, packing, BERT's masking
    sequence_classification    `zoo.training.tasks.classification`   labelled text, a classifier head,
    token_classification                                             accuracy (and token F1)
    image_classification       `zoo.training.tasks.images`           images (.npz, scikit-learn's digits), an
                                                                     image front-end and classifier, accuracy
    chat                       `zoo.training.tasks.chat`             conversations (JSON lines), the loss on
                                                                     the assistant's turns, packing
    dpo                        `zoo.training.tasks.dpo`              preference pairs, DPO's loss (or IPO,
                                                                     hinge, SimPO, ORPO), a frozen reference
                                                                     (or LoRA's base)
    kto                        `zoo.training.tasks.kto`              unpaired completions labelled good or
                                                                     bad, KTO's loss, dpo's reference
    contrastive                `zoo.training.tasks.contrastive`      (anchor, positive[, negatives]) lines,
                                                                     in-batch negatives, an embedding model
    grpo                       `zoo.training.tasks.grpo`             prompts, completions sampled online and
                                                                     scored by reward functions, GRPO's loss

A task is built with its own settings, the config's ``task: {kind: NAME, ...}`` (`build_task`); setup
(`zoo.training.setup`) and the loop (`zoo.training.loop`) hold no task branches: they ask the task. A new
task is one module with a `Task` subclass, one row in `TASKS`, and its settings in
`zoo.training.task_settings` (plain data, so a config validates without importing torch).
"""

from __future__ import annotations

from zoo.spec import ModelSpec
from zoo.training.config import ConfigError, PackingConfig
from zoo.training.task_settings import SETTINGS, TaskSettings
from zoo.training.tasks.base import Task
from zoo.training.tasks.chat import Chat
from zoo.training.tasks.classification import SequenceClassification, TokenClassification
from zoo.training.tasks.contrastive import Contrastive
from zoo.training.tasks.dpo import DPO
from zoo.training.tasks.grpo import GRPO
from zoo.training.tasks.images import ImageClassification
from zoo.training.tasks.kto import KTO
from zoo.training.tasks.language_model import CausalLM, MaskedLM
from zoo.training.tasks.seq2seq import Seq2Seq

# The registry: a task's name (its settings' kind) -> the class that implements it.
TASKS: dict[str, type[Task]] = {
    task.name: task
    for task in (
        Seq2Seq,
        CausalLM,
        MaskedLM,
        SequenceClassification,
        TokenClassification,
        ImageClassification,
        Chat,
        DPO,
        KTO,
        Contrastive,
        GRPO,
    )
}
assert set(TASKS) == set(SETTINGS), "every task the config accepts is registered, and only those"
assert all(TASKS[kind].settings_type is settings for kind, settings in SETTINGS.items()), "each its own"


def build_task(settings: TaskSettings, *, packing: PackingConfig | None = None) -> Task:
    """The task ``settings`` name, holding them, with ``data.packing`` (a `ConfigError` for a task that
    does not pack)."""
    return TASKS[settings.kind](settings, packing=packing)


def get_task(name: str) -> Task:
    """The task called ``name``, its settings at their defaults."""
    return TASKS[name]()


def resolve_task(
    settings: TaskSettings | None, spec: ModelSpec, *, packing: PackingConfig | None = None, where: str
) -> Task:
    """The task ``settings`` name, or (None) the natural one for the model (its family's, or its
    classifier's) with its settings at their defaults; a task the model cannot do is a `ConfigError`."""
    if settings is None:
        natural = next(task for task in TASKS.values() if task.natural_for(spec))
        settings = natural.settings_type(kind=natural.name)
    task = build_task(settings, packing=packing)
    if task.family != spec.family:
        raise ConfigError(f"task {task.name} needs a {task.family} model, but the model is {spec.family}")
    task.check_model(spec, where=where)
    return task


__all__ = ["TASKS", "Task", "build_task", "get_task", "resolve_task"]
