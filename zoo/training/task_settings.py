"""Each training task's own settings: the config's ``task:``, a union keyed on ``kind`` (as the spec's blocks).

    task: dpo                                          # a task by name, its settings at their defaults
    task: {kind: dpo, beta: 0.1, nll_coef: 0.0}
    task: {kind: dpo, loss: simpo, beta: 2.0, gamma: 1.0}
    task: {kind: kto, beta: 0.1, desirable_weight: 1.0, undesirable_weight: 1.0}
    task: {kind: masked_lm, mlm_probability: 0.15}
    task: {kind: chat, train_on_prompt: false}
    task: {kind: seq2seq, bleu: true, bleu_metric: sacrebleu, num_beams: 1}
    task: {kind: contrastive, scale: 20.0, similarity: cos, matryoshka_dims: [384, 128, 64]}
    task: {kind: grpo, group_size: 8, rewards: ["examples/rewards.py:correct"], beta: 0.04}
    (no task: the model's own, its family's or its classifier's, with its settings at their defaults)

A setting lives under the task that reads it, so a setting of another task cannot be written down.
What several tasks read stays in the config's sections: ``data.packing`` (causal_lm, masked_lm, chat and seq2seq
pack; setup leaves packed data uncut), ``loss.label_smoothing`` (every task; dpo's is cDPO's flip
probability), ``tokenizer.shared`` (with ``tokenizer.source_path``: which tokenizers setup loads or trains).

These are plain data, validated without torch (the tasks themselves, `zoo.training.tasks`, import it);
`zoo.training.tasks.build_task` makes the task that holds them. A new task is its module in
``zoo/training/tasks/``, its settings here (a member of `TaskSettingsUnion`) and its row in
`zoo.training.tasks.TASKS`; the config is not edited.

Settings at their old places (``loss.dpo_beta``, ``eval.bleu``, ...; `MOVED`) are refused with one line
that says where each went (`moved_message`); a run folder's ``train_config.yaml`` written by an older zoo
is read with them moved (`translate_saved`), so its run can still be read and resumed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import ConfigDict, Field, PositiveFloat, PositiveInt, model_validator

from zoo.spec.errors import CleanModel, short_repr


class TaskSettings(CleanModel):
    """What every task's settings share: the ``kind`` that names the task; unknown keys refused."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    kind: str

    def label_smoothing_problem(self, eps: float) -> str | None:
        """What is wrong with ``loss.label_smoothing: eps`` for this task (None: nothing)."""
        return None


class Seq2SeqSettings(TaskSettings):
    """seq2seq: validation adds the BLEU of the model's translations of the validation sources."""

    kind: Literal["seq2seq"] = "seq2seq"
    bleu: bool = Field(True, description="Decode the validation sources and score BLEU.")
    bleu_metric: Literal["sacrebleu", "whitespace"] = Field(
        "sacrebleu",
        description="sacrebleu (13a tokens, exp smoothing; reported with its signature) or 'whitespace', "
        "zoo's unsmoothed BLEU over str.split() tokens.",
    )
    bleu_samples: PositiveInt | None = Field(None, description="Decode only the first N pairs; null: all.")
    num_beams: PositiveInt = Field(1, description="Beams when decoding for BLEU; 1: greedy.")
    max_new_tokens: PositiveInt | None = Field(None, description="Decode length cap; default: max length.")


class CausalLMSettings(TaskSettings):
    """causal_lm: next-token prediction on plain text (``data.packing`` packs it); no settings of its own."""

    kind: Literal["causal_lm"] = "causal_lm"


class MaskedLMSettings(TaskSettings):
    """masked_lm: BERT's masking (80% [MASK], 10% a random token, 10% unchanged)."""

    kind: Literal["masked_lm"] = "masked_lm"
    mlm_probability: float = Field(0.15, gt=0.0, lt=1.0, description="Share of the tokens predicted.")


class SequenceClassificationSettings(TaskSettings):
    """sequence_classification: one label per text; the labels come from the data."""

    kind: Literal["sequence_classification"] = "sequence_classification"


