"""The training config: one pydantic model, read from YAML, that says everything a run needs.

    model:     {preset: transformer-tiny, overrides: {dropout: 0.1}}   # or {file: spec.yaml} / {spec: {...}}
                                                                        # or {init_from: a zoo or HF model folder}
    task:      {kind: seq2seq, bleu: true}                              # or just seq2seq; default: from the
                                                                        # model's family (task_settings)
    data:      {train: data/train.tsv, valid: data/valid.tsv}
    tokenizer: {kind: bpe, vocab_size: 8000}                            # or {path: tok.json}
    schedule:  {kind: noam, warmup_steps: 4000}
    batch:     {max_tokens: 4096}
    epochs:    10
    lora:      {r: 8, alpha: 16, targets: [qkv, out]}                  # optional: train low-rank adapters on
                                                                        # a frozen model.init_from (zoo.lora)

Relative paths are taken from the current directory, as a shell would. Every section forbids unknown
keys, so a typo is an error that names the field instead of a setting silently ignored. A task's own
settings live under ``task`` (`zoo.training.task_settings`); one written at its old place (``loss.dpo_beta``)
is refused with one line saying where it went, and a run folder's train_config.yaml written by an older
zoo is read with its settings moved there.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    model_validator,
)

from zoo.io.names import TRAIN_CONFIG_NAME
from zoo.spec import LoraSpec, limits
from zoo.spec.errors import CleanModel, format_validation_error, plain_tags
from zoo.spec.files import YAMLLimitError, read_yaml_file
from zoo.spec.model import _set_dotted
from zoo.training.task_settings import (
    TaskSettingsUnion,
    moved_in,
    moved_message,
    moved_override,
    normalized,
    translate_saved,
)

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A training config that cannot be read or does not validate; the message names the file and field."""


class Section(CleanModel):  # errors: one `field: problem` line each, no pydantic links (zoo.spec.errors)
    # Every float finite: `lr: .inf` is refused by name, as NaN is (pydantic passes inf through by default).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ModelSource(Section):
    """Where the model comes from: exactly one of ``preset``, ``file``, ``spec`` or ``init_from``, plus
    overrides.

    A bare string is shorthand: ``model: transformer-tiny`` (a preset) or ``model: my_spec.yaml`` (a file).
    """

    preset: str | None = None
    file: Path | None = None
    spec: dict[str, Any] | None = None
    init_from: Path | None = Field(
        None,
        description="Fine-tune a trained model: a zoo model folder (zoo.save, a run, a checkpoint) or a "
        "Hugging Face folder (config.json + safetensors). Its spec and weights start the run (a new head "
        "where the task needs another), and its tokenizer.json unless tokenizer.path is given.",
    )
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="Dotted spec fields to change, e.g. {'attention.num_heads': 8}."
    )

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, str | Path):
            is_file = str(data).endswith((".yaml", ".yml", ".json"))
            return {"file": data} if is_file else {"preset": data}
        return data

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelSource:
        sources = ("preset", "file", "spec", "init_from")
        given = [name for name in sources if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one of preset, file or spec, or init_from a trained model "
                f"(got {', '.join(given) or 'none'})"
            )
        return self


class ParallelFiles(Section):
    """Two line-aligned files: line i of ``source`` translates to line i of ``target``."""

    source: Path
    target: Path


class PreparedFiles(Section):
    """A folder written by ``zoo data prepare`` (`zoo.training.data.prepare`): token ids memory-mapped,
    never loaded whole."""

    prepared: Path


DataFiles = Path | ParallelFiles | PreparedFiles


class PackingConfig(Section):
    """causal_lm, masked_lm and chat: documents (conversations) framed, concatenated and cut into windows of
    ``block_size`` tokens (nanoGPT, transformers' ``group_texts``), instead of one padded line per example.
    seq2seq: whole (source, target) pairs, several a row, at most ``block_size`` tokens a side, each pair
    attending only to itself."""

    block_size: PositiveInt = Field(
        1024, description="Tokens per window (seq2seq: per row and side); at most the model's max_positions."
    )
    documents: Literal["joined", "separate"] | None = Field(
        None,
        description="joined (the language models' default): a window attends across document boundaries; "
        "separate: each document attends only to itself (a block-diagonal mask) and its positions restart "
        "at 0. seq2seq always packs pairs separately (joined is refused).",
    )


