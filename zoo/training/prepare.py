"""Everything resolved before the first step: task, tokenizers, the model spec, and the encoded data.

    prepared = setup(config, resume_from=None, runtime=runtime)   # once, by the Trainer
    prepared.task, prepared.spec, prepared.tokenizers, prepared.train_data, prepared.valid_data

``setup`` reads the config in one pass, in this order: the spec it names -> the task -> both data splits
(read and checked before anything is trained) -> tokenizer(s) -> the spec wired to them (and, for
classification, to the labels: `zoo.training.classification`) -> encoded data. Per-task reading and
encoding come from `zoo.training.tasks`.

The tokenizer decides the vocabulary, so it is wired into the spec: ``vocab_size`` becomes the
tokenizer's size (and ``source_vocab_size`` the source tokenizer's, with separate vocabularies). Special
ids follow the tokenizer too when zoo trained it (pad 0, bos 1, eos 2). A tokenizer loaded from a file
must agree with the special ids the spec sets (it fills those the spec leaves unset); fields given in
``model.overrides`` always win and are checked. Disagreement is an error naming both ids. A model started
from trained weights (``model.init_from``, `zoo.training.pretrained`) keeps its vocabulary size: its
tokenizer must fit it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import zoo.lora
from zoo.io.names import TOKENIZER_NAME
from zoo.io.tokenizer import Tokenizer, check_special_tokens, train_tokenizer
from zoo.models.build import build_model
from zoo.spec import EncoderSpec, ModelSpec, load_spec, parse_spec, preset
from zoo.training import pretrained, tasks
from zoo.training.classification import split_overrides, with_classifier, with_encoder_framing
from zoo.training.config import (
    CLASSIFIER_TASKS,
    FAMILY_OF_TASK,
    TASK_OF_FAMILY,
    ConfigError,
    Task,
    TrainConfig,
)
from zoo.training.data import EncodedExamples, TextExamples, corpus_lines
from zoo.training.distributed import Runtime, barrier
from zoo.training.labelled import LabelledText
from zoo.training.layout import SOURCE_TOKENIZER_NAME
from zoo.training.rundir import writing

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    """What a config resolves to before training: the trainer's inputs, each computed once."""

    task: Task
    spec: ModelSpec  # wired to the tokenizer(s): vocabulary sizes and special ids
    tokenizers: Tokenizers
    train_data: EncodedExamples
    valid_data: EncodedExamples | None
    valid_text: TextExamples | None  # the raw validation pairs, for BLEU
    init_from: Path | None = None  # trained weights to start from (`zoo.training.pretrained`)


def setup(
    config: TrainConfig,
    *,
    resume_from: Path | None,
    runtime: Runtime,
    before_writing: Callable[[], None] | None = None,
) -> Prepared:
    """Resolve ``config`` on every process. A fresh run: once the data has been read and checked,
    ``before_writing()`` (every process; the trainer clears a run it overwrites), then rank 0 trains or
    loads the tokenizers and saves them to ``config.output_dir``. A resumed run reads the ones saved in
    checkpoint ``resume_from`` and writes nothing: nothing changes until the resume has been accepted."""
    spec = base_spec(config)
    if config.lora is not None:
        check_lora_targets(spec, config)
    task = resolve_task(config, spec)
    train_text, valid_text = read_splits(config, task=task)
    if resume_from is not None:
        tokenizers = load_or_train_tokenizers(config, train_text, task=task, saved_dir=resume_from)
    else:
        if before_writing is not None:
            before_writing()
        tokenizers = shared_tokenizers(
            config, train_text, task=task, output_dir=config.output_dir, runtime=runtime
        )
    spec = wire_spec(spec, tokenizers, config, task=task)
    if isinstance(train_text, LabelledText):
        later = split_overrides(config.model.overrides)[1]
        spec = with_classifier(spec, task=task, train=train_text, overrides=later, where=_where(config))
    limit = max_length(config, spec)

    def encode(text: TextExamples) -> EncodedExamples:
        return encode_split(text, tokenizers, config, task=task, limit=limit, spec=spec)

    return Prepared(
        task=task,
        spec=spec,
        tokenizers=tokenizers,
        train_data=encode(train_text),
        valid_data=encode(valid_text) if valid_text is not None else None,
        valid_text=valid_text,
        init_from=config.model.init_from,
    )


def base_spec(config: TrainConfig) -> ModelSpec:
    """The spec the config names, before the tokenizer is wired in (overrides applied; for a
    classification task, those under ``heads.classifier`` wait for the classifier, made from the data)."""
    source = config.model
    if source.preset is not None:
        spec = preset(source.preset)
    elif source.file is not None:
        spec = load_spec(source.file)
    elif source.init_from is not None:
        spec = pretrained.read_spec(source.init_from)
    else:
        spec = parse_spec(source.spec)  # type: ignore[arg-type]
    overrides = source.overrides
    if config.task in tasks.CLASSIFICATION:
        overrides = split_overrides(overrides)[0]
    return spec.override(**overrides) if overrides else spec


