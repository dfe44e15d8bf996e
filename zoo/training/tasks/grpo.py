"""Group Relative Policy Optimization (``task: grpo``; Shao et al. 2024, arXiv:2402.03300), as TRL's
``GRPOTrainer`` defines it, on a decoder: online reinforcement learning from reward functions.

Raw data is JSON lines, one prompt a line: a string (continued as it is, after bos), or chat messages (rendered
by the tokenizer's chat template with the assistant's turn opened, as ``task: chat`` renders a prompt). Every
other key is a column the reward functions receive (`zoo.training.rewards`):

    {"prompt": [{"role": "user", "content": "What is 3 plus 4?"}], "answer": 7}
    {"prompt": "The capital of France is", "answer": "Paris"}

Prepared data holds each prompt's token ids (side ``prompt``) and its JSON line (side ``record``, UTF-8
bytes). Each step, for a batch of P prompts (``batch.max_sentences`` caps P; a prompt costs ``group_size`` x
(its length + ``max_new_tokens``) of ``batch.max_tokens``):

    rollout    G = group_size completions of each prompt sampled from the policy as it now is, through the
               serving engine in this process (`zoo.training.rollouts`); seeded from the batch's place in
               the run, so a resumed run samples what the straight one did
    rewards    each reward function on the R = P x G completions, their weighted sum r (weights:
               ``reward_weights``); advantages A = (r - group mean) / (group std + 1e-4)
               (`zoo.losses.grpo.group_advantages`; ``scale_rewards``)
    loss       per completion token, the clipped surrogate plus beta x k3 against the reference
               (`zoo.losses.grpo.grpo_token_losses`), averaged as ``loss_type`` says (TRL's):

    loss_type  what the token losses of an optimizer step are averaged over
    dapo       every completion token of the step, on every process (TRL's default): one long completion
               weighs as much as its tokens
    grpo       each completion's tokens, then the step's completions (the paper's; favours short correct
               answers and long wrong ones)
    dr_grpo    the step's completions x max_new_tokens (a constant)
    bnpo       each micro-batch's completion tokens, then the micro-batches

Each rollout is trained on once (TRL's ``num_iterations`` 1): the ratio's "old" policy is the policy itself,
detached, so the ratio is 1 and the clip never binds in value, but its gradient is the policy gradient
A x grad log pi. Log-probabilities read logits divided by ``temperature``, as TRL's do.

The reference (``beta`` > 0) is the weights the run started from, frozen: under ``lora`` the same model with
its adapters disabled (no copy), else a frozen copy of ``model.init_from`` (a second set of weights in
memory, as TRL's); ``beta: 0`` (TRL's default) builds none. The KV cache of a rollout is held only while it
samples. Logged per step (means over the completions of each micro-batch, weighted by its units):
``reward``, ``reward_std`` (within groups), ``rewards/NAME`` (each function, unweighted),
``completion_length``, ``clip_ratio``, and ``kl`` with a reference.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from zoo.generation.chat import end_of_turn_ids
from zoo.io.tokenizer import ChatTemplateError, Tokenizer
from zoo.losses import IGNORE_INDEX
from zoo.losses.grpo import group_advantages, grpo_token_losses
from zoo.spec import DecoderSpec, ModelSpec
from zoo.training.batching import Batch
from zoo.training.config import ConfigError, DataConfig
from zoo.training.data import DataError
from zoo.training.data.prepare import tokenizer_fingerprint
from zoo.training.data.shards import SideInfo
from zoo.training.data.sources import OnBadLine, ReadStats, Record, Source
from zoo.training.objectives import Objective, ObjectiveSums
from zoo.training.rewards import Rewards
from zoo.training.rollouts import Sampling, sample
from zoo.training.task_settings import GRPOSettings
from zoo.training.tasks.base import (
    Encode,
    LengthCuts,
    Limits,
    Split,
    Task,
    Tokenizers,
    Units,
    measured_units,
    pad,
    raw_ids,
    rows,
)
from zoo.training.tasks.chat import ROLES, chat_template
from zoo.training.tasks.jsonl import parsed_lines
from zoo.training.tasks.reference import frozen_reference, reference_mode
from zoo.training.tasks.responses import response_targets

if TYPE_CHECKING:
    from zoo.models.base import ZooModel


class GRPO(Task):
    name = "grpo"
    settings_type = GRPOSettings
    settings: GRPOSettings
    family = "decoder"
    sides: ClassVar[tuple[str, ...]] = ("prompt", "record")
    fields: ClassVar[tuple[str, ...]] = ("json",)  # the raw line; `records` checks it

    # -- the model -------------------------------------------------------------------------------------------

    @classmethod
    def natural_for(cls, spec: ModelSpec) -> bool:
        return False  # a decoder trains on causal_lm unless the config names grpo

    def check_model(self, spec: ModelSpec, *, where: str) -> None:
        if isinstance(spec, DecoderSpec) and spec.lm_head is None:
            raise ConfigError("task grpo needs an LM head; the spec has lm_head: null")

    # -- tokenizers --------------------------------------------------------------------------------------

    def tokenizer_lines(self, records: Iterator[Record], *, side: str) -> Iterator[str]:
        for record in records:  # the prompts' text, as zoo's default template writes each message
            prompt = json.loads(_line(record))["prompt"]
            if isinstance(prompt, str):
                yield prompt
            else:
                yield from (f"{m['role']}: {m['content']}" for m in prompt)

    # -- data --------------------------------------------------------------------------------------------

    def check_data(self, data: DataConfig) -> None:
        super().check_data(data)
        self.refuse_parallel_files(
            data, "data: grpo reads JSON lines {prompt, ...}, not {source, target} files"
        )
        if not self.settings.rewards:
            raise ConfigError('task.rewards: grpo needs at least one reward function, "file.py:function"')

    def source(self, files: Path | Any, *, on_bad_line: OnBadLine = "error") -> Source:
        return Source("text", (files,), fields=self.fields, on_bad_line=on_bad_line)

    def records(self, source: Source, *, stats: ReadStats | None = None) -> Iterator[Record]:
        return parsed_lines(source, task="grpo", stats=stats, parse=lambda r, line: _problem(line) or r)

    def side_infos(self, tokenizers: Tokenizers, *, info: Mapping[str, Any]) -> dict[str, SideInfo]:
        return {**super().side_infos(tokenizers, info=info), "record": SideInfo(dtype="uint8")}

    def tokenizer_of(self, side: str, tokenizers: Tokenizers) -> Tokenizer | None:
        return tokenizers.target if side == "prompt" else None

    def frame_tokenizer(self, tokenizer: Tokenizer) -> Tokenizer:
        """The tokenizer with the template its chat prompts are rendered by (zoo's default when it has none),
        written into the run's model folder, as chat's."""
        if tokenizer.chat_template is None:
            tokenizer.chat_template = tokenizer.default_chat_template
        return tokenizer

    def fingerprint(self, side: str, tokenizers: Tokenizers) -> str | None:
        if side != "prompt":
            return None
        tok = tokenizers.target  # the template renders chat prompts: it changes the ids too (as chat's)
        both = f"{tokenizer_fingerprint(tok)}\n{chat_template(tok)}"
        return "sha256:" + hashlib.sha256(both.encode("utf-8")).hexdigest()

    def encoder(
        self, tokenizers: Tokenizers, *, cuts: LengthCuts | None, labels: Sequence[str] = ()
    ) -> Encode:
        """Prompts -> ids (a chat prompt rendered, bos and all, by the template; a string after bos); the
        JSON line kept whole. Prompts are not cut here: a batch keeps a too-long prompt's end (`units`)."""
        tok = tokenizers.target
        template = chat_template(tok)

        def encode(records: list[Record]) -> dict[str, list[Any]]:
            objects = [json.loads(_line(r)) for r in records]
            texts = []
            for record, obj in zip(records, objects):
                prompt = obj["prompt"]
                if isinstance(prompt, str):
                    texts.append(prompt)
                    continue
                try:
                    text = tok.apply_chat_template(
                        prompt, chat_template=template, add_generation_prompt=True, tokenize=False
                    )
                except ChatTemplateError as error:
                    raise DataError(
                        f"{record.origin}: the chat template cannot render the prompt: {error}"
                    ) from None
                assert isinstance(text, str)
                texts.append(text)
            ids = raw_ids(tok, texts)
            bos = [tok.bos_id] if tok.bos_id is not None else []
            ids = [i if isinstance(o["prompt"], list) else [*bos, *i] for i, o in zip(ids, objects)]
            return {"prompt": ids, "record": [list(_line(r).encode("utf-8")) for r in records]}

        return encode

    def framed_sides(self, tokenizers: Tokenizers) -> dict[str, int]:
        return {"prompt": 0}  # the encoder framed it (bos, or the template's)

    def units(self, split: Split, *, tokenizers: Tokenizers, limits: Limits) -> Units:
        """One unit per prompt, costing ``group_size`` rows of its length + ``max_new_tokens``; a prompt
        whose rows would pass the length limit is cut from its start (``data.too_long: truncate``, TRL's
        left truncation: the end holds the question and the generation prompt), skipped or refused."""
        data, settings = split.data, self.settings
        if limits.max_length <= settings.max_new_tokens:
            raise ConfigError(
                f"task.max_new_tokens ({settings.max_new_tokens}) leaves no room for a prompt within the length "
                f"limit ({limits.max_length}: data.max_length or the model's max_positions)"
            )

        def measure(start: int, stop: int) -> np.ndarray:
            return (data.read_lengths("prompt", start, stop).astype(np.int64) + settings.max_new_tokens)[
                :, None
            ]

        one = measured_units(split, measure, columns=1, limits=limits)
        return Units(one.lengths.astype(np.int64) * settings.group_size, one.examples, one.name)

    def collator(
        self,
        split: Split,
        units: Units,
        *,
        spec: ModelSpec,
        tokenizers: Tokenizers,
        limits: Limits,
    ) -> PromptCollator:
        assert spec.pad_token_id is not None  # wire_spec refuses a spec without one
        return PromptCollator(
            split,
            units,
            tokenizer=tokenizers.target,
            pad_id=spec.pad_token_id,
            max_length=limits.max_length,
            max_new_tokens=self.settings.max_new_tokens,
        )

    # -- loss --------------------------------------------------------------------------------------------

    def label_smoothing(self, eps: float | None) -> float:
        return 0.0  # refused by the settings when given

    def objective(
        self,
        spec: ModelSpec,
        *,
        label_smoothing: float | None,
        model: ZooModel,
        starting_model: Callable[[], ZooModel],
        chunk_tokens: int | None = None,
    ) -> GroupRelative:
        settings = self.settings
        reference: nn.Module | None = None
        adapters = False
        if settings.beta:  # beta 0 reads no reference: none built
            reference, adapters = frozen_reference(model, starting_model)
        return GroupRelative(settings, policy=model, reference=reference, adapters=adapters)


def _line(record: Record) -> str:
    line = record.fields["json"]
    assert isinstance(line, str)  # a text source's one field
    return line


def _problem(line: str) -> str | None:
    """What is wrong with a JSON line of prompts (None: nothing)."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as error:
        return f"not JSON ({error.msg})"
    if not isinstance(obj, dict) or "prompt" not in obj:
        return 'expected a JSON object with a "prompt"'
    prompt = obj["prompt"]
    if isinstance(prompt, str):
        return None if prompt else "'prompt' is empty"
    if not isinstance(prompt, list) or not prompt:
        return "'prompt' must be a string or a non-empty list of {role, content} messages"
    for i, message in enumerate(prompt):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            return f"prompt[{i}].role must be one of {', '.join(ROLES)}"
        if not isinstance(message.get("content"), str):
            return f"prompt[{i}].content must be a string"
    return None


# --- batches -----------------------------------------------------------------------------------------------


@dataclass
class PromptBatch(Batch):
    """P prompts to sample completions of: ``inputs`` holds them right-padded (P, T); ``records`` their JSON
    lines; ``seed`` the rollout's seed, drawn from the batch's generator (a function of its place in the run)."""

    prompts: list[list[int]] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    chat: list[bool] = field(default_factory=list)
    seed: int = 0
    tokenizer: Tokenizer | None = None
    pad_id: int = 0
    max_length: int = 0


@dataclass
class RolloutBatch(Batch):
    """R = P x G prompt + completion rows, right-padded (R, T); ``targets`` the completion tokens (the end
    token included), -100 elsewhere; ``advantages`` (R,); ``metrics`` the rollout's means (rewards, lengths)."""

    advantages: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    metrics: dict[str, float] = field(default_factory=dict)


class PromptCollator:
    """Prompt units -> a `PromptBatch`; a prompt over ``max_length - max_new_tokens`` keeps its end."""

    def __init__(
        self,
        split: Split,
        units: Units,
        *,
        tokenizer: Tokenizer,
        pad_id: int,
        max_length: int,
        max_new_tokens: int,
    ) -> None:
        self.data, self.units, self.tokenizer = split.data, units, tokenizer
        self.pad_id, self.max_length = pad_id, max_length
        self.room = max_length - max_new_tokens

    def __call__(self, units: np.ndarray, *, generator: torch.Generator | None = None) -> PromptBatch:
        examples = self.units.example_indices(units)
        prompts = [row[-self.room :] for row in rows(self.data, examples, "prompt")]
        records = [json.loads(bytes(row).decode("utf-8")) for row in rows(self.data, examples, "record")]
        ids, mask = pad(prompts, self.pad_id)  # (P, T)
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator)) if generator is not None else 0
        return PromptBatch(
            {"input_ids": ids, "attention_mask": mask},
            torch.full_like(ids, IGNORE_INDEX),
            int(mask.sum()),
            prompts=prompts,
            records=records,
            chat=[isinstance(r["prompt"], list) for r in records],
            seed=seed,
            tokenizer=self.tokenizer,
            pad_id=self.pad_id,
            max_length=self.max_length,
        )