class DataConfig(Section):
    """Training text. seq2seq: a TSV file (``source<TAB>target``) or {source, target} files; language
    modelling: a plain text file, one example a line (blank lines are skipped); sequence classification:
    ``text<TAB>label`` lines or JSON lines ``{"text": ..., "label": ...}``; token classification: JSON lines
    ``{"tokens": [...], "tags": [...]}`` or CoNLL-style ``token<TAB>tag`` lines, a blank line between
    sentences (`zoo.training.tasks.classification`); chat: JSON lines of conversations
    (`zoo.training.tasks.chat`); image classification: an .npz of images and labels, or a folder of label
    folders (`zoo.training.tasks.images`). Any of them may instead be ``{prepared: DIR}``, a
    folder ``zoo data prepare`` wrote; raw files are prepared on the fly into a cache."""

    train: DataFiles
    valid: DataFiles | None = None
    packing: PackingConfig | None = Field(
        None,
        description="causal_lm / masked_lm / chat: pack documents into block_size windows; seq2seq: pack "
        "pairs into rows.",
    )
    on_bad_line: Literal["error", "skip"] = Field(
        "error", description="A bad line in raw files: stop naming it, or skip it (counted, with a warning)."
    )
    max_length: PositiveInt | None = Field(
        None, description="Longest sequence in tokens, special tokens included; default: model max_positions."
    )
    too_long: Literal["truncate", "skip", "error"] = Field(
        "truncate",
        description="What to do with a longer sequence: cut it (with a warning), drop it, or stop.",
    )


class TokenizerConfig(Section):
    """Load a tokenizer (``path``) or train one on the training data (``kind``, ``vocab_size``)."""

    path: Path | None = Field(None, description="An existing tokenizer.json (the target side if not shared).")
    source_path: Path | None = Field(None, description="An existing source tokenizer (shared: false).")
    kind: Literal["bpe", "wordpiece", "unigram"] = "bpe"
    vocab_size: PositiveInt = 8000
    min_frequency: PositiveInt = 2
    lowercase: bool = False
    shared: bool = Field(
        True, description="seq2seq: one vocabulary for both sides; false gives the source its own embedding."
    )

    @model_validator(mode="after")
    def _check(self) -> TokenizerConfig:
        if self.source_path is not None and self.shared:
            raise ValueError("source_path needs shared: false (a shared vocabulary has one tokenizer)")
        if (problem := limits.over_limit("vocab_size", self.vocab_size, limits.VOCAB)) is not None:
            raise ValueError(problem)  # the BPE trainer allocates by vocab_size: 10**12 aborts the process
        if self.min_frequency > limits.MAX_MIN_FREQUENCY:
            raise ValueError(
                f"min_frequency must be at most {limits.MAX_MIN_FREQUENCY:,} (a count of occurrences)"
            )
        return self


class OptimConfig(Section):
    """The optimizer; the learning rate itself comes from ``schedule``."""

    name: Literal["adam", "adamw", "adamw8bit", "adamw4bit"] = Field(
        "adam",
        description="adam | adamw (fp32 moments, 8 bytes per trained parameter) | adamw8bit | adamw4bit "
        "(torchao's AdamW with 8- / 4-bit block-quantised moments, about 2 / 1 bytes per parameter; the quant "
        "extra).",
    )
    betas: tuple[float, float] = (0.9, 0.98)  # section 5.3 of the paper
    eps: PositiveFloat = 1e-9
    weight_decay: float = Field(0.0, ge=0.0, description="Applied to matrices only, never biases or norms.")
    clip_grad_norm: PositiveFloat | None = Field(1.0, description="Max global gradient norm; null: no clip.")


class NoamSchedule(Section):
    """lr = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (Vaswani et al. 2017, eq. 3)."""

    kind: Literal["noam"] = "noam"
    warmup_steps: PositiveInt = 4000
    scale: PositiveFloat = 1.0


class WarmupSchedule(Section):
    """Linear warmup to ``lr``, then constant, linear or cosine decay to ``min_lr_ratio * lr``."""

    kind: Literal["constant", "linear", "cosine"]
    lr: PositiveFloat = 3e-4
    warmup_steps: NonNegativeInt = 0
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0)


Schedule = Annotated[NoamSchedule | WarmupSchedule, Field(discriminator="kind")]


class BatchConfig(Section):
    """Length-bucketed batches of at most ``max_tokens`` padded tokens (source + target) per process."""

    max_tokens: PositiveInt = 4096
    max_sentences: PositiveInt | None = None
    grad_accum: PositiveInt = Field(1, description="Batches per process summed into one optimizer step.")
    shuffle: bool = True


class LossConfig(Section):
    label_smoothing: float | None = Field(
        None,
        ge=0.0,
        lt=1.0,
        description="Default: 0.1 for seq2seq (the paper, section 5.4), else 0; for dpo, cDPO's label-flip "
        "probability.",
    )
    router_aux_coef: float = Field(
        0.001,
        ge=0.0,
        le=1.0,
        description="Mixture-of-Experts models: this times the router's load-balancing loss (the model "
        "output's aux_loss) is added to the objective, as transformers' router_aux_loss_coef; 0 = off.",
    )
    chunk_tokens: PositiveInt | Literal["auto"] | None = Field(
        "auto",
        description="causal_lm, chat and dpo: compute the loss through the LM head this many tokens at a time "
        "(zoo.losses.chunked: the same loss and gradients to float rounding, never every logit at once) in "
        "a batch that scores more tokens than that (one that fits a chunk is computed whole); auto (default): "
        "64M logits a chunk (523 tokens at a 128k vocabulary); null: all logits at once. Other tasks: auto "
        "or null.",
    )


