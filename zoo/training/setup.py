"""Everything resolved before the first step: task, tokenizers, the model spec, and the prepared data.

    prepared = setup(config, resume_from=None, runtime=runtime)   # once, by the Trainer
    prepared.task, prepared.spec, prepared.tokenizers, prepared.train, prepared.valid

``setup`` reads the config in one pass, in this order: the spec it names -> the task (`zoo.training.tasks`,
which answers every task-specific question below) -> tokenizer(s) (loaded, or trained on the streamed
training text) -> the spec wired to them -> both data splits prepared (raw files encoded into the cache,
every line checked, before anything is written: `zoo.training.corpus`) -> the spec fitted to the data (a
classifier's labels).

The tokenizer decides the vocabulary, so it is wired into the spec: ``vocab_size`` becomes the
tokenizer's size (and ``source_vocab_size`` the source tokenizer's, with separate vocabularies). Special
ids follow the tokenizer too when zoo trained it (pad 0, bos 1, eos 2). A tokenizer loaded from a file
must agree with the special ids the spec sets (it fills those the spec leaves unset); fields given in
``model.overrides`` always win and are checked. Disagreement is an error naming both ids. A model started
from trained weights (``model.init_from``, `zoo.training.pretrained`) keeps its vocabulary size: its
tokenizer must fit it. Prepared data (``{prepared: DIR}``) needs the tokenizer it was prepared with
(``tokenizer.path``), since there is no text to train one on.

Under torchrun rank 0 trains the tokenizers and prepares the data; the other processes then read what it
wrote (the same vocabularies, the same cache folders).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import zoo.lora
from zoo.io.names import SOURCE_TOKENIZER_NAME, TOKENIZER_CONFIG_NAME, TOKENIZER_NAME
from zoo.io.paths import inside
from zoo.io.tokenizer import Tokenizer, check_special_tokens, train_tokenizer
from zoo.models.build import build_model
from zoo.spec import ModelSpec, load_spec, parse_spec, preset
from zoo.training import pretrained, tasks
from zoo.training.config import ConfigError, DataFiles, PreparedFiles, TokenizerConfig, TrainConfig
from zoo.training.corpus import prepare_split
from zoo.training.data.prepare import tokenizer_fingerprint
from zoo.training.data.sources import OnBadLine, data_files
from zoo.training.distributed import Runtime, barrier
from zoo.training.run.rundir import writing
from zoo.training.tasks import Task
from zoo.training.tasks.base import Limits, Split, Tokenizers

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    """What a config resolves to before training: the trainer's inputs, each computed once."""

    task: Task
    spec: ModelSpec  # wired to the tokenizer(s): vocabulary sizes and special ids (and a classifier's labels)
    tokenizers: Tokenizers
    train: Split
    valid: Split | None
    limits: Limits  # the length every sequence is cut to
    init_from: Path | None = None  # trained weights to start from (`zoo.training.pretrained`)


def setup(
    config: TrainConfig,
    *,
    resume_from: Path | None,
    runtime: Runtime,
    before_writing: Callable[[Prepared | None], None] | None = None,
) -> Prepared:
    """Resolve ``config`` on every process. A fresh run: once everything is resolved and the data has been
    prepared and checked (rank 0), ``before_writing(prepared)`` (every process, rank 0 given what it
    resolved and the others None: the trainer checks the rest of its setup, then clears a run it
    overwrites), then rank 0 saves the tokenizers to ``config.output_dir``. So a config that cannot train
    fails before anything is written there. A resumed run reads the tokenizers saved in checkpoint
    ``resume_from`` and writes nothing: nothing changes until the resume has been accepted."""
    spec = base_spec(config)
    if config.lora is not None:
        check_lora_targets(spec, config)
    task = resolve_task(config, spec)
    task.check_data(config.data)
    task.chunk_tokens(config.loss.chunk_tokens, spec)  # a number for a task that cannot chunk: refused now
    check_files(config, task)
    if resume_from is not None:
        tokenizers = load_or_train_tokenizers(config, task=task, saved_dir=resume_from)
        spec = wire_spec(spec, tokenizers, config, task=task)
        return _resolved(
            config, task, spec, tokenizers, _splits_in_turn(config, task, tokenizers, spec, runtime)
        )
    prepared = None
    if runtime.is_main:
        tokenizers = load_or_train_tokenizers(config, task=task)
        spec = wire_spec(spec, tokenizers, config, task=task)
        # every line is checked here; only the cache is written, nothing in the output folder
        prepared = _resolved(config, task, spec, tokenizers, prepare_splits(config, task, tokenizers, spec))
    if before_writing is not None:
        before_writing(prepared)
    if prepared is not None:
        config.output_dir.mkdir(parents=True, exist_ok=True)
        with writing(config.output_dir / TOKENIZER_NAME, hint="the run did not start"):
            save_tokenizers(prepared.tokenizers, config.output_dir)
    barrier(runtime)
    if prepared is None:  # what rank 0 wrote: the same tokenizers, the data found in the cache
        tokenizers = load_or_train_tokenizers(config, task=task, saved_dir=config.output_dir)
        spec = wire_spec(spec, tokenizers, config, task=task)
        prepared = _resolved(config, task, spec, tokenizers, prepare_splits(config, task, tokenizers, spec))
    return prepared


