"""The training config: YAML in, every mistake named by its dotted field."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from zoo.training import Trainer
from zoo.training.config import ConfigError, NoamSchedule, ParallelFiles, TrainConfig

MINIMAL = "model: transformer-tiny\ndata: {train: train.tsv}\nmax_steps: 10\n"


def test_minimal_yaml_gets_the_papers_defaults(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(MINIMAL, encoding="utf-8")
    config = TrainConfig.from_yaml(path)
    assert config.model.preset == "transformer-tiny"
    assert config.schedule == NoamSchedule(warmup_steps=4000, scale=1.0)
    assert (config.optim.name, config.optim.betas, config.optim.eps) == ("adam", (0.9, 0.98), 1e-9)
    assert config.tokenizer.shared and config.precision == "auto"


def test_model_shorthand_means_a_preset_or_a_spec_file() -> None:
    base = {"data": {"train": "x.tsv"}, "max_steps": 1}
    assert TrainConfig.from_dict({**base, "model": "gpt2-tiny"}).model.preset == "gpt2-tiny"
    assert TrainConfig.from_dict({**base, "model": "my.yaml"}).model.file == Path("my.yaml")
    with pytest.raises(ConfigError, match="model: give exactly one of preset, file or spec"):
        TrainConfig.from_dict({**base, "model": {"preset": "gpt2-tiny", "file": "x.yaml"}})


def test_unknown_keys_and_bad_values_name_the_field(tmp_path: Path) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text(MINIMAL + "batch: {max_token: 10}\noptim: {eps: -1}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as error:
        TrainConfig.from_yaml(path)
    message = str(error.value)
    assert "typo.yaml" in message and "batch.max_token: Extra inputs are not permitted" in message
    assert "optim.eps: Input should be greater than 0" in message


def test_a_run_needs_a_length() -> None:
    with pytest.raises(ConfigError, match="give epochs or max_steps"):
        TrainConfig.from_dict({"model": "transformer-tiny", "data": {"train": "x.tsv"}})


def test_a_missing_config_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="training config not found"):
        TrainConfig.from_yaml(tmp_path / "nope.yaml")


def test_schedule_without_kind_is_the_papers(make_config: Callable[..., TrainConfig]) -> None:
    config = make_config(schedule={"warmup_steps": 7})
    assert config.schedule == NoamSchedule(warmup_steps=7)
    cosine = make_config(schedule={"kind": "cosine", "lr": 1e-3, "warmup_steps": 5})
    assert cosine.schedule.kind == "cosine"


def test_override_and_yaml_round_trip(make_config: Callable[..., TrainConfig]) -> None:
    config = make_config().override(**{"batch.max_tokens": 123, "data.valid": {"source": "a", "target": "b"}})
    assert config.batch.max_tokens == 123
    assert config.data.valid == ParallelFiles(source=Path("a"), target=Path("b"))
    import yaml

    assert TrainConfig.from_dict(yaml.safe_load(config.to_yaml())) == config


def test_parallel_files_are_for_seq2seq_only(tmp_path: Path) -> None:
    config = TrainConfig.from_dict(
        {
            "model": "gpt2-tiny",
            "data": {"train": {"source": "a", "target": "b"}},
            "epochs": 1,
            "output_dir": str(tmp_path / "run"),
        }
    )
    with pytest.raises(ConfigError, match="files are for seq2seq, not causal_lm"):
        Trainer(config, progress=False)  # the task (the model's natural one) refuses them, before reading
    assert not (tmp_path / "run" / "tokenizer.json").exists()


def test_packing_is_for_language_models_and_seq2seq_only(tmp_path: Path) -> None:
    config = TrainConfig.from_dict(
        {
            "model": "bert-tiny",
            "task": "sequence_classification",
            "data": {"train": "a.tsv", "packing": {"block_size": 64}},
            "epochs": 1,
            "output_dir": str(tmp_path / "run"),
        }
    )
    assert config.data.packing is not None and config.data.packing.documents is None  # the task's default
    with pytest.raises(
        ConfigError,
        match=r"data\.packing is for causal_lm, masked_lm, chat and seq2seq, not sequence_classification",
    ):
        Trainer(config, progress=False)


def test_seq2seq_refuses_joined_pairs(tmp_path: Path) -> None:
    config = TrainConfig.from_dict(
        {
            "model": "transformer-tiny",
            "data": {"train": "a.tsv", "packing": {"block_size": 64, "documents": "joined"}},
            "epochs": 1,
            "output_dir": str(tmp_path / "run"),
        }
    )
    with pytest.raises(ConfigError, match=r"^data\.packing\.documents: joined would let a pair attend"):
        Trainer(config, progress=False)


def test_example_translate_config_validates_and_its_data_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    from zoo.training.tasks import build_task

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)  # the example's paths are relative to the repository root
    config = TrainConfig.from_yaml("examples/translate.yaml")
    assert config.model.preset == "transformer-tiny" and config.task is not None
    task = build_task(config.task)
    assert task.name == "seq2seq" and task.settings == config.task
    train = [r.fields["source"] for r in task.records(task.source(config.data.train))]
    valid = [r.fields["source"] for r in task.records(task.source(config.data.valid))]
    assert len(train) == 3000 and len(valid) == 300
    assert not set(train) & set(valid)


def test_a_seed_outside_torchs_range_is_refused_when_the_config_loads() -> None:
    import pytest

    from zoo.training.config import ConfigError, TrainConfig

    with pytest.raises(ConfigError, match=r"seed: Input should be less than 18446744073709551616"):
        TrainConfig.from_yaml("examples/translate.yaml", seed=2**80)


# --- each task's settings under `task` ---------------------------------------------------------------------


def test_a_task_takes_its_own_settings_and_a_bare_name_means_its_defaults() -> None:
    from zoo.training.task_settings import DPOSettings, MaskedLMSettings, Seq2SeqSettings

    base = {"model": "gpt2-tiny", "data": {"train": "x"}, "max_steps": 1}
    config = TrainConfig.from_dict({**base, "task": {"kind": "dpo", "beta": 0.2}})
    assert config.task == DPOSettings(beta=0.2, nll_coef=0.0)
    assert TrainConfig.from_dict({**base, "task": "dpo"}).task == DPOSettings()
    masked = TrainConfig.from_dict({**base, "task": {"kind": "masked_lm", "mlm_probability": 0.3}})
    assert masked.task == MaskedLMSettings(mlm_probability=0.3)
    assert TrainConfig.from_dict(base).task is None  # the model's own task, chosen at setup
    old_fields = {"dpo_beta", "dpo_nll_coef", "mlm_probability", "train_on_prompt", "bleu", "bleu_metric"}
    sections = (TrainConfig, *(type(getattr(config, name)) for name in ("loss", "data", "eval")))
    assert not old_fields & {field for section in sections for field in section.model_fields}
    # a setting of another task cannot be written down; nor settings without the task's kind
    with pytest.raises(ConfigError, match=r"task\.dpo\.mlm_probability: Extra inputs are not permitted"):
        TrainConfig.from_dict({**base, "task": {"kind": "dpo", "mlm_probability": 0.3}})
    with pytest.raises(
        ConfigError, match=r"task: settings need the task's kind, e.g. \{kind: dpo, beta: 0.1\}"
    ):
        TrainConfig.from_dict({**base, "task": {"beta": 0.3}})
    with pytest.raises(ConfigError, match=r"task: Input tag 'dpoo' found using 'kind' does not match"):
        TrainConfig.from_dict({**base, "task": "dpoo"})
    # dotted overrides reach into a task given by name; the saved config holds the settings whole
    changed = TrainConfig.from_dict({**base, "task": "seq2seq"}).override(**{"task.bleu_samples": 4})
    assert changed.task == Seq2SeqSettings(bleu_samples=4)
    assert "task:\n  kind: seq2seq\n  bleu: true\n" in changed.to_yaml()
    built = TrainConfig.model_validate({**base, "task": DPOSettings(beta=0.2)})  # its kind left unset
    assert built.override(max_steps=2).task == DPOSettings(beta=0.2)


@pytest.mark.parametrize(
    ("section", "old", "task", "new"),
    [
        ("loss", {"dpo_beta": 0.2}, "dpo", "task: {kind: dpo, beta: 0.2}"),
        (
            "loss",
            {"dpo_beta": 0.2, "dpo_nll_coef": 1.0},
            "dpo",
            "task: {kind: dpo, beta: 0.2, nll_coef: 1.0}",
        ),
        ("loss", {"mlm_probability": 0.3}, None, "task: {kind: masked_lm, mlm_probability: 0.3}"),
        ("data", {"train_on_prompt": True}, "chat", "task: {kind: chat, train_on_prompt: true}"),
        ("eval", {"bleu": False}, None, "task: {kind: seq2seq, bleu: false}"),
        ("eval", {"bleu_metric": "whitespace"}, "seq2seq", "task: {kind: seq2seq, bleu_metric: whitespace}"),
        (
            "eval",
            {"num_beams": 4, "max_new_tokens": 9},
            None,
            "task: {kind: seq2seq, num_beams: 4, max_new_tokens: 9}",
        ),
    ],
)
def test_a_setting_at_its_old_place_is_one_line_saying_where_it_moved(
    section: str, old: dict, task: str | None, new: str, tmp_path: Path
) -> None:
    path = tmp_path / "c.yaml"
    sections = {"data": {"train": "x", **(old if section == "data" else {})}}
    if section != "data":
        sections[section] = old
    path.write_text(yaml.safe_dump({"model": "gpt2-tiny", "task": task, "max_steps": 1, **sections}))
    with pytest.raises(ConfigError) as error:
        TrainConfig.from_yaml(path)
    olds = ", ".join(f"{section}.{name}" for name in old)
    assert str(error.value) == f"{path}: {olds} moved: write {new}"


def test_an_override_of_a_setting_at_its_old_place_says_which_to_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from zoo.cli import main

    path = tmp_path / "c.yaml"
    path.write_text("model: gpt2-tiny\ntask: dpo\ndata: {train: x}\nmax_steps: 1\n")
    with pytest.raises(ConfigError, match=r"^loss\.dpo_beta=0\.2 moved: set task\.beta=0\.2$"):
        TrainConfig.from_yaml(path, **{"loss.dpo_beta": 0.2})
    with pytest.raises(
        ConfigError, match=r"^eval\.bleu=false moved: set task=\{kind: seq2seq, bleu: false\}$"
    ):
        TrainConfig.from_yaml(path, **{"eval.bleu": False})  # the config's task is another: name it
    assert TrainConfig.from_yaml(path, **{"task.beta": 0.2}).task.beta == 0.2  # type: ignore[union-attr]
    assert main(["train", str(path), "--set", "loss.dpo_nll_coef=1"]) != 0
    err = capsys.readouterr().err
    assert "loss.dpo_nll_coef=1 moved: set task.nll_coef=1" in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.strip()]) == 1


# What `zoo demo` wrote to runs/demo/train_config.yaml before the task settings moved (every field explicit).
OLD_DEMO_RUN = """\
model: {preset: transformer-tiny, file: null, spec: null, init_from: null, overrides: {dropout: 0.1}}
task: seq2seq
data: {train: OUT/data/train.tsv, valid: OUT/data/valid.tsv, packing: null, on_bad_line: error,
  max_length: null, too_long: truncate, train_on_prompt: false}
