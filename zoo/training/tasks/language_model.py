"""Language modelling: causal (GPT: predict the next token) and masked (BERT: predict the masked ones).

Raw data is plain text, one document a line (blank lines skipped). A document is framed ``bos text eos``
(``[CLS] text [SEP]`` with a BERT tokenizer; with what the tokenizer has: GPT-2's has no separate bos).
Without packing each document is one example, cut to the length limit and right-padded. With
``data.packing`` (the task is built with it) the framed documents are concatenated and cut into windows of ``block_size`` tokens (the
last may be shorter), as nanoGPT and transformers' ``group_texts`` do, so no batch pads:

    documents   [bos a1 a2 eos] [bos b1 b2 b3 eos] [bos c1 eos] ...
    stream      bos a1 a2 eos bos b1 b2 b3 eos bos c1 eos ...   -> windows of block_size, end to end

``documents: joined`` lets a window attend across document boundaries (nanoGPT's way); ``separate`` gives
each token a document id (the model's ``document_ids``): attention stays inside each document (a
block-diagonal mask, `zoo.blocks.masks.within_documents`) and positions restart at each document's start,
so a packed document is seen as it would be alone. A document cut by a window's edge continues in the
next window, its positions restarting there.

Windows are planned from the offsets alone: the documents' framed lengths, their cumulative sum, and one
``searchsorted`` per batch find every token's document and place (never a Python loop per token).

Causal LM targets are the inputs shifted left (position t predicts token t + 1; with separate documents,
never across a boundary). Masked LM targets are the original ids at the positions BERT's masking picked
(`zoo.training.tasks.masking`, ``mlm_probability`` of the non-special tokens (its settings: 15% by default),
80/10/10), drawn from the batch's generator.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from zoo.losses import IGNORE_INDEX
from zoo.spec import DecoderSpec, EncoderSpec, ModelSpec
from zoo.training.batching import Batch
from zoo.training.config import ConfigError, DataConfig, PackingConfig
from zoo.training.data.sources import OnBadLine, Record, Source
from zoo.training.task_settings import CausalLMSettings, MaskedLMSettings
from zoo.training.tasks.base import (
    LENGTH_CHUNK,
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
    pad,
    raw_ids,
    rows,
)
from zoo.training.tasks.masking import mask_tokens


class LanguageModel(Task):
    """What causal and masked language modelling share: plain text, framing, packing."""

    sides: ClassVar[tuple[str, ...]] = ("text",)
    fields: ClassVar[tuple[str, ...]] = ("text",)
    packs = True

    def check_data(self, data: DataConfig) -> None:
        self.refuse_parallel_files(data, f"data: {{source, target}} files are for seq2seq, not {self.name}")

    def source(self, files: Path | Any, *, on_bad_line: OnBadLine = "error") -> Source:
        return Source("text", (files,), fields=self.fields, on_bad_line=on_bad_line)

    def encoder(self, tokenizers: Tokenizers, *, cuts: LengthCuts | None, labels: Any = ()) -> Encode:
        tokenizer, extra = tokenizers.target, framing(tokenizers).extra

        def encode(records: list[Record]) -> dict[str, list[list[int]]]:
            texts, over = cut_texts([field_text(r, "text") for r in records], tokenizer, cuts)
            ids = raw_ids(tokenizer, texts)
            if cuts is not None:
                cuts.apply(records, [(ids, extra)], set(over))
            return {"text": ids}

        return encode

    def framed_sides(self, tokenizers: Tokenizers) -> dict[str, int]:
        return {"text": framing(tokenizers).extra}

    def units(self, split: Split, *, tokenizers: Tokenizers, limits: Limits) -> Units:
        packing = self.packing
        if packing is None:
            return super().units(split, tokenizers=tokenizers, limits=limits)
        return packed_windows(split, framing(tokenizers), packing, limits).units()

    def collator(
        self,
        split: Split,
        units: Units,
        *,
        spec: ModelSpec,
        tokenizers: Tokenizers,
        limits: Limits,
    ) -> LanguageModelCollator:
        pad_id = spec.pad_token_id
        assert pad_id is not None  # wire_spec refuses a spec without one
        packing = self.packing
        windows = packed_windows(split, framing(tokenizers), packing, limits) if packing is not None else None
        return LanguageModelCollator(
            split,
            units,
            framing=framing(tokenizers),
            pad_id=pad_id,
            max_length=limits.max_length,
            windows=windows,
            packing=packing,
            targets=self.targets(spec, tokenizers),
        )

    def targets(self, spec: ModelSpec, tokenizers: Tokenizers) -> Targets:
        """How a collated batch of ids becomes (model inputs, targets)."""
        raise NotImplementedError


def packed_windows(
    split: Split, framing: Framing, packing: PackingConfig, limits: Limits, *, side: str = "text"
) -> Windows:
    """The split's `Windows`; a block longer than the run's length limit is a `ConfigError`."""
    if packing.block_size > limits.max_length:
        raise ConfigError(
            f"data.packing.block_size ({packing.block_size}) exceeds the length limit ({limits.max_length}: "
            "data.max_length or the model's max_positions)"
        )
    return Windows.of(split, framing, block_size=packing.block_size, side=side)


def framing(tokenizers: Tokenizers) -> Framing:
    """``bos text eos`` with the special tokens the tokenizer has (GPT-2's one token serves as eos)."""
    tok = tokenizers.target
    return Framing(bos=tok.bos_id, eos=tok.eos_id)


# --- causal and masked ---------------------------------------------------------------------------------


class CausalLM(LanguageModel):
    name = "causal_lm"
    settings_type = CausalLMSettings
    settings: CausalLMSettings
    family = "decoder"
    chunks_loss = True

    def check_model(self, spec: ModelSpec, *, where: str) -> None:
        if isinstance(spec, DecoderSpec) and spec.lm_head is None:
            raise ConfigError("task causal_lm needs an LM head; the spec has lm_head: null")

    def targets(self, spec: ModelSpec, tokenizers: Tokenizers) -> Targets:
        return NextTokens()


class MaskedLM(LanguageModel):
    name = "masked_lm"
    settings_type = MaskedLMSettings
    settings: MaskedLMSettings
    family = "encoder"

    @classmethod
    def natural_for(cls, spec: ModelSpec) -> bool:
        return isinstance(spec, EncoderSpec) and spec.heads.classifier is None

    def check_model(self, spec: ModelSpec, *, where: str) -> None:
        if isinstance(spec, EncoderSpec) and spec.heads.mlm is None:
            raise ConfigError("task masked_lm needs an MLM head; set heads.mlm in the spec (model.overrides)")

    def missing_tokens(self, spec: ModelSpec, tokenizers: Tokenizers) -> list[str]:
        missing = super().missing_tokens(spec, tokenizers)
        if tokenizers.target.mask_id is None:
            missing.append("a mask token ([MASK] or <mask>)")
        return missing

    def has_unused_parameters(self, spec: ModelSpec) -> bool:
        return True  # BERT's pooler: computed, never read by the MLM loss

    def targets(self, spec: ModelSpec, tokenizers: Tokenizers) -> Targets:
        tok = tokenizers.target
        assert tok.mask_id is not None and spec.pad_token_id is not None  # missing_tokens checked both
        special = {i for i in tok.special_ids().values() if i is not None} | {spec.pad_token_id, tok.mask_id}
        return MaskedTokens(
            mask_id=tok.mask_id,
            special=tuple(sorted(special)),
            vocab_size=spec.vocab_size,
            probability=self.settings.mlm_probability,
        )


class Targets:
    """(ids (B, T), attention mask (B, T), document ids (B, T) or None, generator) -> (input ids, targets)."""

    def __call__(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        documents: torch.Tensor | None,
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError


class NextTokens(Targets):
    """Position t predicts token t + 1 of the same row (and, with documents, of the same document)."""

    def __call__(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        documents: torch.Tensor | None,
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        targets = torch.full_like(ids, IGNORE_INDEX)  # (B, T)
        scored = mask[:, 1:].bool()  # the next position is a real token
        if documents is not None:
            scored &= documents[:, 1:] == documents[:, :-1]
        targets[:, :-1] = torch.where(scored, ids[:, 1:], IGNORE_INDEX)
        return ids, targets


@dataclass(frozen=True)
class MaskedTokens(Targets):
    """BERT's masking of the real, non-special tokens (`zoo.training.tasks.masking.mask_tokens`)."""

    mask_id: int
    special: tuple[int, ...]
    vocab_size: int
    probability: float

    def __call__(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        documents: torch.Tensor | None,
        generator: torch.Generator | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        special = torch.tensor(self.special)
        allowed = torch.ones(self.vocab_size, dtype=torch.bool)
        allowed[special] = False
        maskable = mask.bool() & ~torch.isin(ids, special)
        return mask_tokens(
            ids,
            maskable=maskable,
            mask_token_id=self.mask_id,
            replacement_ids=allowed.nonzero().squeeze(1),  # (R,) random replacements: no special tokens
            probability=self.probability,
            generator=generator,
        )


# --- packing -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Windows:
    """The framed documents of a split end to end, cut into windows of ``block`` tokens.

    ``ends[d]``: where document d's framed tokens end in the stream (the cumulative framed lengths of
    ``side``; another side of the same lengths, chat's labels, is read in the same windows).
    """

    split: Split
    framing: Framing
    block: int
    ends: np.ndarray  # (D,) int64
    side: str = "text"

    @classmethod
    def of(cls, split: Split, framing: Framing, *, block_size: int, side: str = "text") -> Windows:
        data, ends = split.data, np.empty(split.data.num_examples, dtype=np.int64)
        total = 0
        for start in range(0, data.num_examples, LENGTH_CHUNK):  # the offsets in chunks, never held whole
            stop = min(start + LENGTH_CHUNK, data.num_examples)
            ends[start:stop] = total + np.cumsum(data.read_lengths(side, start, stop) + framing.extra)
            total = int(ends[stop - 1])
        return cls(split, framing, block_size, ends, side)

    @property
    def total(self) -> int:
        return int(self.ends[-1])

    def units(self) -> Units:
        """One unit per window, costing its length (``block`` but for a shorter last one)."""
        count = -(-self.total // self.block)
        lengths = np.full((count, 1), self.block, dtype=np.int32)
        lengths[-1, 0] = self.total - (count - 1) * self.block
        return Units(lengths, name=lambda u: f"{self.split.where}: window {u}")

    def tokens(
        self, windows: np.ndarray, *, side: str | None = None
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The token ids (of ``side``, default the windows' own) and document ids of each window: its
        documents found by a searchsorted over the ends, their ids read in one span from the file, every
        position placed at once (no loop per token)."""
        data, bos, eos = self.split.data, self.framing.bos, self.framing.eos
        side = side or self.side
        ids, docs = [], []
        for window in windows.tolist():
            low = window * self.block
            high = min(low + self.block, self.total)
            first, last = np.searchsorted(self.ends, [low, high - 1], side="right").tolist()
            offsets = data.read_span(side, first, last + 2, what="offsets")  # (D + 1,) of its documents
            span = data.read_span(side, int(offsets[0]), int(offsets[-1]))  # their raw ids, end to end
            positions = np.arange(low, high)  # (P,) in the stream
            doc = np.searchsorted(self.ends[first : last + 1], positions, side="right")  # (P,) 0 .. D - 1
            length = np.diff(offsets)[doc] + self.framing.extra  # framed length of each position's document
            local = positions - (self.ends[first + doc] - length)  # place inside the framed document
            raw = offsets[doc] - offsets[0] + local - (bos is not None)
            row = (  # a window of documents with no ids of their own holds only framing
                span[np.clip(raw, 0, len(span) - 1)].astype(np.int64) if len(span) else np.zeros_like(raw)
            )
            if bos is not None:
                row = np.where(local == 0, bos, row)
            if eos is not None:
                row = np.where(local == length - 1, eos, row)
            ids.append(row)
            docs.append(first + doc)
        return ids, docs


class LanguageModelCollator:
    """Units -> a `Batch` of ``input_ids``, ``attention_mask`` (and, for separate packed documents,
    ``document_ids``) with the task's targets. Units are examples, or windows with ``windows``."""

    def __init__(
        self,
        split: Split,
        units: Units,
        *,
        framing: Framing,
        pad_id: int,
        max_length: int,
        targets: Targets,
        windows: Windows | None = None,
        packing: PackingConfig | None = None,
    ) -> None:
        self.data, self.units, self.framing = split.data, units, framing
        self.pad_id, self.max_length, self.targets = pad_id, max_length, targets
        self.windows = windows
        self.separate = packing is not None and packing.documents == "separate"

    def __call__(self, units: np.ndarray, *, generator: torch.Generator | None = None) -> Batch:
        documents = None
        if self.windows is None:
            examples = self.units.example_indices(units)
            sequences = [self.framing(ids, self.max_length) for ids in rows(self.data, examples, "text")]
            ids, mask = pad(sequences, self.pad_id)  # (B, T)
        else:
            tokens, docs = self.windows.tokens(units)
            ids, mask = pad(tokens, self.pad_id)  # (B, T)
            if self.separate:
                documents, _ = pad(docs, -1)  # (B, T); padding: a document of its own
        input_ids, targets = self.targets(ids, mask, documents, generator)
        inputs = {"input_ids": input_ids, "attention_mask": mask}
        if documents is not None:
            inputs["document_ids"] = documents
        return Batch(inputs, targets, int(mask.sum()))