def _resolved(
    config: TrainConfig,
    task: Task,
    spec: ModelSpec,
    tokenizers: Tokenizers,
    splits: tuple[Split, Split | None],
) -> Prepared:
    """The spec fitted to the training data (a classifier's labels), and the length limits."""
    train, valid = splits
    later = task.spec_overrides(config.model.overrides)[1]
    spec = task.fit_spec(spec, train=train.data, overrides=later, where=_where(config))
    return Prepared(
        task=task,
        spec=spec,
        tokenizers=tokenizers,
        train=train,
        valid=valid,
        limits=limits_of(config, spec),
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
    if config.task is not None:  # a classifier's overrides wait for its head (`Task.spec_overrides`)
        overrides = tasks.build_task(config.task).spec_overrides(overrides)[0]
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
    """The config's task with its settings and ``data.packing``, or the natural one for the model
    (`zoo.training.tasks.resolve_task`)."""
    return tasks.resolve_task(config.task, spec, packing=config.data.packing, where=_where(config))


def check_files(config: TrainConfig, task: Task) -> None:
    """Refuse a missing data file or prepared folder up front, before a tokenizer is trained."""
    for files in (config.data.train, config.data.valid):
        if isinstance(files, PreparedFiles):
            if not files.prepared.is_dir():
                raise FileNotFoundError(
                    f"{files.prepared}: no prepared data there (zoo data prepare writes it)"
                )
        elif files is not None:
            data_files(task.source(files))


def load_or_train_tokenizers(config: TrainConfig, *, task: Task, saved_dir: Path | None = None) -> Tokenizers:
    """From ``saved_dir`` (a resumed run's checkpoint), from ``tokenizer.path`` (or ``model.init_from``; a
    ``tokenizer.path`` that is init_from's own tokenizer gives init_from's copy, chat template included:
    `_init_tokenizer_if_same`), or trained on the training split's text, streamed. The task frames it as its
    model reads it (a classifier's gets ``bos text eos`` as its post-processor, so it frames as training did
    wherever it goes: `zoo.training.tasks.labels.with_encoder_framing`)."""
    if not task.reads_text:  # images: nothing to tokenize
        if config.tokenizer != TokenizerConfig():
            raise ConfigError(f"tokenizer: {task.name} reads no text; leave the tokenizer section out")
        return Tokenizers(None)
    tokenizers = _load_or_train(config, task=task, saved_dir=saved_dir)
    tokenizers.target = task.frame_tokenizer(tokenizers.target)
    return tokenizers


def _load_or_train(config: TrainConfig, *, task: Task, saved_dir: Path | None) -> Tokenizers:
    cfg = config.tokenizer
    separate = task.separate_vocabularies(config.tokenizer)
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
        given = Tokenizer.from_file(path)
        if cfg.path is not None and init_from is not None:
            given = _init_tokenizer_if_same(given, init_from)
        return Tokenizers(given, source)
    train_files = config.data.train
    if isinstance(train_files, PreparedFiles):
        raise ConfigError(
            "data.train is prepared data: give tokenizer.path, the tokenizer it was prepared with "
            "(there is no text to train one on)"
        )

    def train(side: str) -> Tokenizer:
        return train_tokenizer(
            _lines(task, train_files, side, on_bad_line=config.data.on_bad_line),
            kind=cfg.kind,
            vocab_size=cfg.vocab_size,
            min_frequency=cfg.min_frequency,
            lowercase=cfg.lowercase,
        )

    if separate:
        return Tokenizers(train("target"), train("source"), trained=True)
    return Tokenizers(train("both"), trained=True)


def _init_tokenizer_if_same(given: Tokenizer, init_from: Path) -> Tokenizer:
    """The ``model.init_from`` folder's tokenizer when ``tokenizer.path`` (``given``) is the same tokenizer
    (the same ``tokenizer.json``) with no chat template of its own, else ``given``.

    A stage that starts from a run keeps that run's tokenizer, chat template included: a chat run wrote the
    template it fine-tuned with into its ``tokenizer_config.json``, and a later stage (DPO) given the bare
    ``tokenizer.json`` every stage shares would otherwise save, and export, the model without it. A given
    tokenizer with another vocabulary or its own template is what the stage asked for, and is used.
    """
    file = inside(init_from, TOKENIZER_NAME, error=ConfigError)  # not a link out of the folder
    if given.chat_templates or not file.is_file():
        return given
    theirs = Tokenizer.from_file(file)
    if tokenizer_fingerprint(theirs) != tokenizer_fingerprint(given):
        return given
    log.info(
        "tokenizer: %s is the one %s has; that folder's copy is used, with its settings",
        given.source,
        init_from,
    )
    return theirs


def _lines(task: Task, files: DataFiles, side: str, *, on_bad_line: OnBadLine) -> Iterator[str]:
    """The training split's text for a tokenizer, read as it streams (a bad line stops it, named)."""
    return task.tokenizer_lines(task.records(task.source(files, on_bad_line=on_bad_line)), side=side)


def save_tokenizers(tokenizers: Tokenizers, directory: Path) -> None:
    """The run's tokenizer(s), as `zoo.save` writes them: with ``tokenizer_config.json`` (its special tokens and
    chat template), so that the other processes and a resumed run render conversations with the same one.
    A run without a tokenizer (images) writes none."""
    if tokenizers.text is None:
        return
    tokenizers.target.save(directory / TOKENIZER_NAME)
    tokenizers.target.save_config(directory / TOKENIZER_CONFIG_NAME)
    if tokenizers.source is not None:
        tokenizers.source.save(directory / SOURCE_TOKENIZER_NAME)


def wire_spec(spec: ModelSpec, tokenizers: Tokenizers, config: TrainConfig, *, task: Task) -> ModelSpec:
    """The spec with the tokenizer's vocabulary size(s) and special ids, checked against each other (as
    it is for a task that reads no text)."""
    if tokenizers.text is None:
        return spec
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
    missing = task.missing_tokens(wired, tokenizers)
    if missing:
        raise ConfigError(f"{where}: training needs {' and '.join(missing)}; the tokenizer/spec has none")
    return wired


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


def limits_of(config: TrainConfig, spec: ModelSpec) -> Limits:
    """The run's length limit and what to do with a longer sequence (``data.too_long``)."""
    return Limits(max_length(config, spec), config.data.too_long)


def prepare_splits(
    config: TrainConfig, task: Task, tokenizers: Tokenizers, spec: ModelSpec
) -> tuple[Split, Split | None]:
    """Both splits prepared (or found prepared) and opened; packed data is never cut to length."""
    limits = None if config.data.packing is not None else limits_of(config, spec)

    def split(files: DataFiles, name: str) -> Split:
        return prepare_split(
            task, files, tokenizers, name=name, limits=limits, on_bad_line=config.data.on_bad_line
        )

    valid = config.data.valid
    return split(config.data.train, "train"), (split(valid, "valid") if valid is not None else None)


def _splits_in_turn(
    config: TrainConfig, task: Task, tokenizers: Tokenizers, spec: ModelSpec, runtime: Runtime
) -> tuple[Split, Split | None]:
    """`prepare_splits`, rank 0 first: the others then find its work in the cache."""
    if runtime.is_main:
        splits = prepare_splits(config, task, tokenizers, spec)
    barrier(runtime)
    if not runtime.is_main:
        splits = prepare_splits(config, task, tokenizers, spec)
    return splits