class TokenClassificationSettings(TaskSettings):
    """token_classification: one tag per word; the tags come from the data."""

    kind: Literal["token_classification"] = "token_classification"


class ImageClassificationSettings(TaskSettings):
    """image_classification: one label per image (an image front-end, ``embedding.kind: patches``); the
    labels come from the data. Pixels (0-255) are rescaled by 1/255, then normalised per channel as
    ``(x - image_mean) / image_std`` (ViTImageProcessor's defaults: 0.5, 0.5)."""

    kind: Literal["image_classification"] = "image_classification"
    image_mean: list[float] = Field(
        default_factory=lambda: [0.5], min_length=1, description="Per channel, or one for all."
    )
    image_std: list[Annotated[float, Field(gt=0.0)]] = Field(
        default_factory=lambda: [0.5], min_length=1, description="Per channel, or one for all."
    )


class ChatSettings(TaskSettings):
    """chat: supervised fine-tuning on conversations, the loss on the assistant's turns."""

    kind: Literal["chat"] = "chat"
    train_on_prompt: bool = Field(
        False,
        description="Train on every token of a conversation (system and user turns too), not only on the "
        "assistant's answers and their end-of-turn tokens.",
    )


PREFERENCE_LOSSES = ("sigmoid", "ipo", "hinge", "simpo", "orpo")
REFERENCE_FREE = ("simpo", "orpo")  # the losses that read no reference model (none is built)


class DPOSettings(TaskSettings):
    """dpo: preference pairs; DPO's sigmoid loss against a frozen reference, or a variant (``loss``)."""

    kind: Literal["dpo"] = "dpo"
    loss: Literal["sigmoid", "ipo", "hinge", "simpo", "orpo"] = Field(
        "sigmoid",
        description="sigmoid (DPO), ipo, hinge, simpo or orpo (these two need no reference model).",
    )
    beta: PositiveFloat = Field(
        0.1,
        description="How far the policy may move from the reference (DPO's KL weight); IPO's tau, SimPO's "
        "reward scale, ORPO's lambda (the odds-ratio term's weight).",
    )
    gamma: float | None = Field(
        None,
        ge=0.0,
        description="SimPO's target reward margin (TRL's simpo_gamma); only for loss simpo, default 0.5.",
    )
    nll_coef: float = Field(
        0.0,
        ge=0.0,
        description="This times the chosen response's mean token NLL is added to each pair's loss (RPO; "
        "TRL's rpo_alpha), so the chosen answers' likelihood does not fall with the rejected ones'; 0 = off.",
    )

    @model_validator(mode="after")
    def _settings_of_the_loss(self) -> DPOSettings:
        if self.gamma is not None and self.loss != "simpo":
            raise ValueError(f"task.gamma is SimPO's margin: only for loss simpo, not {self.loss}")
        if self.nll_coef and self.loss == "orpo":
            raise ValueError("task.nll_coef is not for loss orpo: its loss holds the chosen response's NLL")
        return self

    @property
    def simpo_gamma(self) -> float:
        """SimPO's margin, its default (0.5, TRL's) when not given."""
        return 0.5 if self.gamma is None else self.gamma

    @property
    def needs_reference(self) -> bool:
        return self.loss not in REFERENCE_FREE

    def label_smoothing_problem(self, eps: float) -> str | None:
        if eps and self.loss not in ("sigmoid", "simpo"):
            return f"loss.label_smoothing ({eps}) is for dpo losses sigmoid and simpo, not {self.loss}"
        if eps >= 0.5:
            return f"loss.label_smoothing ({eps}) for dpo is a label-flip probability: below 0.5"
        return None


class KTOSettings(TaskSettings):
    """kto: Kahneman-Tversky Optimization on unpaired completions labelled desirable or not, against a
    frozen reference."""

    kind: Literal["kto"] = "kto"
    beta: PositiveFloat = Field(0.1, description="How far the policy may move from the reference.")
    desirable_weight: PositiveFloat = Field(
        1.0, description="The desirable examples' loss weight (lambda_D)."
    )
    undesirable_weight: PositiveFloat = Field(
        1.0, description="The undesirable examples' loss weight (lambda_U)."
    )

    def label_smoothing_problem(self, eps: float) -> str | None:
        return f"loss.label_smoothing ({eps}) is not read by kto" if eps else None


