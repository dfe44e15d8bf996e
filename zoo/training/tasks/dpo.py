"""Preference tuning: Direct Preference Optimization (Rafailov et al. 2023, arXiv:2305.18290) on a decoder.

Raw data is JSON lines, one preference pair a line: a prompt, the response preferred and the one rejected.

    {"prompt": "Name a colour.", "chosen": " Red.", "rejected": " Colours are hard to name."}

Prepared data has three sides of raw ids (`zoo.training.data.shards`): ``prompt``, ``chosen`` and
``rejected``, each encoded on its own (a response starts where the prompt ends: a separating space belongs in
the response, as in TRL's datasets). A pair becomes two sequences, framed as causal_lm frames a document
(``bos`` where the tokenizer has one, then ``eos``), and only the response tokens are scored:

    chosen row      bos p1 p2 p3 c1 c2 eos           targets: -100 except c1 c2 eos
    rejected row    bos p1 p2 p3 r1 r2 r3 eos                 -100 except r1 r2 r3 eos

A batch of P pairs holds the P chosen rows, then the P rejected ones, right-padded (one forward for both,
as TRL's ``concatenated_forward``), and the head runs only at the scored positions. Its cost for the batch
planner is two rows of its longer sequence. A pair over the length limit loses the end of its responses
first (``data.too_long: truncate``; eos kept), or is skipped or refused.

The loss (`DirectPreference`, `zoo.losses.dpo_loss`) compares each sequence's summed log-probability under
the policy and under the reference model, the weights the run started from, frozen:

    with adapters       (the config's ``lora``) the same model with them disabled (`zoo.lora.disabled`): no
                        weight copied
    without             a frozen copy of ``model.init_from`` (or of the seed's initialisation), built once at
                        setup and kept in eval mode: it doubles the weights' memory, as TRL's does

Its settings (`zoo.training.task_settings.DPOSettings`) are ``loss`` (sigmoid, DPO's own; ipo, hinge,
simpo, orpo: `DirectPreference`), ``beta``, ``gamma`` (SimPO's margin) and ``nll_coef`` (RPO's NLL term);
``loss.label_smoothing`` is cDPO's label-flip probability. simpo and orpo read no reference: none is built
(no copy of the weights, no second forward). The reference runs under ``torch.no_grad`` in eval mode (no
dropout); the policy in train mode. Neither is
checkpointed as a reference: a resumed run rebuilds it from ``init_from`` (or the adapters' base).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import nn

from zoo.losses import dpo_loss, sequence_log_probs
from zoo.losses.chunked import ChunkedLoss
from zoo.losses.preference import hinge_loss, ipo_loss, orpo_loss, simpo_loss
from zoo.spec import DecoderSpec, ModelSpec
from zoo.training.batching import Batch
from zoo.training.config import ConfigError, DataConfig
from zoo.training.data.sources import OnBadLine, ReadStats, Record, Source
from zoo.training.objectives import Objective, ObjectiveSums, chunks
from zoo.training.task_settings import REFERENCE_FREE, DPOSettings
from zoo.training.tasks.base import Encode, LengthCuts, Limits, Split, Task, Tokenizers, Units, rows
from zoo.training.tasks.jsonl import checked_records, encode_fields
from zoo.training.tasks.language_model import framing
from zoo.training.tasks.reference import frozen_reference, reference_mode
from zoo.training.tasks.responses import ResponseRows, cut_responses, response_units

if TYPE_CHECKING:
    from zoo.models.base import ZooModel
    from zoo.models.outputs import ModelOutput

RESPONSES = ("chosen", "rejected")


class DPO(Task):
    name = "dpo"
    settings_type = DPOSettings
    settings: DPOSettings
    family = "decoder"
    sides: ClassVar[tuple[str, ...]] = ("prompt", "chosen", "rejected")
    fields: ClassVar[tuple[str, ...]] = ("prompt", "chosen", "rejected")
    chunks_loss = True

    # -- the model -------------------------------------------------------------------------------------------

    @classmethod
    def natural_for(cls, spec: ModelSpec) -> bool:
        return False  # a decoder trains on causal_lm unless the config names dpo

    def check_model(self, spec: ModelSpec, *, where: str) -> None:
        if isinstance(spec, DecoderSpec) and spec.lm_head is None:
            raise ConfigError("task dpo needs an LM head; the spec has lm_head: null")

    # -- data --------------------------------------------------------------------------------------------

    def check_data(self, data: DataConfig) -> None:
        super().check_data(data)
        self.refuse_parallel_files(
            data, "data: dpo reads JSON lines {prompt, chosen, rejected}, not {source, target} files"
        )

    def source(self, files: Path | Any, *, on_bad_line: OnBadLine = "error") -> Source:
        return Source("jsonl", (files,), fields=self.fields, on_bad_line=on_bad_line)

    def records(self, source: Source, *, stats: ReadStats | None = None) -> Iterator[Record]:
        return checked_records(source, strings=self.fields, stats=stats)

    def encoder(
        self, tokenizers: Tokenizers, *, cuts: LengthCuts | None, labels: Sequence[str] = ()
    ) -> Encode:
        tokenizer, extra = tokenizers.target, framing(tokenizers).extra

        def encode(records: list[Record]) -> dict[str, list[list[int] | None]]:
            ids, over = encode_fields(records, self.sides, tokenizer, cuts)
            if cuts is None:
                return ids
            # The limit holds a whole sequence, prompt + response: cut each as one (its end first).
            return cut_responses(records, ids, RESPONSES, cuts=cuts, over=over, extra=extra)

        return encode

    def framed_sides(self, tokenizers: Tokenizers) -> dict[str, int]:
        frame = framing(tokenizers)
        return {
            "prompt": frame.bos is not None,
            "chosen": frame.eos is not None,
            "rejected": frame.eos is not None,
        }

    def units(self, split: Split, *, tokenizers: Tokenizers, limits: Limits) -> Units:
        """One unit per pair, costing two rows (chosen, rejected) of its longer framed sequence."""
        return response_units(split, framing(tokenizers), limits, RESPONSES)

    def collator(
        self,
        split: Split,
        units: Units,
        *,
        spec: ModelSpec,
        tokenizers: Tokenizers,
        limits: Limits,
    ) -> PreferenceCollator:
        assert spec.pad_token_id is not None  # wire_spec refuses a spec without one
        return PreferenceCollator(
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
    ) -> DirectPreference:
        settings = self.settings
        options: dict[str, Any] = {
            "loss": settings.loss,
            "beta": settings.beta,
            "gamma": settings.simpo_gamma,
            "label_smoothing": self.label_smoothing(label_smoothing),
            "nll_coef": settings.nll_coef,
            "chunk_tokens": chunk_tokens,
        }
        if not settings.needs_reference:  # simpo, orpo: no reference built, its memory and forward saved
            return DirectPreference(None, adapters=False, **options)
        reference, adapters = frozen_reference(model, starting_model)
        return DirectPreference(reference, adapters=adapters, **options)


# --- batches -----------------------------------------------------------------------------------------------


class PreferenceCollator(ResponseRows):
    """Pair units -> a `Batch` of 2P rows, the P chosen sequences then the P rejected ones, right-padded;
    targets are the next tokens at the response positions (and eos), -100 elsewhere."""

    def __call__(self, units: np.ndarray, *, generator: torch.Generator | None = None) -> Batch:
        examples = self.units.example_indices(units)
        prompts = rows(self.data, examples, "prompt")
        responses = [rows(self.data, examples, side) for side in RESPONSES]
        ids, mask, targets = self.scored_rows(prompts, responses)  # (2P, T) each
        return Batch({"input_ids": ids, "attention_mask": mask}, targets, int(mask.sum()))


# --- the objective -----------------------------------------------------------------------------------------


class SequenceScores(Objective):
    """What the sequence-level preference objectives share (`DirectPreference`, KTO's): each row's summed
    log-probability of its scored tokens under the policy and, in eval mode and without a gradient, under
    the frozen ``reference`` (``adapters``: the policy itself with its LoRA adapters disabled); through the
    LM head ``chunk_tokens`` tokens at a time (`zoo.losses.chunked`) when a batch scores more than that
    (`zoo.training.objectives.chunks`), or all at once (None)."""

    reference: nn.Module | None
    adapters: bool
    chunk_tokens: int | None

    @torch.no_grad()
    def reference_log_probs(
        self,
        batch: Batch,
        scored: torch.Tensor,
        targets: torch.Tensor,
        row: torch.Tensor,
        *,
        autocast: AbstractContextManager | None = None,
    ) -> torch.Tensor:
        """(2P,) each row's summed log-probability of its scored targets under the reference, in eval mode."""
        model = self.reference
        assert model is not None  # only the losses that read a reference ask for it
        with reference_mode(model, adapters=self.adapters):  # no dropout; the policy's mode restored after
            _, log_probs = self.log_probs(model, batch, scored, targets, row, autocast=autocast)
        return log_probs

    def log_probs(
        self,
        model: nn.Module,
        batch: Batch,
        scored: torch.Tensor,
        targets: torch.Tensor,
        row: torch.Tensor,
        *,
        autocast: AbstractContextManager | None = None,
    ) -> tuple[ModelOutput, torch.Tensor]:
        """``model``'s output on ``batch`` (run under ``autocast``) and each row's summed log-probability of
        its scored targets (2P,): from the logits, or through the LM head in chunks (``chunk_tokens``; the
        output then has no logits)."""
        if not chunks(self.chunk_tokens, targets):
            with autocast or nullcontext():
                out = model(**batch.inputs, logits_mask=scored)
            return out, sequence_log_probs(out.logits, targets, row, scored.shape[0])
        assert self.chunk_tokens is not None
        chunked = ChunkedLoss(targets, chunk_tokens=self.chunk_tokens)
        with autocast or nullcontext():
            out = model(**batch.inputs, logits_mask=scored, chunked_loss=chunked)
        assert out.token_losses is not None  # (N,): a decoder given chunked_loss
        token = -out.token_losses  # (N,) log p(target)
        return out, token.new_zeros(scored.shape[0]).index_add(0, row, token)

    def summary(self, loss: float, count: int, metrics: Mapping[str, float]) -> dict[str, Any]:
        return {**super().summary(loss, count, metrics), "val_ppl": None}


LOSS_NAMES = {"sigmoid": "DPO", "ipo": "IPO", "hinge": "hinge", "simpo": "SimPO", "orpo": "ORPO"}


class DirectPreference(SequenceScores):
    """A preference loss per pair (``loss``: DPO's sigmoid, `zoo.losses.dpo_loss`, or a variant of
    `zoo.losses.preference`), with the reference model's sequence log-probabilities computed alongside the
    policy's where the loss reads them; its metrics, means over the pairs, are TRL's: ``rewards/chosen``
    and ``rewards/rejected`` (beta x (log pi - log pi_ref); simpo and orpo: beta x the mean token
    log-probability), ``rewards/margins`` (their difference) and ``rewards/accuracy`` (the share of pairs
    whose margin is positive).

    ``loss``: sigmoid (DPO; cDPO with ``label_smoothing``), ipo (mean token log-probabilities, as TRL), hinge,
    simpo (mean token log-probabilities, margin ``gamma``, no reference) or orpo (the chosen response's mean
    token NLL plus beta x the odds-ratio term, no reference; ``nll/chosen`` and ``log_odds_ratio`` logged).

    ``reference``: the frozen reference model, or (``adapters=True``) the trained model itself, run with its
    LoRA adapters disabled; None for simpo and orpo. ``nll_coef`` > 0 adds that times the chosen response's
    mean token NLL to each pair's loss (RPO, Pang et al. 2024, arXiv:2404.19733; TRL's ``rpo_alpha``): DPO
    alone may lower the chosen answers' likelihood along with the rejected ones' (what they share, such as
    the right number in both a short and a long answer, is pushed down in the rejected context); the NLL
    term holds it up. Its mean is logged as ``nll/chosen``.

    ``chunk_tokens``: both models compute the scored tokens' log-probabilities through their LM head that
    many tokens at a time (`zoo.losses.chunked`), never holding every logit; None: all at once.
    """

    unit = "preference pair"

    def __init__(
        self,
        reference: nn.Module | None,
        *,
        adapters: bool,
        beta: float,
        loss: str = "sigmoid",
        gamma: float = 0.5,
        label_smoothing: float = 0.0,
        nll_coef: float = 0.0,
        chunk_tokens: int | None = None,
    ) -> None:
        if (reference is None) != (loss in REFERENCE_FREE):
            raise ValueError(f"loss {loss}: a reference model is {'not ' if reference is None else ''}needed")
        self.reference, self.adapters = reference, adapters
        self.chunk_tokens = chunk_tokens
        self.loss, self.beta, self.gamma = loss, beta, gamma
        self.label_smoothing, self.nll_coef = label_smoothing, nll_coef
        self.loss_name = LOSS_NAMES[loss]
        cdpo = f", conservative (cDPO) with label smoothing {label_smoothing:g}" if label_smoothing else ""
        rpo = f", plus {nll_coef:g} x the chosen response's mean token NLL (RPO)" if nll_coef else ""
        what = {
            "sigmoid": f"DPO's sigmoid loss, beta {beta:g}{cdpo}",
            "ipo": f"IPO's squared loss on mean token log-ratios, beta (tau) {beta:g}",
            "hinge": f"the hinge loss, beta {beta:g}",
            "simpo": f"SimPO's loss, beta {beta:g}, gamma {gamma:g}{cdpo}, no reference",
            "orpo": f"ORPO's loss, the chosen response's mean token NLL + {beta:g} x the odds-ratio term, "
            "no reference",
        }[loss]
        self.description = f"training objective per preference pair: {what}{rpo}"
        self.validation_description = f"validation {self.loss_name} loss per preference pair (as in training)"

    def count(self, batch: Batch) -> int:
        return batch.targets.shape[0] // 2  # pairs: a chosen and a rejected row each

    def __call__(
        self,
        model: nn.Module,
        batch: Batch,
        *,
        device: torch.device,
        autocast: AbstractContextManager | None = None,
        train: bool = True,
    ) -> ObjectiveSums:
        scored = batch.logits_mask()  # (2P, T) on the CPU: the response positions
        assert scored is not None  # a PreferenceCollator's targets are (2P, T)
        pairs = scored.shape[0] // 2
        row = scored.nonzero()[:, 0].to(device, non_blocking=True)  # (N,): each scored position's row
        targets = batch.scored_targets(scored).to(device, non_blocking=True)  # (N,)
        lengths = scored.sum(dim=1).clamp(min=1).to(device, non_blocking=True)  # (2P,) tokens scored
        batch = batch.to(device)
        reference = (
            None
            if self.reference is None
            else self.reference_log_probs(batch, scored, targets, row, autocast=autocast)  # (2P,)
        )
        out, policy = self.log_probs(model, batch, scored, targets, row, autocast=autocast)  # (2P,)
        mean = policy / lengths  # (2P,) mean token log-probabilities (ipo, simpo, orpo read these)
        metrics: dict[str, torch.Tensor] = {}
        if reference is not None:
            if self.loss == "ipo":  # TRL averages both models' log-probabilities over the tokens for ipo
                policy_, reference = mean, reference / lengths
            else:
                policy_ = policy
            sides = (policy_[:pairs], policy_[pairs:], reference[:pairs], reference[pairs:])
            if self.loss == "sigmoid":
                result = dpo_loss(*sides, beta=self.beta, label_smoothing=self.label_smoothing)
            elif self.loss == "ipo":
                result = ipo_loss(*sides, beta=self.beta)
            else:
                result = hinge_loss(*sides, beta=self.beta)
        elif self.loss == "simpo":
            result = simpo_loss(
                mean[:pairs],
                mean[pairs:],
                beta=self.beta,
                gamma=self.gamma,
                label_smoothing=self.label_smoothing,
            )
        else:
            result = orpo_loss(mean[:pairs], mean[pairs:], lam=self.beta)
            metrics["log_odds_ratio"] = result.log_odds_ratio.sum()
        losses = result.losses  # (P,)
        margins = result.chosen_rewards - result.rejected_rewards  # (P,)
        metrics |= {
            "rewards/chosen": result.chosen_rewards.sum(),
            "rewards/rejected": result.rejected_rewards.sum(),
            "rewards/margins": margins.sum(),
            "rewards/accuracy": (margins > 0).float().sum(),
        }
        nll_coef = 1.0 if self.loss == "orpo" else self.nll_coef  # ORPO's L_SFT: weight 1
        if nll_coef:
            nll = -mean[:pairs]  # (P,) the chosen response's mean token NLL
            losses = losses + nll_coef * nll
            metrics["nll/chosen"] = nll.detach().sum()
        return ObjectiveSums(loss=losses.sum(), aux_loss=out.aux_loss if train else None, metrics=metrics)
