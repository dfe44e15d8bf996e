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
from zoo.training.config import ParallelFiles, TokenizerConfig
from zoo.training.data.sources import OnBadLine, Record, Source, iter_records
from zoo.training.evaluate import bleu
from zoo.training.task_settings import Seq2SeqSettings
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
        return Seq2SeqCollator(
            split,
            units,
            pad_id=spec.pad_token_id,
            start_id=start_id,
            source=Framing(eos=tokenizers.for_source.eos_id),
            target=Framing(eos=tokenizers.target.eos_id),
            max_length=limits.max_length,
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


class Seq2SeqCollator:
    """Example units -> a teacher-forced `Batch`: sources (B, S) and decoder inputs (B, T) right-padded,
    targets (B, T) padded with -100."""

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
    ) -> None:
        self.data, self.units = split.data, units
        self.pad_id, self.start_id, self.max_length = pad_id, start_id, max_length
        self.source, self.target = source, target

    def __call__(self, units: np.ndarray, *, generator: torch.Generator | None = None) -> Batch:
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