class ContrastiveSettings(TaskSettings):
    """contrastive: an embedding model trained on (anchor, positive[, negative]) pairs with in-batch
    negatives (sentence-transformers' MultipleNegativesRankingLoss, optionally inside MatryoshkaLoss)."""

    kind: Literal["contrastive"] = "contrastive"
    scale: PositiveFloat = Field(20.0, description="Similarities are multiplied by this (1 / temperature).")
    similarity: Literal["cos", "dot"] = Field("cos", description="cos (cosine) or dot (dot product).")
    hard_negatives: int = Field(
        0,
        ge=0,
        le=16,
        description="Hard-negative columns per line: negative (1), or negative_1 ... negative_N (N > 1).",
    )
    matryoshka_dims: tuple[PositiveInt, ...] | None = Field(
        None,
        min_length=1,
        description="MatryoshkaLoss: the loss summed over the vectors cut to each of these widths; null: off.",
    )
    matryoshka_weights: tuple[PositiveFloat, ...] | None = Field(
        None, description="One weight per matryoshka_dims entry; null: 1 each."
    )
    cache_batch: PositiveInt | None = Field(
        None,
        description="GradCache (CachedMultipleNegativesRankingLoss): embed a batch this many texts at a time "
        "(a batch's memory is one mini-batch's); null: the whole batch at once.",
    )

    @model_validator(mode="after")
    def _one_weight_per_dim(self) -> ContrastiveSettings:
        if self.matryoshka_weights is not None and (
            self.matryoshka_dims is None or len(self.matryoshka_weights) != len(self.matryoshka_dims)
        ):
            raise ValueError(
                f"task.matryoshka_weights ({len(self.matryoshka_weights)}) needs one weight per "
                "task.matryoshka_dims entry"
            )
        return self

    def label_smoothing_problem(self, eps: float) -> str | None:
        return f"loss.label_smoothing ({eps}) is not read by contrastive: leave it unset" if eps else None


GRPO_LOSS_TYPES = ("dapo", "grpo", "dr_grpo", "bnpo")


class GRPOSettings(TaskSettings):
    """grpo: Group Relative Policy Optimization, online: ``group_size`` completions of each prompt sampled from
    the policy as it trains, scored by reward functions, each completion's reward compared with its group's."""

    kind: Literal["grpo"] = "grpo"
    rewards: tuple[str, ...] = Field(
        (),
        description='Reward functions, "path/to/file.py:name" or "package.module:name", called as '
        "fn(prompts, completions, **columns) -> one float per completion.",
    )
    reward_weights: tuple[float, ...] | None = Field(
        None, description="One weight per reward function; the reward is their weighted sum. null: 1 each."
    )
    group_size: int = Field(8, ge=2, description="Completions sampled per prompt (TRL's num_generations).")
    max_new_tokens: PositiveInt = Field(
        256, description="Tokens per completion at most (max_completion_length)."
    )
    temperature: float = Field(
        1.0,
        gt=0.0,
        le=2.0,
        description="Sampling temperature (also divides the logits the loss reads, as TRL's).",
    )
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling: 1 = off.")
    top_k: int = Field(0, ge=0, description="Top-k sampling: 0 = off.")
    beta: float = Field(
        0.0, ge=0.0, description="The KL penalty's weight against the frozen reference (k3); 0: no reference."
    )
    epsilon: PositiveFloat = Field(
        0.2, description="The ratio's clip range, below 1 (and above, unless epsilon_high)."
    )
    epsilon_high: PositiveFloat | None = Field(
        None, description="The clip range above 1 (DAPO's); null: epsilon."
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group",
        description="Advantages divided by the group's reward std (group), the batch's, or not (none).",
    )
    loss_type: Literal["dapo", "grpo", "dr_grpo", "bnpo"] = Field(
        "dapo",
        description="How token losses are averaged, as TRL's: dapo (over every completion token of the "
        "optimizer step), grpo (over each completion's tokens, then over completions), dr_grpo (over "
        "completions x max_new_tokens), bnpo (over each micro-batch's completion tokens).",
    )

    @model_validator(mode="after")
    def _one_weight_per_reward(self) -> GRPOSettings:
        if self.reward_weights is not None and len(self.reward_weights) != len(self.rewards):
            raise ValueError(
                f"task.reward_weights ({len(self.reward_weights)}) needs one weight per task.rewards entry "
                f"({len(self.rewards)})"
            )
        for reward in self.rewards:
            if ":" not in reward or not reward.rsplit(":", 1)[1].isidentifier():
                raise ValueError(
                    f'task.rewards: {short_repr(reward)} must be "file.py:function" or "module:function"'
                )
        return self

    @property
    def weights(self) -> tuple[float, ...]:
        return self.reward_weights if self.reward_weights is not None else (1.0,) * len(self.rewards)

    def label_smoothing_problem(self, eps: float) -> str | None:
        return f"loss.label_smoothing ({eps}) is not read by grpo: leave it unset" if eps else None