tokenizer: {path: null, source_path: null, kind: bpe, vocab_size: 1000, min_frequency: 2, lowercase: false,
  shared: true}
optim: {name: adam, betas: [0.9, 0.98], eps: 1.0e-09, weight_decay: 0.0, clip_grad_norm: 1.0}
schedule: {kind: noam, warmup_steps: 100, scale: 0.3}
batch: {max_tokens: 4096, max_sentences: null, grad_accum: 1, shuffle: true}
loss: {label_smoothing: 0.1, mlm_probability: 0.15, dpo_beta: 0.1, dpo_nll_coef: 0.0, router_aux_coef: 0.001}
eval: {every_steps: 100, bleu: true, bleu_metric: sacrebleu, bleu_samples: null, num_beams: 1,
  max_new_tokens: null}
checkpoint: {every_steps: null, keep_last: 2}
epochs: null
max_steps: 300
output_dir: OUT
seed: 0
device: auto
precision: auto
max_skipped_steps: 25
num_threads: 1
activation_checkpointing: false
compile: false
distributed: {strategy: ddp}
lora: null
log_every: 10
log_sinks: [jsonl]
"""


def test_a_run_folder_written_before_the_settings_moved_is_read_with_them_moved(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from zoo.demo.config import is_demo_run
    from zoo.training.task_settings import MaskedLMSettings, Seq2SeqSettings

    out = tmp_path / "demo"
    out.mkdir()
    saved = out / "train_config.yaml"
    saved.write_text(OLD_DEMO_RUN.replace("OUT", str(out)))
    with caplog.at_level("WARNING", logger="zoo.training.config"):
        config = TrainConfig.from_yaml(saved)
    assert config.task == Seq2SeqSettings()  # the old dump's values, every one the default
    assert "written by an older zoo: eval.bleu, eval.bleu_metric" in caplog.text
    assert "loss.mlm_probability" not in caplog.text  # dropped quietly: at its default, never read
    assert is_demo_run(out)  # `zoo demo` still knows its own run, and may replace it
    # no task named: a setting away from its default goes to the one task that reads it
    unnamed = OLD_DEMO_RUN.replace("task: seq2seq", "task: null").replace(
        "bleu_samples: null", "bleu_samples: 20"
    )
    saved.write_text(unnamed.replace("OUT", str(out)))
    assert TrainConfig.from_yaml(saved).task == Seq2SeqSettings(bleu_samples=20)
    saved.write_text(
        unnamed.replace("OUT", str(out)).replace("mlm_probability: 0.15", "mlm_probability: 0.3")
    )
    with pytest.raises(
        ConfigError,
        match=r"written by an older zoo: .* are settings of masked_lm and seq2seq, and no task is named",
    ):
        TrainConfig.from_yaml(saved)
    saved.write_text(
        OLD_DEMO_RUN.replace("OUT", str(out)).replace("mlm_probability: 0.15", "mlm_probability: 0.3")
    )
    caplog.clear()
    with caplog.at_level("WARNING", logger="zoo.training.config"):
        assert TrainConfig.from_yaml(saved).task == Seq2SeqSettings()
    assert (
        "loss.mlm_probability: 0.3 dropped (a masked_lm setting; the run's task never read it)" in caplog.text
    )
    bert = unnamed.replace("bleu_samples: 20", "bleu_samples: null").replace(
        "mlm_probability: 0.15", "mlm_probability: 0.3"
    )
    saved.write_text(bert.replace("OUT", str(out)))
    assert TrainConfig.from_yaml(saved).task == MaskedLMSettings(mlm_probability=0.3)
    # the same file anywhere else is a config a person keeps: one line saying where the settings went
    mine = tmp_path / "mine.yaml"
    mine.write_text(OLD_DEMO_RUN.replace("OUT", str(out)))
    with pytest.raises(
        ConfigError, match=r"mine\.yaml: eval\.bleu, eval\.bleu_metric, .* moved: write task: "
    ):
        TrainConfig.from_yaml(mine)
