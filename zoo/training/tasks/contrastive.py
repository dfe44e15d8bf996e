"""Embedding models trained contrastively: sentence-transformers' MultipleNegativesRankingLoss on an encoder.

Raw data is JSON lines, one (anchor, positive) pair a line, with ``hard_negatives`` extra columns when the
task's settings ask for them (``negative``, or ``negative_1`` ... ``negative_N``):

    {"anchor": "How do I reset my password?", "positive": "Steps to change a forgotten password."}

Each text is framed as the tokenizer frames one text (``[CLS] text [SEP]``) and cut to the length limit. A
batch of B lines is one forward of its K x B texts (K columns: anchors, then positives, then each negative
column), right-padded together; its cost for the batch planner is K rows of its longest text, and
``batch.max_sentences`` is the number of lines (so of in-batch negatives). Each text's vector is pooled
and normalised as the model folder says (``model.init_from``'s ``modules.json`` and ``1_Pooling``,
`zoo.embeddings.folder`; mean pooling, no normalisation for a plain folder), exactly as `zoo.embed` does,
and the loss is `zoo.losses.contrastive.ranking_losses` (or its `matryoshka` form) per anchor: the
summed loss over a step's anchors is divided by their count, so its mean is sentence-transformers' loss.

With ``cache_batch`` the batch is embedded that many texts at a time (GradCache, Gao et al. 2021,
arXiv:2101.06983, as sentence-transformers' CachedMultipleNegativesRankingLoss): a first pass without
gradients gives every vector, the loss and its gradient with respect to the vectors are computed from
them, and the backward pass embeds each mini-batch again (its dropout replayed from the saved RNG state)
and back-propagates the cached gradient through it. The loss and gradients are those of the whole batch;
the memory is one mini-batch's activations.

The trained run's folder gains ``sentence-transformers/``: the model as a Hugging Face folder with its
tokenizer, plus ``modules.json``, ``sentence_bert_config.json``, ``1_Pooling/config.json`` (and
``2_Normalize``), so ``SentenceTransformer(folder)`` loads it and its ``encode`` equals ``zoo.embed``.
Validation reports the loss and ``val_retrieval_accuracy``: the share of validation anchors whose nearest
positive, among every validation positive, is their own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from zoo.embeddings.folder import FolderSettings, read_folder_settings, write_folder_settings
from zoo.embeddings.pooling import pool
from zoo.io.checkpoint import load as load_checkpoint
from zoo.io.hf import to_hf
from zoo.losses.contrastive import matryoshka, ranking_losses, similarity
from zoo.spec import ModelSpec
from zoo.training.batching import Batch
from zoo.training.config import ConfigError, DataConfig
from zoo.training.data.sources import OnBadLine, ReadStats, Record, Source
from zoo.training.objectives import Objective, ObjectiveSums
from zoo.training.task_settings import ContrastiveSettings
from zoo.training.tasks.base import (
    Encode,
    Framing,
    LengthCuts,
    Limits,
    Split,
    Task,
    Tokenizers,
    Units,
    measured_units,
    pad,
    rows,
)
from zoo.training.tasks.jsonl import checked_records, encode_fields
from zoo.training.tasks.labels import with_encoder_framing

if TYPE_CHECKING:
    from zoo.io.tokenizer import Tokenizer
    from zoo.models.base import ZooModel

ST_FOLDER = "sentence-transformers"  # the run folder's sentence-transformers model


def columns_for(hard_negatives: int) -> tuple[str, ...]:
    """The record fields: anchor, positive, and ``negative`` or ``negative_1`` ... ``negative_N``."""
    negatives = ["negative"] if hard_negatives == 1 else [f"negative_{i + 1}" for i in range(hard_negatives)]
    return ("anchor", "positive", *negatives)


class Contrastive(Task):
    name = "contrastive"
    settings_type = ContrastiveSettings
    settings: ContrastiveSettings
    family = "encoder"
    sides: ClassVar[tuple[str, ...]] = ("anchor", "positive")
    fields: ClassVar[tuple[str, ...]] = ("anchor", "positive")

    def __init__(self, settings: ContrastiveSettings | None = None, **kwargs: Any) -> None:
        super().__init__(settings, **kwargs)
        # The columns depend on the settings: an instance's, shadowing the class's two.
        self.sides = self.fields = columns_for(self.settings.hard_negatives)  # type: ignore[misc]
        self.folder = FolderSettings(model_dir=None)  # `started_from` reads the model folder's
        self.max_length: int | None = None

    # -- the model -------------------------------------------------------------------------------------------

    @classmethod
    def natural_for(cls, spec: ModelSpec) -> bool:
        return False  # an encoder trains on masked_lm unless the config names contrastive

    def check_model(self, spec: ModelSpec, *, where: str) -> None:
        dims = self.settings.matryoshka_dims or ()
        if dims and max(dims) > spec.d_model * len(self.folder.pooling or ("mean",)):
            raise ConfigError(
                f"task.matryoshka_dims ({max(dims)}) is wider than the model's vectors ({spec.d_model})"
            )

    def has_unused_parameters(self, spec: ModelSpec) -> bool:
        return True  # a pooler or MLM head the vectors never read

    def started_from(self, folder: Path | None) -> None:
        """Read the pooling and normalisation of ``model.init_from`` (a sentence-transformers folder's
        modules, else mean pooling and no normalisation)."""
        if folder is None:
            return
        settings = read_folder_settings(folder)
        if settings.prompt is not None or settings.lowercase:
            what = "a default prompt" if settings.prompt is not None else "do_lower_case: true"
            raise ConfigError(
                f"model.init_from: {folder} has {what}, which task contrastive does not apply yet"
            )
        self.folder = settings

    # -- tokenizers and data ---------------------------------------------------------------------------------

    def frame_tokenizer(self, tokenizer: Tokenizer) -> Tokenizer:
        return with_encoder_framing(tokenizer)

    def check_data(self, data: DataConfig) -> None:
        super().check_data(data)
        self.refuse_parallel_files(
            data,
            f"data: contrastive reads JSON lines {{{', '.join(self.fields)}}}, not {{source, target}} files",
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
            if cuts is not None:  # each text is cut on its own (the collator frames and cuts it again)
                cuts.apply(records, [(ids[side], extra) for side in self.sides], over)
            return ids

        return encode

    def framed_sides(self, tokenizers: Tokenizers) -> dict[str, int]:
        extra = framing(tokenizers).extra
        return dict.fromkeys(self.sides, extra)

    def units(self, split: Split, *, tokenizers: Tokenizers, limits: Limits) -> Units:
        """One unit per line, costing K rows (its columns) of its longest framed text."""
        data, extra, k = split.data, framing(tokenizers).extra, len(self.sides)

        def measure(start: int, stop: int) -> np.ndarray:
            longest = np.max([data.read_lengths(side, start, stop) for side in self.sides], axis=0)
            length = longest.astype(np.int64) + extra  # (n,)
            return np.stack([length] * k, axis=1)  # (n, K): the batch pads every column to it

        return measured_units(split, measure, columns=k, limits=limits)

    def collator(
        self,
        split: Split,
        units: Units,
        *,
        spec: ModelSpec,
        tokenizers: Tokenizers,
        limits: Limits,
    ) -> ColumnCollator:
        assert spec.pad_token_id is not None  # wire_spec refuses a spec without one
        self.max_length = limits.max_length
        return ColumnCollator(
            split,
            units,
            sides=self.sides,
            framing=framing(tokenizers),
            pad_id=spec.pad_token_id,
            max_length=limits.max_length,
        )

    # -- loss, scores, the saved model --------------------------------------------------------------------

    def objective(
        self,
        spec: ModelSpec,
        *,
        label_smoothing: float | None,
        model: ZooModel,
        starting_model: Callable[[], ZooModel],
        chunk_tokens: int | None = None,
    ) -> RankingObjective:
        return RankingObjective(
            self.settings,
            columns=len(self.sides),
            pooling=self.folder.pooling or ("mean",),
            normalize=self.folder.normalize,
        )

    def scores(
        self,
        model: ZooModel,
        split: Split,
        *,
        tokenizers: Tokenizers,
        autocast: AbstractContextManager,
    ) -> dict[str, Any]:
        """``val_retrieval_accuracy``: the share of anchors whose nearest positive of the whole split is their
        own (`retrieval_accuracy`)."""
        assert model.spec.pad_token_id is not None
        frame, limit = framing(tokenizers), self.max_length or model.spec.max_positions
        examples = np.arange(split.data.num_examples)
        vectors = {}
        objective = self.objective(
            model.spec, label_smoothing=None, model=model, starting_model=lambda: model
        )
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                for side in ("anchor", "positive"):
                    texts = [frame(r, limit) for r in rows(split.data, examples, side)]
                    vectors[side] = embed_rows(
                        objective, model, texts, pad_id=model.spec.pad_token_id, autocast=autocast
                    )
        finally:
            model.train(was_training)
        accuracy = retrieval_accuracy(vectors["anchor"], vectors["positive"], self.settings.similarity)
        return {"val_retrieval_accuracy": accuracy}

    def save_final(self, output_dir: Path, tokenizers: Tokenizers) -> Path:
        """The trained model in ``output_dir`` (as the run saved it) written again as a sentence-transformers
        folder, ``output_dir / sentence-transformers``; returns it."""
        model = load_checkpoint(output_dir)
        assert not isinstance(model, tuple)  # no load report asked for
        folder = to_hf(model, output_dir / ST_FOLDER, tokenizer=tokenizers.target, overwrite=True)
        max_length = self.folder.max_length or self.max_length
        write_folder_settings(
            folder,
            FolderSettings(
                model_dir=folder,
                pooling=self.folder.pooling or ("mean",),
                normalize=self.folder.normalize,
                max_length=max_length,
            ),
            dim=model.spec.d_model,
        )
        return folder


def framing(tokenizers: Tokenizers) -> Framing:
    """``[CLS] text [SEP]``: the tokenizer's bos and eos around each text, as its post-processor frames it."""
    return Framing(bos=tokenizers.target.bos_id, eos=tokenizers.target.eos_id)


