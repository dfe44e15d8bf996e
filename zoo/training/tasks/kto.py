"""Kahneman-Tversky Optimization (Ethayarajh et al. 2024, arXiv:2402.01306) on a decoder: unpaired
completions, each labelled desirable or not, against a frozen reference, as TRL's ``KTOTrainer`` computes it.

Raw data is JSON lines, one completion a line, its label a JSON boolean:

    {"prompt": "Name a colour.", "completion": " Red.", "label": true}
    {"prompt": "Name a colour.", "completion": " Colours are hard to name.", "label": false}

Prepared data has the sides ``prompt`` and ``completion`` (raw ids, encoded as dpo's) and ``label`` (one
integer each, 1 = desirable). An example's sequence is framed as dpo frames one (``bos`` prompt completion
``eos``, only the completion scored). A batch of B examples holds 2B rows: the B examples, then B
mismatched ones, prompt i with completion i - 1 (rotated within the batch: TRL's KL dataset), whose
log-ratio under policy and reference estimates the reference point z0 (TRL's ``kl``):

    z0 = max(0, mean over the batch's mismatched rows of (log pi(y_{i-1}|x_i) - log pi_ref(y_{i-1}|x_i)))

taken without a gradient. z0 is the micro-batch's own: TRL's is also per batch, but it averages it over the
processes (``gather``) where zoo does not; with one process and no accumulation the two are the same. The
loss per example (`zoo.losses.preference.kto_loss`) is ``w_D (1 - sigmoid(beta (r - z0)))`` for a desirable
one and ``w_U (1 - sigmoid(beta (z0 - r)))`` for an undesirable one, r its log-ratio; it is summed over the
examples and the loop divides by the examples of the step (TRL's mean over the batch).

A unit costs two rows of its own framed length (its matched and mismatched rows); a mismatched row may be
longer, at most the batch's longest prompt plus its longest completion (cut at the length limit, eos kept).
The reference is dpo's: the model with its LoRA adapters disabled, or a frozen copy of the starting weights.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import nn

import zoo.lora
from zoo.io.tokenizer import Tokenizer
from zoo.losses import IGNORE_INDEX
from zoo.losses.preference import kto_loss
from zoo.spec import DecoderSpec, ModelSpec
from zoo.training.batching import Batch
from zoo.training.config import ConfigError, DataConfig
from zoo.training.data import DataError
from zoo.training.data.shards import SideInfo
from zoo.training.data.sources import OnBadLine, ReadStats, Record, Source, iter_records
from zoo.training.objectives import ObjectiveSums
from zoo.training.task_settings import KTOSettings
from zoo.training.tasks.base import (
    Encode,
    Framing,
    LengthCuts,
    Limits,
    Split,
    Task,
    Tokenizers,
    Units,
    cut_texts,
    field_text,
    measured_units,
    pad,
    raw_ids,
    rows,
)
from zoo.training.tasks.dpo import SequenceScores, frozen
from zoo.training.tasks.language_model import framing

if TYPE_CHECKING:
    from zoo.models.base import ZooModel

LABELS = {"true": 1, "false": 0}


class KTO(Task):
    name = "kto"
    settings_type = KTOSettings
    settings: KTOSettings
    family = "decoder"
    sides: ClassVar[tuple[str, ...]] = ("prompt", "completion", "label")
    fields: ClassVar[tuple[str, ...]] = ("prompt", "completion", "label")
    chunks_loss = True

    @classmethod
    def natural_for(cls, spec: ModelSpec) -> bool:
        return False  # a decoder trains on causal_lm unless the config names kto

    def check_model(self, spec: ModelSpec, *, where: str) -> None:
        if isinstance(spec, DecoderSpec) and spec.lm_head is None:
            raise ConfigError("task kto needs an LM head; the spec has lm_head: null")

    # -- data --------------------------------------------------------------------------------------------

    def check_data(self, data: DataConfig) -> None:
        super().check_data(data)
        self.refuse_parallel_files(
            data, "data: kto reads JSON lines {prompt, completion, label}, not {source, target} files"
        )

    def source(self, files: Path | Any, *, on_bad_line: OnBadLine = "error") -> Source:
        return Source("jsonl", (files,), fields=self.fields, on_bad_line=on_bad_line)

    def records(self, source: Source, *, stats: ReadStats | None = None) -> Iterator[Record]:
        for record in iter_records(source, stats=stats):  # a missing key, null or empty text: bad lines there
            fields = record.fields
            wrong = next(
                (name for name in ("prompt", "completion") if not isinstance(fields[name], str)), None
            )
            if wrong is None and fields["label"] in LABELS:
                yield record
                continue
            message = (
                f"{record.origin}: {wrong!r} must be a string, found a list"
                if wrong is not None
                else f"{record.origin}: 'label' must be true or false, found {str(fields['label'])[:40]!r}"
            )
            if source.on_bad_line == "error":
                raise DataError(f"{message} (on_bad_line: skip passes over bad lines, counting them)")
            if stats is not None:
                stats.add(message)

    def tokenizer_lines(self, records: Iterator[Record], *, side: str) -> Iterator[str]:
        for record in records:  # the texts only: a tokenizer trained here never sees the labels
            yield field_text(record, "prompt")
            yield field_text(record, "completion")

    def side_infos(self, tokenizers: Tokenizers, *, info: Mapping[str, Any]) -> dict[str, SideInfo]:
        return {**super().side_infos(tokenizers, info=info), "label": SideInfo(kind="scalar", vocab_size=2)}

    def tokenizer_of(self, side: str, tokenizers: Tokenizers) -> Tokenizer | None:
        return None if side == "label" else tokenizers.target

    def encoder(
        self, tokenizers: Tokenizers, *, cuts: LengthCuts | None, labels: Sequence[str] = ()
    ) -> Encode:
        tokenizer, extra = tokenizers.target, framing(tokenizers).extra

        def encode(records: list[Record]) -> dict[str, list[Any]]:
            over: set[int] = set()
            ids: dict[str, list[Any]] = {}
            for side in ("prompt", "completion"):
                texts, cut = cut_texts([field_text(r, side) for r in records], tokenizer, cuts)
                ids[side] = raw_ids(tokenizer, texts)
                over.update(cut)
            label = [LABELS[field_text(r, "label")] for r in records]
            if cuts is None:
                return {**ids, "label": label}
            prompts = ids["prompt"]  # the limit holds prompt + completion: cut as one, its end first
            joined = [[*p, *c] for p, c in zip(prompts, ids["completion"])]
            cuts.apply(records, [(joined, extra)], over, trains=lambda i: len(joined[i]) > len(prompts[i]))
            kept: dict[str, list[Any]] = {"prompt": [], "completion": [], "label": []}
            for i, prompt in enumerate(prompts):
                whole = joined[i]
                kept["prompt"].append(None if whole is None else whole[: len(prompt)])
                kept["completion"].append(None if whole is None else whole[len(prompt) :])
                kept["label"].append(None if whole is None else label[i])
            return kept

        return encode

    def framed_sides(self, tokenizers: Tokenizers) -> dict[str, int]:
        frame = framing(tokenizers)
        return {"prompt": frame.bos is not None, "completion": frame.eos is not None}

    def units(self, split: Split, *, tokenizers: Tokenizers, limits: Limits) -> Units:
        """One unit per example, costing two rows (its own and a mismatched one) of its framed length."""
        data, frame = split.data, framing(tokenizers)
        extra, bos = frame.extra, int(frame.bos is not None)

        def measure(start: int, stop: int) -> np.ndarray:
            prompt = data.read_lengths("prompt", start, stop).astype(np.int64)
            length = prompt + data.read_lengths("completion", start, stop) + extra  # (n,)
            return np.stack([length, length], axis=1)  # (n, 2)

        def trains(examples: np.ndarray) -> np.ndarray:  # the cut leaves a completion token
            if frame.eos is None:
                return np.ones(len(examples), dtype=bool)
            offsets = data.offsets("prompt")
            prompt = offsets[examples + 1] - offsets[examples]  # (n,)
            return bos + prompt + 1 < limits.max_length

        return measured_units(split, measure, columns=2, limits=limits, trains=trains)

    def collator(
        self,
        split: Split,
        units: Units,
        *,
        spec: ModelSpec,
        tokenizers: Tokenizers,
        limits: Limits,
    ) -> UnpairedCollator:
        assert spec.pad_token_id is not None  # wire_spec refuses a spec without one
        return UnpairedCollator(
            split, units, framing=framing(tokenizers), pad_id=spec.pad_token_id, max_length=limits.max_length
        )

    # -- loss --------------------------------------------------------------------------------------------

    def objective(
        self,
        spec: ModelSpec,
        *,
        label_smoothing: float | None,
        model: ZooModel,
        starting_model: Callable[[], ZooModel],
        chunk_tokens: int | None = None,
    ) -> KahnemanTversky:
        s = self.settings
        options: dict[str, Any] = {
            "beta": s.beta,
            "desirable_weight": s.desirable_weight,
            "undesirable_weight": s.undesirable_weight,
            "chunk_tokens": chunk_tokens,
        }
        if zoo.lora.adapter_modules(model):  # LoRA: the base is the trained model with its adapters disabled
            return KahnemanTversky(model, adapters=True, **options)
        return KahnemanTversky(frozen(starting_model()), adapters=False, **options)


# --- batches -----------------------------------------------------------------------------------------------


class LabelledBatch(Batch):
    """A `Batch` that also carries each example's label: ``desirable`` (B,) bool, on the host."""

    def __init__(
        self, inputs: dict[str, torch.Tensor], targets: torch.Tensor, num_tokens: int, desirable: torch.Tensor
    ) -> None:
        super().__init__(inputs, targets, num_tokens)
        self.desirable = desirable