# The union the config's ``task`` validates into: every task's settings, listed once.
TaskSettingsUnion = Annotated[
    Seq2SeqSettings
    | CausalLMSettings
    | MaskedLMSettings
    | SequenceClassificationSettings
    | TokenClassificationSettings
    | ImageClassificationSettings
    | ChatSettings
    | DPOSettings
    | KTOSettings
    | ContrastiveSettings
    | GRPOSettings,
    Field(discriminator="kind"),
]
SETTINGS: dict[str, type[TaskSettings]] = {
    cls.model_fields["kind"].default: cls for cls in get_args(get_args(TaskSettingsUnion)[0])
}
TASK_KINDS: tuple[str, ...] = tuple(SETTINGS)  # the task names a config accepts


def settings_for(kind: str) -> TaskSettings:
    """Task ``kind``'s settings at their defaults."""
    return SETTINGS[kind](kind=kind)


def normalized(task: Any) -> Any:
    """A config's ``task`` as a mapping: ``dpo`` is ``{kind: dpo}`` (anything else is left to validation)."""
    return {"kind": task} if isinstance(task, str) else task


def task_kind(task: Any) -> str | None:
    """The kind a config's raw ``task`` names (None: none, or not readable as one)."""
    task = normalized(task)
    kind = task.get("kind") if isinstance(task, Mapping) else None
    return kind if isinstance(kind, str) else None


# --- settings at their old places --------------------------------------------------------------------

# Where each setting moved: its old dotted field -> (the task that reads it, its name there).
MOVED: dict[str, tuple[str, str]] = {
    "loss.mlm_probability": ("masked_lm", "mlm_probability"),
    "loss.dpo_beta": ("dpo", "beta"),
    "loss.dpo_nll_coef": ("dpo", "nll_coef"),
    "data.train_on_prompt": ("chat", "train_on_prompt"),
    "eval.bleu": ("seq2seq", "bleu"),
    "eval.bleu_metric": ("seq2seq", "bleu_metric"),
    "eval.bleu_samples": ("seq2seq", "bleu_samples"),
    "eval.num_beams": ("seq2seq", "num_beams"),
    "eval.max_new_tokens": ("seq2seq", "max_new_tokens"),
}
# The tasks an older zoo picked by itself when the config named none that read a moved setting (chat and
# dpo were only ever named).
_PICKED_UNNAMED = ("seq2seq", "masked_lm")


def moved_in(data: Mapping[str, Any]) -> dict[str, Any]:
    """The settings at their old places in a raw config: old dotted field -> value, in `MOVED`'s order."""
    found = {}
    for old in MOVED:
        section, name = old.split(".")
        values = data.get(section)
        if isinstance(values, Mapping) and name in values:
            found[old] = values[name]
    return found