def check_lora_targets(spec: ModelSpec, config: TrainConfig) -> None:
    """Refuse a ``lora.targets`` entry the model has nothing for (``cross.qkv`` on a decoder) before anything
    is written; the model is built on the meta device, which allocates nothing."""
    assert config.lora is not None
    try:
        zoo.lora.resolve_targets(build_model(spec, device="meta"), config.lora)
    except zoo.lora.LoraError as error:
        raise ConfigError(f"lora.{error.field or 'targets'}: {error}") from None


def resolve_task(config: TrainConfig, spec: ModelSpec) -> Task:
    """The config's task, or the natural one for the model (its family's, or its classifier's); a task the
    model cannot do is an error."""
    classifier = spec.heads.classifier if isinstance(spec, EncoderSpec) else None
    natural = CLASSIFIER_TASKS[classifier.task] if classifier is not None else TASK_OF_FAMILY[spec.family]
    task = config.task or natural
    if FAMILY_OF_TASK[task] != spec.family:
        raise ConfigError(f"task {task} needs a {FAMILY_OF_TASK[task]} model, but the model is {spec.family}")
    if task == "causal_lm" and spec.lm_head is None:  # type: ignore[union-attr]
        raise ConfigError("task causal_lm needs an LM head; the spec has lm_head: null")
    if task == "masked_lm" and spec.heads.mlm is None:  # type: ignore[union-attr]
        raise ConfigError("task masked_lm needs an MLM head; set heads.mlm in the spec (model.overrides)")
    return task


@dataclass
class Tokenizers:
    target: Tokenizer  # the shared one, or the target side
    source: Tokenizer | None = None  # only with separate vocabularies
    trained: bool = False  # zoo trained them for this run (so their special ids define the spec's)

    @property
    def for_source(self) -> Tokenizer:
        return self.source or self.target


def load_or_train_tokenizers(
    config: TrainConfig, train_text: TextExamples, *, task: Task, saved_dir: Path | None = None
) -> Tokenizers:
    """From ``saved_dir`` (a resumed run's checkpoint), from ``tokenizer.path`` (or ``model.init_from``),
    or trained on the training split. A classifier reads [CLS]: a tokenizer without framing of its own
    gets ``bos text eos`` as its post-processor, so it frames as training did wherever it goes
    (`zoo.training.classification.with_encoder_framing`)."""
    tokenizers = _load_or_train(config, train_text, task=task, saved_dir=saved_dir)
    if task in tasks.CLASSIFICATION:
        tokenizers.target = with_encoder_framing(tokenizers.target)
    return tokenizers


def _load_or_train(
    config: TrainConfig, train_text: TextExamples, *, task: Task, saved_dir: Path | None
) -> Tokenizers:
    cfg = config.tokenizer
    separate = task == "seq2seq" and not cfg.shared
    init_from = config.model.init_from
    if saved_dir is not None and (saved_dir / TOKENIZER_NAME).is_file():
        source = Tokenizer.from_file(saved_dir / SOURCE_TOKENIZER_NAME) if separate else None
        trained = cfg.path is None and init_from is None
        return Tokenizers(Tokenizer.from_file(saved_dir / TOKENIZER_NAME), source, trained=trained)
    path = cfg.path or (pretrained.tokenizer_path(init_from) if init_from is not None else None)
    if path is not None:
        source = None
        if separate:
            if cfg.source_path is None:
                raise ConfigError(
                    "tokenizer.shared is false: give tokenizer.source_path too, or neither path"
                )
            source = Tokenizer.from_file(cfg.source_path)
        return Tokenizers(Tokenizer.from_file(path), source)

    def train(side: str) -> Tokenizer:
        lines = corpus_lines(train_text, side=side)  # type: ignore[arg-type]
        return train_tokenizer(
            lines,
            kind=cfg.kind,
            vocab_size=cfg.vocab_size,
            min_frequency=cfg.min_frequency,
            lowercase=cfg.lowercase,
        )

    if separate:
        return Tokenizers(train("target"), train("source"), trained=True)
    return Tokenizers(train("both"), trained=True)


def shared_tokenizers(
    config: TrainConfig,
    train_text: TextExamples,
    *,
    task: Task,
    output_dir: Path,
    runtime: Runtime,
) -> Tokenizers:
    """A fresh run's tokenizers on every process: rank 0 loads or trains them and writes them to
    ``output_dir``; the other processes read what it wrote (one training, identical vocabularies)."""
    if runtime.is_main:
        output_dir.mkdir(parents=True, exist_ok=True)
        tokenizers = load_or_train_tokenizers(config, train_text, task=task)
        with writing(output_dir / TOKENIZER_NAME, hint="the run did not start"):
            save_tokenizers(tokenizers, output_dir)
    barrier(runtime)
    if not runtime.is_main:
        tokenizers = load_or_train_tokenizers(config, train_text, task=task, saved_dir=output_dir)
    return tokenizers