class UnpairedCollator:
    """Units -> a `LabelledBatch` of 2B rows: the B examples, then B mismatched rows (prompt i with the
    completion of example i - 1 in the batch), right-padded; targets at the completion positions (and eos)."""

    def __init__(self, split: Split, units: Units, *, framing: Framing, pad_id: int, max_length: int) -> None:
        self.data, self.units, self.framing = split.data, units, framing
        self.pad_id, self.max_length = pad_id, max_length

    def __call__(self, units: np.ndarray, *, generator: torch.Generator | None = None) -> LabelledBatch:
        examples = self.units.example_indices(units)
        prompts = rows(self.data, examples, "prompt")
        completions = rows(self.data, examples, "completion")
        mismatched = (
            completions[-1:] + completions[:-1]
        )  # TRL's KL rows: each prompt, the previous completion
        bos = self.framing.bos is not None
        sequences, starts = [], []
        for side in (completions, mismatched):
            for prompt, completion in zip(prompts, side):
                framed = self.framing([*prompt, *completion], self.max_length)
                sequences.append(framed)
                starts.append(
                    min(bos + len(prompt), len(framed) - 1)
                )  # first completion token (eos at least)
        ids, mask = pad(sequences, self.pad_id)  # (2B, T)
        start = torch.tensor(starts)  # (2B,)
        position = torch.arange(1, ids.shape[1])  # (T - 1,)
        scored = mask[:, 1:].bool() & (position[None, :] >= start[:, None])  # (2B, T - 1)
        targets = torch.full_like(ids, IGNORE_INDEX)  # (2B, T): position t predicts token t + 1
        targets[:, :-1] = torch.where(scored, ids[:, 1:], IGNORE_INDEX)
        desirable = torch.from_numpy(self.data.values("label")[examples].astype(np.int64)).bool()  # (B,)
        inputs = {"input_ids": ids, "attention_mask": mask}
        return LabelledBatch(inputs, targets, int(mask.sum()), desirable)