def moved_message(data: Mapping[str, Any], found: Mapping[str, Any]) -> str:
    """One line saying where the settings ``found`` at their old places in ``data`` go, for the config's
    task (else the first they belong to): ``loss.dpo_beta moved: write task: {kind: dpo, beta: 0.2}``,
    keeping the settings the config's task already has."""
    named = task_kind(data.get("task"))
    kinds = [MOVED[old][0] for old in found]
    kind = named if named in kinds else kinds[0]
    olds = [old for old in found if MOVED[old][0] == kind]
    task = dict(normalized(data.get("task"))) if named == kind else {"kind": kind}
    task |= {MOVED[old][1]: found[old] for old in olds}
    other = f" ({kind} settings; this config's task is {named})" if named not in (None, kind) else ""
    return f"{', '.join(olds)} moved: write task: {flow(task)}{other}"


def moved_override(key: str, value: Any, task: Any) -> str | None:
    """One line for an override (``--set``) of a setting at its old place: ``loss.dpo_beta=0.2 moved: set
    task.beta=0.2`` (or ``task={kind: dpo, beta: 0.2}`` when the config names another task or none);
    None when ``key`` did not move."""
    if key not in MOVED:
        return None
    kind, name = MOVED[key]
    new = (
        f"task.{name}={flow(value)}"
        if task_kind(task) == kind
        else f"task={flow({'kind': kind, name: value})}"
    )
    return f"{key}={flow(value)} moved: set {new}"


def translate_saved(data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A ``train_config.yaml`` an older zoo wrote (every setting explicit, some at their old places) as
    this one reads it, and a note on each change: a setting of the config's task goes under ``task``; one
    of a task the run never was is dropped (the older zoo did not read it either), noted when it was not
    at its default. With no task named, a setting away from its default goes under the one task that reads
    it (the run's own: only it read the setting); settings of two tasks there are a ValueError."""
    found = moved_in(data)
    if not found:
        return data, []
    data = {**data}
    for section in {old.split(".")[0] for old in found}:
        data[section] = {k: v for k, v in data[section].items() if f"{section}.{k}" not in MOVED}
    named = task_kind(data.get("task"))
    kept: dict[str, dict[str, Any]] = {}  # kind -> {old field: value}
    notes = []
    for old, value in found.items():
        kind, name = MOVED[old]
        at_default = SETTINGS[kind].model_fields[name].default == value
        if kind == named or (named is None and kind in _PICKED_UNNAMED and not at_default):
            kept.setdefault(kind, {})[old] = value
        elif not at_default:
            notes.append(f"{old}: {flow(value)} dropped (a {kind} setting; the run's task never read it)")
    if len(kept) > 1:
        olds = ", ".join(old for values in kept.values() for old in values)
        kinds = " and ".join(sorted(kept))
        raise ValueError(f"{olds} are settings of {kinds}, and no task is named: name the run's task")
    for kind, values in kept.items():
        task = {**normalized(data.get("task") or {"kind": kind})}
        task |= {MOVED[old][1]: value for old, value in values.items()}
        how = "" if named else f" (the only task that reads {'it' if len(values) == 1 else 'them'})"
        notes.append(f"{', '.join(values)} read as task: {flow(task)}{how}")
        data["task"] = task
    return data, notes


def flow(value: Any) -> str:
    """``value`` as YAML on one line, ``{kind: dpo, beta: 0.2}``, ``0.2``, ``null``: a mapping's first
    entries and short scalars; anything else (a config's value may be a huge list) as a bounded repr."""
    if isinstance(value, Mapping):
        shown = [f"{_scalar(key)}: {_scalar(item)}" for key, item in list(value.items())[:_MAX_SHOWN]]
        return "{" + ", ".join(shown + (["..."] if len(value) > _MAX_SHOWN else [])) + "}"
    return _scalar(value)


_MAX_SHOWN = 8


def _scalar(value: Any) -> str:
    if (
        value is None
        or isinstance(value, bool | int | float)
        or (isinstance(value, str) and len(value) <= 60)
    ):
        if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 100:
            return short_repr(value)
        text = yaml.safe_dump([value], default_flow_style=True, width=10**6).strip()
        return text[1:-1]  # without the list's brackets
    return short_repr(value)
