"""The training config: YAML in, every mistake named by its dotted field."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

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


def test_packing_is_for_language_models_only(tmp_path: Path) -> None:
    config = TrainConfig.from_dict(
        {
            "model": "transformer-tiny",
            "data": {"train": "a.tsv", "packing": {"block_size": 64}},
            "epochs": 1,
            "output_dir": str(tmp_path / "run"),
        }
    )
    assert config.data.packing is not None and config.data.packing.documents == "joined"
    with pytest.raises(ConfigError, match=r"data\.packing is for causal_lm, masked_lm and chat, not seq2seq"):
        Trainer(config, progress=False)


def test_example_translate_config_validates_and_its_data_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    from zoo.training.tasks import TASKS

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)  # the example's paths are relative to the repository root
    config = TrainConfig.from_yaml("examples/translate.yaml")
    assert config.model.preset == "transformer-tiny" and config.task == "seq2seq"
    task = TASKS["seq2seq"]
    train = [r.fields["source"] for r in task.records(task.source(config.data.train))]
    valid = [r.fields["source"] for r in task.records(task.source(config.data.valid))]
    assert len(train) == 3000 and len(valid) == 300
    assert not set(train) & set(valid)


def test_a_seed_outside_torchs_range_is_refused_when_the_config_loads() -> None:
    import pytest

    from zoo.training.config import ConfigError, TrainConfig

    with pytest.raises(ConfigError, match=r"seed: Input should be less than 18446744073709551616"):
        TrainConfig.from_yaml("examples/translate.yaml", seed=2**80)