# --- the objective -----------------------------------------------------------------------------------------


class KahnemanTversky(SequenceScores):
    """KTO's loss per example (`zoo.losses.preference.kto_loss`), the reference point z0 from the batch's
    mismatched rows (no gradient). Metrics, means over the examples: ``kl`` (z0), ``rewards/signed`` (beta
    x the log-ratio, negated for undesirable examples: rising as the policy learns), ``rewards/accuracy``
    (the share whose log-ratio has its label's sign: positive when desirable, negative when not)."""

    unit = "example"
    loss_name = "KTO"

    def __init__(
        self,
        reference: nn.Module,
        *,
        adapters: bool,
        beta: float,
        desirable_weight: float = 1.0,
        undesirable_weight: float = 1.0,
        chunk_tokens: int | None = None,
    ) -> None:
        self.reference, self.adapters, self.chunk_tokens = reference, adapters, chunk_tokens
        self.beta, self.desirable_weight, self.undesirable_weight = beta, desirable_weight, undesirable_weight
        self.description = (
            f"training objective per example: KTO's loss, beta {beta:g}, weights {desirable_weight:g} "
            f"(desirable) and {undesirable_weight:g} (undesirable), z0 from the batch's mismatched pairs"
        )
        self.validation_description = "validation KTO loss per example (as in training)"

    def count(self, batch: Batch) -> int:
        return batch.targets.shape[0] // 2  # examples: a matched and a mismatched row each

    def __call__(
        self,
        model: nn.Module,
        batch: Batch,
        *,
        device: torch.device,
        autocast: AbstractContextManager | None = None,
        train: bool = True,
    ) -> ObjectiveSums:
        assert isinstance(batch, LabelledBatch)  # an UnpairedCollator's
        desirable = batch.desirable.to(device, non_blocking=True)  # (B,)
        scored = batch.logits_mask()  # (2B, T) on the CPU
        assert scored is not None
        count = scored.shape[0] // 2
        row = scored.nonzero()[:, 0].to(device, non_blocking=True)  # (N,)
        targets = batch.scored_targets(scored).to(device, non_blocking=True)  # (N,)
        moved = batch.to(device)
        reference = self.reference_log_probs(moved, scored, targets, row, autocast=autocast)  # (2B,)
        out, policy = self.log_probs(model, moved, scored, targets, row, autocast=autocast)  # (2B,)
        kl = (policy[count:] - reference[count:]).detach().mean().clamp(min=0)  # z0: TRL's batch estimate
        result = kto_loss(
            policy[:count],
            reference[:count],
            desirable,
            kl,
            beta=self.beta,
            desirable_weight=self.desirable_weight,
            undesirable_weight=self.undesirable_weight,
        )
        signed = torch.where(desirable, result.rewards, -result.rewards)  # (B,)
        metrics = {
            "kl": result.kl * count,
            "rewards/signed": signed.sum(),
            "rewards/accuracy": (signed > 0).float().sum(),
        }
        return ObjectiveSums(
            loss=result.losses.sum(), aux_loss=out.aux_loss if train else None, metrics=metrics
        )