# --- the objective -----------------------------------------------------------------------------------------


class GroupRelative(Objective):
    """GRPO's objective: `rollout` samples and scores each prompt batch's completions; the call computes the
    clipped surrogate with the KL penalty per token and sums it in the units of ``loss_type``."""

    loss_name = "GRPO"

    def __init__(
        self,
        settings: GRPOSettings,
        *,
        policy: nn.Module,
        reference: nn.Module | None,
        adapters: bool,
        rewards: Rewards | None = None,
    ) -> None:
        self.settings, self.policy, self.reference, self.adapters = settings, policy, reference, adapters
        self.rewards = rewards if rewards is not None else Rewards(settings.rewards, settings.weights)
        self.epsilon_high = settings.epsilon_high if settings.epsilon_high is not None else settings.epsilon
        self.unit = {"dapo": "completion token", "grpo": "completion", "dr_grpo": "completion x max_new_tokens",
                     "bnpo": "micro-batch"}[settings.loss_type]  # fmt: skip
        kl = f" + {settings.beta:g} x k3 KL to the reference" if settings.beta else ""
        self.description = (
            f"training objective per {self.unit}: GRPO's clipped surrogate (epsilon {settings.epsilon:g}"
            f"{'' if self.epsilon_high == settings.epsilon else f'/{self.epsilon_high:g}'}){kl}, loss_type "
            f"{settings.loss_type}, {settings.group_size} completions per prompt, rewards "
            + ", ".join(f"{w:g} x {n}" for w, n in zip(settings.weights, self.rewards.names))
        )
        self.validation_description = (
            f"validation GRPO loss per {self.unit} (fresh completions, as in training)"
        )

    # -- the rollout ---------------------------------------------------------------------------------------

    def rollout(self, batch: Batch, *, device: torch.device) -> Batch:
        if not isinstance(batch, PromptBatch):
            return batch
        settings, tokenizer = self.settings, batch.tokenizer
        assert tokenizer is not None
        G = settings.group_size
        prompts = [p for p in batch.prompts for _ in range(G)]  # (R,) a prompt's group consecutive
        seeds = np.random.SeedSequence(batch.seed).generate_state(len(prompts), np.uint32).tolist()
        # with a chat prompt in the batch every answer also stops at the template's end-of-turn token (a
        # special token a plain-text continuation does not write)
        chat = any(batch.chat)
        stop = end_of_turn_ids(tokenizer) if chat else ()
        sampled = sample(
            self.policy,
            tokenizer,
            prompts,
            seeds,
            Sampling(settings.max_new_tokens, settings.temperature, settings.top_p, settings.top_k),
            stop_token_ids=stop,
            max_length=batch.max_length,
            continues_prompt=not chat,
        )
        ends = set(stop) | ({tokenizer.eos_id} if tokenizer.eos_id is not None else set())
        completions = [list(s.token_ids) for s in sampled]
        texts = [tokenizer.decode([t for t in c if t not in ends]) for c in completions]
        records = [r for r in batch.records for _ in range(G)]
        columns = {key: [r.get(key) for r in records] for key in records[0] if key != "prompt"}
        rewards, each = self.rewards.score([r["prompt"] for r in records], texts, columns)  # (R,), (R, F)
        advantages = group_advantages(rewards, G, scale=settings.scale_rewards)  # (R,)
        ids, mask = pad([[*p, *c] for p, c in zip(prompts, completions)], batch.pad_id)  # (R, T)
        targets = response_targets(ids, mask, [len(p) for p in prompts])  # (R, T): the completions'
        lengths = torch.tensor([len(c) for c in completions], dtype=torch.float32)
        metrics = {
            "reward": float(rewards.mean()),
            "reward_std": float(rewards.view(-1, G).std(dim=1).mean()),
            "completion_length": float(lengths.mean()),
        }
        for f, name in enumerate(self.rewards.names):
            metrics[f"rewards/{name}"] = float(each[:, f].nanmean())
        return RolloutBatch(
            {"input_ids": ids, "attention_mask": mask},
            targets,
            int(mask.sum()),
            advantages=advantages,
            metrics=metrics,
        )

    # -- the loss ------------------------------------------------------------------------------------------

    def count(self, batch: Batch) -> int:
        assert isinstance(batch, RolloutBatch), "GRPO's batches are sampled first (Objective.rollout)"
        rows_ = batch.targets.shape[0]
        loss_type = self.settings.loss_type
        if loss_type == "dapo":
            return int((batch.targets != IGNORE_INDEX).sum())
        if loss_type == "grpo":
            return rows_
        if loss_type == "dr_grpo":
            return rows_ * self.settings.max_new_tokens
        return 1  # bnpo: the micro-batch's mean

    def token_log_probs(
        self, model: nn.Module, batch: Batch, scored: torch.Tensor, targets: torch.Tensor, autocast: Any
    ) -> tuple[Any, torch.Tensor]:
        """``model``'s output and (N,) log-probabilities of the scored targets, logits / temperature."""
        with autocast or nullcontext():
            out = model(**batch.inputs, logits_mask=scored)
        logits = out.logits.to(torch.promote_types(out.logits.dtype, torch.float32))  # (N, V)
        return out, -F.cross_entropy(logits / self.settings.temperature, targets, reduction="none")

    @torch.no_grad()
    def reference_log_probs(
        self, batch: Batch, scored: torch.Tensor, targets: torch.Tensor, autocast: Any
    ) -> torch.Tensor:
        model = self.reference
        assert model is not None
        with reference_mode(model, adapters=self.adapters):
            return self.token_log_probs(model, batch, scored, targets, autocast)[1]

    def __call__(
        self,
        model: nn.Module,
        batch: Batch,
        *,
        device: torch.device,
        autocast: AbstractContextManager | None = None,
        train: bool = True,
    ) -> ObjectiveSums:
        assert isinstance(batch, RolloutBatch), "GRPO's batches are sampled first (Objective.rollout)"
        settings = self.settings
        scored = batch.logits_mask()  # (R, T) on the CPU: the completion positions
        assert scored is not None
        R = scored.shape[0]
        row = scored.nonzero()[:, 0].to(device, non_blocking=True)  # (N,) each scored position's row
        targets = batch.scored_targets(scored).to(device, non_blocking=True)  # (N,)
        advantages = batch.advantages.to(device)
        units = self.count(batch)
        on_device = batch.to(device)
        reference = (
            self.reference_log_probs(on_device, scored, targets, autocast)
            if self.reference is not None
            else None
        )
        out, log_probs = self.token_log_probs(model, on_device, scored, targets, autocast)  # (N,)
        terms = grpo_token_losses(
            log_probs,
            log_probs.detach(),  # each rollout trained on once: pi_old is the policy as it sampled
            advantages[row],
            epsilon_low=settings.epsilon,
            epsilon_high=self.epsilon_high,
            reference_log_probs=reference,
            beta=settings.beta,
        )
        losses, N = terms.losses, terms.losses.shape[0]
        if settings.loss_type == "grpo":  # each completion's mean token loss; counted per completion
            per_row = losses.new_zeros(R).index_add(0, row, losses)  # (R,)
            loss = (per_row / scored.sum(dim=1).clamp(min=1).to(device)).sum()
        elif settings.loss_type == "bnpo":  # the micro-batch's mean token loss; counted once
            loss = losses.sum() / max(N, 1)
        else:  # dapo, dr_grpo: the sum, counted per token or per completion x max_new_tokens
            loss = losses.sum()
        # Means over this micro-batch, weighted by its units: the records divide by the units
        metrics = {name: torch.tensor(value * units) for name, value in batch.metrics.items()}
        metrics["clip_ratio"] = terms.clipped.float().mean() * units
        if terms.kl is not None:
            metrics["kl"] = terms.kl.mean() * units
        return ObjectiveSums(loss=loss, aux_loss=out.aux_loss if train else None, metrics=metrics)

    def summary(self, loss: float, count: int, metrics: Mapping[str, float]) -> dict[str, Any]:
        return {**super().summary(loss, count, metrics), "val_ppl": None}