def retrieval_accuracy(anchors: torch.Tensor, positives: torch.Tensor, kind: str) -> float:
    """The share of ``anchors`` (N, C) whose most similar of ``positives`` (N, C) is their own (row i)."""
    hits = 0
    for start in range(0, len(anchors), 1024):  # (1024, N) similarities at a time
        sims = similarity(anchors[start : start + 1024], positives, kind)  # type: ignore[arg-type]
        hits += int((sims.argmax(dim=1) == torch.arange(start, start + len(sims))).sum())
    return hits / max(len(anchors), 1)


# --- batches -----------------------------------------------------------------------------------------------


class ColumnCollator:
    """Line units -> a `Batch` of K x B rows, each column's B texts in turn (anchors first), framed and
    right-padded together; ``targets`` (B,) is each anchor's positive (row i of the candidates)."""

    def __init__(
        self,
        split: Split,
        units: Units,
        *,
        sides: tuple[str, ...],
        framing: Framing,
        pad_id: int,
        max_length: int,
    ) -> None:
        self.data, self.units, self.sides, self.framing = split.data, units, sides, framing
        self.pad_id, self.max_length = pad_id, max_length

    def __call__(self, units: np.ndarray, *, generator: torch.Generator | None = None) -> Batch:
        examples = self.units.example_indices(units)
        texts = [
            self.framing(r, self.max_length) for side in self.sides for r in rows(self.data, examples, side)
        ]
        ids, mask = pad(texts, self.pad_id)  # (K B, T)
        targets = torch.arange(len(examples))  # (B,)
        return Batch({"input_ids": ids, "attention_mask": mask}, targets, int(mask.sum()))


