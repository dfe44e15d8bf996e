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

from zoo.io.tokenizer import Tokenizer
from zoo.losses.preference import kto_loss
from zoo.spec import DecoderSpec, ModelSpec
from zoo.training.batching import Batch
from zoo.training.config import ConfigError, DataConfig
from zoo.training.data.shards import SideInfo
from zoo.training.data.sources import OnBadLine, ReadStats, Record, Source
from zoo.training.objectives import ObjectiveSums
from zoo.training.task_settings import KTOSettings
from zoo.training.tasks.base import (
    Encode,
    LengthCuts,
    Limits,
    Split,
    Task,
    Tokenizers,
    Units,
    field_text,
    rows,
)
from zoo.training.tasks.dpo import SequenceScores
from zoo.training.tasks.jsonl import checked_records, encode_fields
from zoo.training.tasks.language_model import framing
from zoo.training.tasks.reference import frozen_reference
from zoo.training.tasks.responses import ResponseRows, cut_responses, response_units

if TYPE_CHECKING:
    from zoo.models.base import ZooModel

LABELS = {"true": 1, "false": 0}
TEXTS = ("prompt", "completion")  # the text fields (``label`` is a boolean)


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
        return checked_records(source, strings=TEXTS, stats=stats, problem=_label_problem)

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
            ids, over = encode_fields(records, TEXTS, tokenizer, cuts)
            label = [LABELS[field_text(r, "label")] for r in records]
            if cuts is None:
                return {**ids, "label": label}
            # the limit holds prompt + completion: cut as one, its end first
            kept: dict[str, list[Any]] = cut_responses(
                records, ids, ("completion",), cuts=cuts, over=over, extra=extra
            )
            kept["label"] = [None if p is None else y for p, y in zip(kept["prompt"], label)]
            return kept

        return encode

    def framed_sides(self, tokenizers: Tokenizers) -> dict[str, int]:
        frame = framing(tokenizers)
        return {"prompt": frame.bos is not None, "completion": frame.eos is not None}

    def units(self, split: Split, *, tokenizers: Tokenizers, limits: Limits) -> Units:
        """One unit per example, costing two rows (its own and a mismatched one) of its framed length."""
        return response_units(split, framing(tokenizers), limits, ("completion",))

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
        reference, adapters = frozen_reference(model, starting_model)
        return KahnemanTversky(reference, adapters=adapters, **options)


def _label_problem(record: Record) -> str | None:
    """What is wrong with a record's ``label`` (None: nothing): it must be a JSON boolean."""
    label = record.fields["label"]
    return None if label in LABELS else f"'label' must be true or false, found {str(label)[:40]!r}"


# --- batches -----------------------------------------------------------------------------------------------


class LabelledBatch(Batch):
    """A `Batch` that also carries each example's label: ``desirable`` (B,) bool, on the host."""

    def __init__(
        self, inputs: dict[str, torch.Tensor], targets: torch.Tensor, num_tokens: int, desirable: torch.Tensor
    ) -> None:
        super().__init__(inputs, targets, num_tokens)
        self.desirable = desirable


class UnpairedCollator(ResponseRows):
    """Units -> a `LabelledBatch` of 2B rows: the B examples, then B mismatched rows (prompt i with the
    completion of example i - 1 in the batch), right-padded; targets at the completion positions (and eos)."""

    def __call__(self, units: np.ndarray, *, generator: torch.Generator | None = None) -> LabelledBatch:
        examples = self.units.example_indices(units)
        prompts = rows(self.data, examples, "prompt")
        completions = rows(self.data, examples, "completion")
        # TRL's KL rows: each prompt with the previous completion
        mismatched = completions[-1:] + completions[:-1]
        ids, mask, targets = self.scored_rows(prompts, (completions, mismatched))  # (2B, T) each
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