def save_tokenizers(tokenizers: Tokenizers, directory: Path) -> None:
    tokenizers.target.save(directory / TOKENIZER_NAME)
    if tokenizers.source is not None:
        tokenizers.source.save(directory / SOURCE_TOKENIZER_NAME)


def wire_spec(spec: ModelSpec, tokenizers: Tokenizers, config: TrainConfig, *, task: Task) -> ModelSpec:
    """The spec with the tokenizer's vocabulary size(s) and special ids, checked against each other."""
    explicit = set(config.model.overrides)
    if config.model.init_from is not None:
        explicit.add("vocab_size")  # trained embeddings: the tokenizer must fit them (checked below)
    tok = tokenizers.target
    changes: dict[str, object] = {}
    if "vocab_size" not in explicit:
        changes["vocab_size"] = tok.vocab_size
    for name in ("pad", "bos", "eos"):
        field, tok_id = f"{name}_token_id", tok.special_ids()[name]
        if (
            field not in explicit
            and tok_id is not None
            and (tokenizers.trained or getattr(spec, field) is None)
        ):
            changes[field] = tok_id
    if tokenizers.source is not None and "source_vocab_size" not in explicit:
        changes["source_vocab_size"] = tokenizers.source.vocab_size
    where = _where(config)
    try:
        wired = spec.override(**changes) if changes else spec
    except ValueError as error:
        raise ConfigError(f"{where}: the tokenizer does not fit the spec: {error}") from None
    check_special_tokens(
        tok,
        pad_token_id=wired.pad_token_id,
        bos_token_id=wired.bos_token_id,
        eos_token_id=wired.eos_token_id,
        vocab_size=wired.vocab_size,
        where=where,
    )
    if tokenizers.source is not None:
        if tokenizers.source.pad_id != wired.pad_token_id:
            raise ConfigError(
                f"{where}: the source tokenizer's pad id ({tokenizers.source.pad_id}) differs from "
                f"pad_token_id ({wired.pad_token_id})"
            )
        if tokenizers.source.vocab_size > (wired.source_vocab_size or 0):  # type: ignore[union-attr]
            raise ConfigError(
                f"{where}: the source tokenizer has {tokenizers.source.vocab_size} tokens but "
                f"source_vocab_size is {wired.source_vocab_size}"  # type: ignore[union-attr]
            )
    _check_task_tokens(wired, tokenizers, task=task, where=where)
    return wired


def _check_task_tokens(spec: ModelSpec, tokenizers: Tokenizers, *, task: Task, where: str) -> None:
    missing = []
    if spec.pad_token_id is None:
        missing.append("a pad token (batches are padded)")
    if task == "seq2seq" and tokenizers.for_source.eos_id is None:
        missing.append("an eos token (sources and targets end with it)")
    if task == "masked_lm" and tokenizers.target.mask_id is None:
        missing.append("a mask token ([MASK] or <mask>)")
    if missing:
        raise ConfigError(f"{where}: training needs {' and '.join(missing)}; the tokenizer/spec has none")


def _where(config: TrainConfig) -> str:
    source = config.model
    return f"model ({source.preset or source.file or source.init_from or 'inline spec'})"


def max_length(config: TrainConfig, spec: ModelSpec) -> int:
    """The longest sequence a batch may hold: data.max_length, at most the model's max_positions."""
    limit = config.data.max_length
    if limit is not None and limit > spec.max_positions:
        raise ConfigError(
            f"data.max_length ({limit}) exceeds the model's max_positions ({spec.max_positions})"
        )
    return limit or spec.max_positions


def encode_split(
    text: TextExamples,
    tokenizers: Tokenizers,
    config: TrainConfig,
    *,
    task: Task,
    limit: int,
    spec: ModelSpec | None = None,
) -> EncodedExamples:
    """One split's ids (`zoo.training.tasks.encode_split`); ``spec`` names a classifier's labels."""
    return tasks.encode_split(
        text,
        task=task,
        spec=spec,
        target_tokenizer=tokenizers.target,
        source_tokenizer=tokenizers.source,
        max_length=limit,
        too_long=config.data.too_long,
    )


def read_splits(config: TrainConfig, *, task: Task) -> tuple[TextExamples, TextExamples | None]:
    """Read and check both splits before anything else happens."""
    train = tasks.read_split(config.data.train, task=task)
    valid = tasks.read_split(config.data.valid, task=task) if config.data.valid is not None else None
    return train, valid