# --- the objective -----------------------------------------------------------------------------------------


class RankingObjective(Objective):
    """MultipleNegativesRankingLoss (or MatryoshkaLoss over it) per anchor on a `ColumnCollator`'s batch,
    the vectors pooled (``pooling``) and normalised (``normalize``) as the model folder says. Its metric,
    ``in_batch_accuracy``, is the share of anchors whose best-scoring candidate of the batch is their own."""

    unit = "anchor"
    loss_name = "MNRL"

    def __init__(
        self, settings: ContrastiveSettings, *, columns: int, pooling: tuple[str, ...], normalize: bool
    ) -> None:
        self.settings, self.columns, self.pooling, self.normalize = settings, columns, pooling, normalize
        s = settings
        kind = f"MatryoshkaLoss over dims {list(s.matryoshka_dims)} of " if s.matryoshka_dims else ""
        cached = f", GradCache mini-batches of {s.cache_batch} texts" if s.cache_batch else ""
        self.description = (
            f"training objective per anchor: {kind}MultipleNegativesRankingLoss, scale {s.scale:g}, "
            f"{s.similarity} similarity, {columns - 2} hard negative column(s){cached}"
        )
        self.validation_description = "validation loss per anchor (as in training, in-batch negatives)"

    def count(self, batch: Batch) -> int:
        return batch.targets.shape[0]

    def embed(
        self,
        model: nn.Module,
        ids: torch.Tensor,
        mask: torch.Tensor,
        *,
        autocast: AbstractContextManager | None,
    ) -> torch.Tensor:
        """(N, T) ids and mask on the model's device -> (N, dim) vectors, as `zoo.embed` computes them."""
        inputs: dict[str, torch.Tensor] = {"attention_mask": mask} if not bool(mask.all()) else {}
        if _token_head(model):  # it scores no position: its (N, T, V) logits would cost more than the model
            inputs["logits_mask"] = torch.zeros_like(ids, dtype=torch.bool)  # (N, T)
        with autocast or nullcontext():
            hidden = model(ids, **inputs).last_hidden_state  # (N, T, C)
        vectors = pool(hidden.float(), mask, self.pooling)  # (N, dim)
        return F.normalize(vectors, p=2, dim=1) if self.normalize else vectors

    def losses(self, vectors: torch.Tensor) -> torch.Tensor:
        """(K B, dim) vectors, column by column -> (B,) per-anchor losses."""
        anchors, *candidates = vectors.chunk(self.columns, dim=0)  # K x (B, dim)
        s = self.settings
        if s.matryoshka_dims:
            return matryoshka(
                anchors,
                candidates,
                dims=s.matryoshka_dims,
                weights=s.matryoshka_weights,
                scale=s.scale,
                similarity_kind=s.similarity,
            )
        return ranking_losses(anchors, candidates, scale=s.scale, similarity_kind=s.similarity)

    def __call__(
        self,
        model: nn.Module,
        batch: Batch,
        *,
        device: torch.device,
        autocast: AbstractContextManager | None = None,
        train: bool = True,
    ) -> ObjectiveSums:
        ids = batch.inputs["input_ids"].to(device, non_blocking=True)  # (K B, T)
        mask = batch.inputs["attention_mask"].to(device, non_blocking=True)  # (K B, T)
        if self.settings.cache_batch and torch.is_grad_enabled():
            loss, vectors = cached_loss(
                self, model, ids, mask, mini=self.settings.cache_batch, autocast=autocast
            )
        else:
            vectors = self.embed(model, ids, mask, autocast=autocast)  # (K B, dim)
            loss = self.losses(vectors).sum()
        with torch.no_grad():
            anchors, *candidates = vectors.detach().chunk(self.columns, dim=0)
            scores = similarity(anchors, torch.cat(candidates), self.settings.similarity)  # (B, (K - 1) B)
            own = scores.argmax(dim=1) == torch.arange(len(anchors), device=device)
        return ObjectiveSums(loss=loss, metrics={"in_batch_accuracy": own.float().sum()})

    def summary(self, loss: float, count: int, metrics: Mapping[str, float]) -> dict[str, Any]:
        return {**super().summary(loss, count, metrics), "val_ppl": None}


