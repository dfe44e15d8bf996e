"""Translation (and any parallel text): an encoder-decoder trained with teacher forcing, scored by BLEU.

Raw data is a TSV file (``source<TAB>target``, one pair a line) or two line-aligned files. A source and a
target each end with eos; the decoder reads the target shifted right behind the start token and is scored
against the target itself:

    target            x1 x2 x3 eos
    decoder input  bos x1 x2 x3          (the decoder start token, then the target minus its last token)
    targets           x1 x2 x3 eos       padded with -100, never with the pad id

The training loss is label-smoothed (0.1 by default: Vaswani et al. 2017, section 5.4); validation adds
the BLEU of greedy (or beam) translations of the validation sources against their references, as the
task's settings say (`zoo.training.task_settings.Seq2SeqSettings`: ``bleu``, ``bleu_metric``, ...).

With ``data.packing`` whole pairs go several to a row, at most ``block_size`` framed tokens a side
(`zoo.training.data.packing.pack_rows`; a longer pair is cut, skipped or refused at that limit, as
``data.too_long`` says), and each token carries its pair's id (the model's ``document_ids`` and
``decoder_document_ids``, -1 on padding): every pair is computed as it would be alone, its decoder input
starting with its own start token, so the rows pad little and no pair sees another:

    input_ids          a1 a2 eos b1 eos c1 c2 eos            document_ids          0 0 0 1 1 2 2 2
    decoder_input_ids  bos x1 bos y1 y2 bos z1               decoder_document_ids  0 0 1 1 1 2 2
    targets            x1 eos y1 y2 eos z1 eos
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from itertools import islice
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from zoo.losses import IGNORE_INDEX
from zoo.models.base import ZooModel
from zoo.models.encoder_decoder import EncoderDecoderModel
from zoo.spec import ModelSpec
from zoo.training.config import ConfigError, DataConfig, PackingConfig, ParallelFiles, TokenizerConfig
from zoo.training.data.packing import PackedRows, pack_rows
from zoo.training.data.sources import OnBadLine, Record, Source, iter_records
from zoo.training.evaluate import bleu
from zoo.training.task_settings import Seq2SeqSettings, TaskSettings
from zoo.training.tasks.base import (
    Batch,
    Encode,
    Framing,
    LengthCuts,
    Limits,
    Split,
    Task,
    Tokenizers,
    Units,
    cut_texts,
    example_units,
    field_text,
    pad,
    raw_ids,
    rows,
)


class Seq2Seq(Task):
    name = "seq2seq"
    settings_type = Seq2SeqSettings
    settings: Seq2SeqSettings
    family = "encoder-decoder"
    sides: ClassVar[tuple[str, ...]] = ("source", "target")
    fields: ClassVar[tuple[str, ...]] = ("source", "target")
    packs = True

    def __init__(self, settings: TaskSettings | None = None, *, packing: PackingConfig | None = None) -> None:
        super().__init__(settings, packing=packing)
        # per split and limits: (units, rows), planned once for `units` and `collator` both
        self._packed: dict[tuple[str, str, Limits], tuple[Units, PackedRows]] = {}

    def check_data(self, data: DataConfig) -> None:
        if data.packing is not None and data.packing.documents == "joined":
            raise ConfigError(
                "data.packing.documents: joined would let a pair attend to the pairs packed beside it; seq2seq "
                "packs each pair separately (leave documents out, or set it to separate)"
            )

    def separate_vocabularies(self, tokenizer: TokenizerConfig) -> bool:
        return not tokenizer.shared

    def tokenizer_lines(self, records: Iterator[Record], *, side: str) -> Iterator[str]:
        names = self.fields if side == "both" else (side,)
        for record in records:
            for name in names:
                yield field_text(record, name)

    def missing_tokens(self, spec: ModelSpec, tokenizers: Tokenizers) -> list[str]:
        missing = super().missing_tokens(spec, tokenizers)
        if tokenizers.for_source.eos_id is None:
            missing.append("an eos token (sources and targets end with it)")
        return missing

    def source(self, files: Path | Any, *, on_bad_line: OnBadLine = "error") -> Source:
        if isinstance(files, ParallelFiles):
            return Source(
                "aligned", (files.source, files.target), fields=self.fields, on_bad_line=on_bad_line
            )
        return Source("tsv", (files,), fields=self.fields, on_bad_line=on_bad_line)

    def encoder(
        self, tokenizers: Tokenizers, *, cuts: LengthCuts | None, labels: Sequence[str] = ()
    ) -> Encode:
        source_tok, target_tok = tokenizers.for_source, tokenizers.target

        def encode(records: list[Record]) -> dict[str, list[list[int]]]:
            sources, source_over = cut_texts([field_text(r, "source") for r in records], source_tok, cuts)
            targets, target_over = cut_texts([field_text(r, "target") for r in records], target_tok, cuts)
            source_ids = raw_ids(source_tok, sources)
            target_ids = raw_ids(target_tok, targets)
            if cuts is not None:
                cuts.apply(records, [(source_ids, 1), (target_ids, 1)], {*source_over, *target_over})
            return {"source": source_ids, "target": target_ids}

        return encode

    def framed_sides(self, tokenizers: Tokenizers) -> dict[str, int]:
        return {"source": 1, "target": 1}  # eos

    def units(self, split: Split, *, tokenizers: Tokenizers, limits: Limits) -> Units:
        """One unit per example, or with ``data.packing`` one per packed row (`packed_pairs`)."""
        if self.packing is None:
            return super().units(split, tokenizers=tokenizers, limits=limits)
        return self._packed_pairs(split, tokenizers, limits)[0]

    def _packed_pairs(self, split: Split, tokenizers: Tokenizers, limits: Limits) -> tuple[Units, PackedRows]:
        """`packed_pairs` of a split (planned once)."""
        assert self.packing is not None
        key = (split.name, split.where, limits)
        if key not in self._packed:
            sides = self.framed_sides(tokenizers)
            self._packed[key] = packed_pairs(split, sides, self.packing.block_size, limits)
        return self._packed[key]

    def collator(
        self,
        split: Split,
        units: Units,
        *,
        spec: ModelSpec,
        tokenizers: Tokenizers,
        limits: Limits,
    ) -> Seq2SeqCollator:
        start_id = getattr(spec, "start_token_id", None)
        assert start_id is not None and spec.pad_token_id is not None  # wire_spec checked both
        packed, max_length = None, limits.max_length
        if self.packing is not None:
            block = self.packing.block_size
            packed = self._packed_pairs(split, tokenizers, limits)[1]
            max_length = min(block, max_length)
        return Seq2SeqCollator(
            split,
            units,
            pad_id=spec.pad_token_id,
            start_id=start_id,
            source=Framing(eos=tokenizers.for_source.eos_id),
            target=Framing(eos=tokenizers.target.eos_id),
            max_length=max_length,
            packed=packed,
        )

    def label_smoothing(self, eps: float | None) -> float:
        return eps if eps is not None else 0.1  # the paper, section 5.4

    def scores(
        self,
        model: ZooModel,
        split: Split,
        *,
        tokenizers: Tokenizers,
        autocast: AbstractContextManager,
    ) -> dict[str, Any]:
        settings = self.settings
        if not settings.bleu:
            return {}
        assert isinstance(model, EncoderDecoderModel)  # the family was checked at setup
        with autocast:
            score = bleu(
                model,
                reference_pairs(split, tokenizers, limit=settings.bleu_samples),
                source_tokenizer=tokenizers.for_source,
                target_tokenizer=tokenizers.target,
                num_beams=settings.num_beams,
                max_new_tokens=settings.max_new_tokens,
                metric=settings.bleu_metric,
            )
        return {"val_bleu": score}


def reference_pairs(split: Split, tokenizers: Tokenizers, *, limit: int | None) -> list[tuple[str, str]]:
    """The first ``limit`` (source, reference) pairs of a validation split: read again from its raw files
    (so references are the text as written), or decoded from a prepared folder's ids."""
    if split.raw is not None:
        records = islice(iter_records(split.raw), limit)
        return [(field_text(r, "source"), field_text(r, "target")) for r in records]
    count = split.data.num_examples if limit is None else min(limit, split.data.num_examples)
    index = np.arange(count)
    sources = [tokenizers.for_source.decode(ids) for ids in rows(split.data, index, "source")]
    targets = [tokenizers.target.decode(ids) for ids in rows(split.data, index, "target")]
    return list(zip(sources, targets))