class EvalConfig(Section):
    """When validation runs; what it scores beyond the loss is the task's (seq2seq's BLEU: its settings)."""

    every_steps: PositiveInt | None = Field(None, description="Validate every N steps; always at the end.")


class CheckpointConfig(Section):
    every_steps: PositiveInt | None = Field(None, description="Save a resumable checkpoint every N steps.")
    keep_last: PositiveInt = 2


class DistributedConfig(Section):
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp", description="Under torchrun: replicate (DDP) or shard (FSDP2 fully_shard per layer)."
    )


class TrainConfig(Section):
    """Everything a training run needs; `zoo.training.train(config)` runs it."""

    model: ModelSource
    task: TaskSettingsUnion | None = Field(
        None,
        description="The task and its own settings, {kind: dpo, beta: 0.1}, or its name alone (its settings "
        "at their defaults). Default: by model family (seq2seq, causal_lm, masked_lm), or the classification "
        "task of the model's heads.classifier.",
    )
    data: DataConfig
    tokenizer: TokenizerConfig = TokenizerConfig()
    optim: OptimConfig = OptimConfig()
    schedule: Schedule = NoamSchedule()
    batch: BatchConfig = BatchConfig()
    loss: LossConfig = LossConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    epochs: PositiveInt | None = None
    max_steps: PositiveInt | None = Field(None, description="Stop after this many optimizer steps.")
    output_dir: Path = Path("runs/train")
    seed: int = Field(0, ge=0, lt=2**64, description="Seeds every RNG; torch takes [0, 2**64).")
    device: str = Field("auto", description="auto (cuda when available), cpu, cuda, cuda:1, mps.")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto",
        description="Autocast dtype; fp16 adds dynamic loss scaling (GradScaler). auto: bf16 on CUDA, else "
        "fp32 (zoo.training.precision).",
    )
    max_skipped_steps: PositiveInt = Field(
        25,
        description="precision fp16: stop after this many optimizer steps in a row skipped for non-finite "
        "gradients (the loss scale has then halved as often: 65536 -> 0.002 by default); a few are normal "
        "while the scale settles. Other precisions stop at the first non-finite loss.",
    )
    num_threads: PositiveInt | None = Field(
        None,
        description="CPU threads for PyTorch (torch.set_num_threads); default: on the CPU, half the CPUs "
        "this process may use (at least 1; shared among torchrun's processes on the machine), on a GPU "
        "PyTorch's choice (zoo.training.threads).",
    )
    activation_checkpointing: bool = Field(False, description="Recompute each layer in backward.")
    compile: bool = Field(False, description="torch.compile the model.")
    distributed: DistributedConfig = DistributedConfig()
    lora: LoraSpec | None = Field(
        None,
        description="Fine-tune with LoRA adapters (zoo.lora) on the frozen model.init_from: r, alpha, dropout, "
        "targets ([encoder.|decoder.][self.|cross.]qkv|out|ffn_in|ffn_out), dora, quantize_base (nf4: "
        "QLoRA, the frozen projections stored 4-bit). The run saves adapter.safetensors and the merged model.",
    )
    log_every: PositiveInt = 10
    log_sinks: tuple[Literal["jsonl", "csv", "tensorboard"], ...] = Field(
        ("jsonl",),
        description="Where records go besides metrics.jsonl (always written): csv (metrics.csv), "
        "tensorboard (tensorboard/; needs `pip install tensorboard`).",
    )

    @model_validator(mode="before")
    @classmethod
    def _tags(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if found := moved_in(data):  # one line saying where, not "extra inputs are not permitted"
            raise ValueError(moved_message(data, found))
        # `schedule: {warmup_steps: 400}` means the paper's schedule; the union needs its tag to pick.
        if isinstance(data.get("schedule"), dict) and "kind" not in data["schedule"]:
            data = {**data, "schedule": {"kind": "noam", **data["schedule"]}}
        if isinstance(data.get("task"), str):  # `task: dpo` is the task with its settings at their defaults
            data = {**data, "task": normalized(data["task"])}
        elif isinstance(data.get("task"), dict) and "kind" not in data["task"]:
            raise ValueError("task: settings need the task's kind, e.g. {kind: dpo, beta: 0.1}")
        return data

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        if self.num_threads is not None and (
            problem := limits.threads_message("num_threads", self.num_threads)
        ):
            raise ValueError(problem)
        if self.epochs is None and self.max_steps is None:
            raise ValueError("give epochs or max_steps (or both: training stops at whichever comes first)")
        if self.lora is not None and self.model.init_from is None:
            raise ValueError(
                "lora needs model.init_from (a trained model to adapt): LoRA freezes the base weights, so a "
                "base trained from scratch would stay at its random initialisation"
            )
        eps = self.loss.label_smoothing
        if self.task is not None and eps is not None and (problem := self.task.label_smoothing_problem(eps)):
            raise ValueError(problem)
        if self.lora is not None and self.distributed.strategy == "fsdp":
            raise ValueError(
                "lora with distributed.strategy fsdp is not supported: use ddp (the adapters are a small "
                "fraction of the weights, and each process holds the frozen base whole)"
            )
        return self

    # -- reading and changing ----------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "training config") -> TrainConfig:
        """Validate a mapping; errors become one `ConfigError` listing ``dotted.field: problem`` lines (a
        setting at its old place: one line saying where it moved)."""
        if found := moved_in(data):
            raise ConfigError(f"{where}: {moved_message(data, found)}")
        if "task" in data:  # a long name is quoted bounded (`plain_tags`), as a tag
            data = {**data, "task": normalized(data["task"])}
        try:
            return cls.model_validate(plain_tags(data, [("schedule", "kind"), ("task", "kind")]))
        except ValidationError as error:
            raise ConfigError(
                f"{where}: invalid training config:\n{format_validation_error(error)}"
            ) from None

    @classmethod
    def from_yaml(
        cls, path: str | Path, *, init_from: str | Path | None = None, **overrides: Any
    ) -> TrainConfig:
        """Read a YAML (or JSON) file; ``overrides`` are dotted keys, e.g. ``**{"optim.eps": 1e-8}``;
        ``init_from`` replaces the file's model source, keeping its model.overrides (as `starting_from`),
        before the config is validated.

        Files over 10 MiB, or whose aliases expand past 100,000 values, are refused (`zoo.spec.files`). A run
        folder's ``train_config.yaml`` written by an older zoo is read with its task settings moved under
        ``task`` (`zoo.training.task_settings.translate_saved`; a warning says what moved).
        """
        path = Path(path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"{path}: training config not found")
        try:
            data = read_yaml_file(path, what="training config")
        except YAMLLimitError as error:
            raise ConfigError(f"{path}: refused: {error}") from None
        except (yaml.YAMLError, UnicodeDecodeError) as error:
            raise ConfigError(f"{path}: not valid YAML: {error}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: a training config must be a mapping, got {type(data).__name__}")
        if (
            path.name == TRAIN_CONFIG_NAME
        ):  # what a run wrote, perhaps an older zoo: its settings read where now
            try:
                data, notes = translate_saved(data)
            except ValueError as error:
                raise ConfigError(f"{path}: written by an older zoo: {error}") from None
            for note in notes:
                log.warning("%s: written by an older zoo: %s", path, note)
        data = _with_overrides(data, overrides)
        if init_from is not None:
            model = data.get("model")
            kept = model.get("overrides", {}) if isinstance(model, dict) else {}
            data["model"] = {"init_from": str(init_from), "overrides": kept}
        return cls.from_dict(data, where=str(path))

    def override(self, **changes: Any) -> TrainConfig:
        """A validated copy with dotted keys changed: ``config.override(**{"batch.max_tokens": 512})``."""
        return TrainConfig.from_dict(_with_overrides(self._given(), changes))

    def starting_from(self, path: str | Path) -> TrainConfig:
        """The same run fine-tuning the model at ``path`` (``model.init_from``), keeping model.overrides."""
        data = self._given()
        data["model"] = {"init_from": str(path), "overrides": self.model.overrides}
        return TrainConfig.from_dict(data)

    def _given(self) -> dict[str, Any]:
        """The config as it was given (defaults left out), its task's kind named even when the settings
        were built in Python (``DPOSettings(beta=0.2)`` leaves its kind at the default, unset)."""
        data = self.model_dump(mode="json", exclude_unset=True)
        if self.task is not None:
            data["task"] = {"kind": self.task.kind, **data.get("task", {})}
        return data

    def to_yaml(self) -> str:
        """The full config, every default explicit (what a run writes to ``<output_dir>/train_config.yaml``)."""
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False, allow_unicode=True)


def _with_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the dotted ``overrides`` set (``task.beta`` reaches into ``task: dpo`` too); one at a
    setting's old place is a `ConfigError` saying where it moved."""
    if "task" in data:
        data["task"] = normalized(data["task"])
    for key, value in overrides.items():
        if (moved := moved_override(key, value, data.get("task"))) is not None:
            raise ConfigError(moved)
        _set_dotted(data, key, value)
    return data