def _token_head(model: nn.Module) -> bool:
    """Whether the model (inside any DDP / compile wrapper) has a token-level head (MLM, LM, tagger)."""
    inner = getattr(model, "module", model)
    heads = [getattr(inner, name, None) for name in ("lm_head", "mlm_head")]
    return any(h is not None for h in heads) or getattr(
        getattr(inner, "classifier", None), "per_token", False
    )


def embed_rows(
    objective: RankingObjective,
    model: nn.Module,
    texts: list[list[int]],
    *,
    pad_id: int,
    autocast: AbstractContextManager | None,
    batch_size: int = 64,
) -> torch.Tensor:
    """Framed texts -> (N, dim) vectors on the CPU, ``batch_size`` at a time in order of length."""
    device = next(model.parameters()).device
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))  # similar lengths share a batch
    out: list[torch.Tensor] = [torch.empty(0)] * len(texts)
    for start in range(0, len(order), batch_size):
        picked = order[start : start + batch_size]
        ids, mask = pad([texts[i] for i in picked], pad_id)
        vectors = objective.embed(model, ids.to(device), mask.to(device), autocast=autocast).cpu()
        for i, v in zip(picked, vectors):
            out[i] = v
    return torch.stack(out) if out else torch.empty(0, 0)


# --- GradCache ---------------------------------------------------------------------------------------------


def cached_loss(
    objective: RankingObjective,
    model: nn.Module,
    ids: torch.Tensor,
    mask: torch.Tensor,
    *,
    mini: int,
    autocast: AbstractContextManager | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The summed loss of the batch, embedded ``mini`` texts at a time without a graph, and its (K B, dim)
    vectors. The loss is a leaf whose backward hook re-embeds each mini-batch with gradients (its RNG state
    restored, so dropout draws the same masks) and back-propagates the cached gradient of the vectors."""
    devices = [ids.device] if ids.device.type == "cuda" else []
    parts = [slice(start, start + mini) for start in range(0, len(ids), mini)]
    states, chunks = [], []
    with torch.no_grad():
        for part in parts:
            states.append(_rng_state(ids.device))
            chunks.append(objective.embed(model, ids[part], mask[part], autocast=autocast))
    vectors = torch.cat(chunks).requires_grad_()  # (K B, dim), a leaf
    with torch.enable_grad():
        total = objective.losses(vectors).sum()
        (cache,) = torch.autograd.grad(total, vectors)  # (K B, dim): d loss / d vectors
    loss = total.detach().requires_grad_()

    def replay(grad_output: torch.Tensor) -> torch.Tensor:
        for part, state in zip(parts, states):
            with torch.random.fork_rng(devices=devices), torch.enable_grad():
                _set_rng_state(state, ids.device)
                again = objective.embed(model, ids[part], mask[part], autocast=autocast)
                (again * cache[part] * grad_output).sum().backward()
        return grad_output

    loss.register_hook(replay)
    return loss, vectors.detach()


def _rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state: tuple[torch.Tensor, torch.Tensor | None], device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


__all__ = [
    "ST_FOLDER",
    "Contrastive",
    "RankingObjective",
    "columns_for",
    "ranking_losses",
    "retrieval_accuracy",
]