def packed_pairs(split: Split, sides: dict[str, int], block: int, limits: Limits) -> tuple[Units, PackedRows]:
    """The split's pairs packed into rows of at most ``block`` framed tokens a side: the units (one a row,
    costing its tokens per side) and the rows, holding example indices. A pair longer than the block is
    cut, skipped or refused there as ``data.too_long`` says; a block over the length limit is a
    `ConfigError`."""
    if block > limits.max_length:
        raise ConfigError(
            f"data.packing.block_size ({block}) exceeds the length limit ({limits.max_length}: "
            "data.max_length or the model's max_positions)"
        )
    pairs = example_units(split, sides, limits=Limits(block, limits.too_long))
    packed = pack_rows(pairs.lengths, block=block)
    if pairs.examples is not None:  # some pairs were skipped: rows hold the kept ones' example indices
        packed = PackedRows(pairs.examples[packed.order], packed.starts, packed.lengths)
    where = split.where
    return Units(packed.lengths, name=lambda u: f"{where}: packed row {u}"), packed


class Seq2SeqCollator:
    """Example units -> a teacher-forced `Batch`: sources (B, S) and decoder inputs (B, T) right-padded,
    targets (B, T) padded with -100. With ``packed`` the units are packed rows of pairs, and the batch adds
    each token's pair id (``document_ids``, ``decoder_document_ids``; -1 on padding)."""

    def __init__(
        self,
        split: Split,
        units: Units,
        *,
        pad_id: int,
        start_id: int,
        source: Framing,
        target: Framing,
        max_length: int,
        packed: PackedRows | None = None,
    ) -> None:
        self.data, self.units = split.data, units
        self.pad_id, self.start_id, self.max_length = pad_id, start_id, max_length
        self.source, self.target = source, target
        self.packed = packed

    def __call__(self, units: np.ndarray, *, generator: torch.Generator | None = None) -> Batch:
        if self.packed is not None:
            return self._packed(units)
        examples = self.units.example_indices(units)
        sources = [self.source(ids, self.max_length) for ids in rows(self.data, examples, "source")]
        targets = [self.target(ids, self.max_length) for ids in rows(self.data, examples, "target")]
        input_ids, attention_mask = pad(sources, self.pad_id)  # (B, S)
        decoder_input_ids, decoder_mask = pad([[self.start_id, *ids[:-1]] for ids in targets], self.pad_id)
        labels, _ = pad(targets, IGNORE_INDEX)  # (B, T)
        inputs = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "decoder_input_ids": decoder_input_ids,
            "decoder_attention_mask": decoder_mask,
        }
        return Batch(inputs, labels, int(attention_mask.sum() + decoder_mask.sum()))

    def _packed(self, units: np.ndarray) -> Batch:
        """Packed rows -> a batch: each row its pairs end to end on both sides, with their pair ids."""
        assert self.packed is not None
        members = [self.packed.members(int(u)) for u in units]  # per row: its examples
        examples = np.concatenate(members)
        sources = iter([self.source(ids, self.max_length) for ids in rows(self.data, examples, "source")])
        targets = iter([self.target(ids, self.max_length) for ids in rows(self.data, examples, "target")])
        source_rows, target_rows, inputs_rows, source_docs, target_docs = [], [], [], [], []
        for row in members:
            pairs = [(next(sources), next(targets)) for _ in range(len(row))]
            source_rows.append([t for src, _ in pairs for t in src])
            target_rows.append([t for _, tgt in pairs for t in tgt])
            inputs_rows.append([t for _, tgt in pairs for t in (self.start_id, *tgt[:-1])])
            source_docs.append([d for d, (src, _) in enumerate(pairs) for _ in src])
            target_docs.append([d for d, (_, tgt) in enumerate(pairs) for _ in tgt])
        input_ids, attention_mask = pad(source_rows, self.pad_id)  # (B, S)
        decoder_input_ids, decoder_mask = pad(inputs_rows, self.pad_id)  # (B, T)
        labels, _ = pad(target_rows, IGNORE_INDEX)  # (B, T)
        inputs = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "document_ids": pad(source_docs, -1)[0],  # (B, S); padding: a pair of its own
            "decoder_input_ids": decoder_input_ids,
            "decoder_attention_mask": decoder_mask,
            "decoder_document_ids": pad(target_docs, -1)[0],  # (B, T)
        }
        return Batch(inputs, labels, int(attention_mask.sum() + decoder_mask.sum()))
