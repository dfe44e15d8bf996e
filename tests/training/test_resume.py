"""Checkpoints: resuming continues exactly; a failed save never leaves a checkpoint that looks complete."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import zoo
from zoo.io.tokenizer import train_tokenizer
from zoo.training import Trainer, TrainerState, train
from zoo.training.config import OptimConfig, TrainConfig
from zoo.training.data import DataError
from zoo.training.distributed import start_runtime
from zoo.training.optim import build_optimizer
from zoo.training.run import checkpoints as checkpoints_module
from zoo.training.run.checkpoints import latest_checkpoint, list_checkpoints
from zoo.training.run.resume import CheckpointIO
from zoo.training.run.state import rng_state
from zoo.training.setup import Tokenizers


def losses(run: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["loss"] is not None}


@pytest.fixture
def resumable(make_config: Callable[..., TrainConfig]) -> Callable[..., TrainConfig]:
    """Dropout on (so the RNG must be restored), 2 accumulated batches a step, ~2 steps an epoch."""

    def make(output_dir: Path, max_steps: int) -> TrainConfig:
        return make_config(
            output_dir=str(output_dir),
            max_steps=max_steps,
            **{"model.overrides.dropout": 0.1, "batch.max_tokens": 1500, "batch.grad_accum": 2},
            checkpoint={"every_steps": 3, "keep_last": 5},
        )

    return make


def test_resuming_gives_the_same_losses_and_weights_as_a_straight_run(
    resumable: Callable[..., TrainConfig], tmp_path: Path
) -> None:
    straight = train(resumable(tmp_path / "straight", 6))
    assert straight.step == 6
    first = train(resumable(tmp_path / "split", 3))
    assert first.step == 3 and latest_checkpoint(tmp_path / "split").name == "step-00000003"
    second = train(resumable(tmp_path / "split", 6), resume=True)
    assert second.step == 6
    expected, got = losses(tmp_path / "straight"), losses(tmp_path / "split")
    assert sorted(got) == [1, 2, 3, 4, 5, 6]  # no step recorded twice
    for step in (4, 5, 6):
        assert abs(expected[step] - got[step]) < 1e-6
    for (name, a), (_, b) in zip(straight.model.state_dict().items(), second.model.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-6), name


def test_failed_save_leaves_the_previous_checkpoint_intact(
    resumable: Callable[..., TrainConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    real_save_file = checkpoints_module.save_file

    def failing_save_file(tensors: dict, path: str, metadata: dict | None = None) -> None:
        if "step-00000006" in path:
            real_save_file(tensors, path, metadata=metadata)
            raise OSError("disk full")
        real_save_file(tensors, path, metadata=metadata)

    monkeypatch.setattr(checkpoints_module, "save_file", failing_save_file)
    with pytest.raises(OSError, match="disk full"):
        train(resumable(run, 6))
    assert [p.name for p in list_checkpoints(run)] == ["step-00000003"]
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-00000003"]  # no temp left behind
    monkeypatch.undo()
    resumed = train(resumable(run, 6), resume=True)
    assert resumed.step == 6


def test_a_finished_run_is_not_silently_overwritten(make_config: Callable[..., TrainConfig]) -> None:
    config = make_config(max_steps=1)
    train(config)  # no checkpoint.every_steps: nothing to resume from, so the message does not offer it
    with pytest.raises(FileExistsError, match="already holds a training run that saved no checkpoint"):
        train(config)
    saving = config.override(checkpoint={"every_steps": 1})
    train(saving, overwrite=True)
    with pytest.raises(FileExistsError, match="already holds a training run; resume it"):
        train(saving)
    assert train(config, overwrite=True).step == 1
    with pytest.raises(ValueError, match="no complete checkpoint to resume from"):
        train(config, resume=True)


def test_bad_data_stops_the_run_before_the_first_step(
    make_config: Callable[..., TrainConfig], toy_files: tuple[Path, Path], tmp_path: Path
) -> None:
    bad_valid = tmp_path / "valid.tsv"
    bad_valid.write_text(toy_files[1].read_text() + "a line without a tab\n", encoding="utf-8")
    config = make_config(**{"data.valid": str(bad_valid)})
    with pytest.raises(DataError, match=r"valid\.tsv:21: expected 2 tab-separated columns, found no tab"):
        Trainer(config)
    assert not (config.output_dir / "metrics.jsonl").exists()
    assert not (
        config.output_dir / "tokenizer.json"
    ).exists()  # the data is checked before anything is written
    assert latest_checkpoint(config.output_dir) is None


def test_resuming_with_a_different_model_is_refused(
    resumable: Callable[..., TrainConfig], tmp_path: Path
) -> None:
    train(resumable(tmp_path / "run", 3))
    other = resumable(tmp_path / "run", 6).override(**{"model.overrides.ffn.d_ff": 128})
    with pytest.raises(ValueError, match="model spec differs from this config's in: ffn"):
        train(other, resume=True)


def test_checkpoint_io_restores_saved_parts_bit_exactly_without_a_trainer(
    toy_files: tuple[Path, Path], tmp_path: Path
) -> None:
    tokenizer = train_tokenizer([toy_files[0]], kind="bpe", vocab_size=200)
    spec = zoo.preset("transformer-tiny").override(
        vocab_size=tokenizer.vocab_size, d_model=32, num_layers=1, max_positions=32, **{"ffn.d_ff": 64}
    )
    runtime = start_runtime("cpu")

    def parts(seed: int) -> CheckpointIO:
        torch.manual_seed(seed)
        model = zoo.build(spec)
        optimizer = build_optimizer(model, OptimConfig())
        return CheckpointIO(
            model=model,
            optimizer=optimizer,
            runtime=runtime,
            spec=spec,
            tokenizers=Tokenizers(tokenizer),
            output_dir=tmp_path / "run",
            grad_accum=2,
        )

    saved = parts(seed=0)
    ids = torch.randint(5, spec.vocab_size, (2, 6))
    saved.model(ids, decoder_input_ids=ids).logits.square().mean().backward()
    saved.optimizer.step()  # Adam moments and a step count to save
    state = TrainerState(step=7, epoch=2, position=4, elapsed_s=12.5, rng=rng_state(runtime.device))
    path = saved.save_checkpoint(state)
    assert path == latest_checkpoint(tmp_path / "run")

    fresh = parts(seed=1)  # other weights, no optimizer state
    torch.rand(3)  # and the RNG moved on
    loaded = fresh.load(path)
    assert loaded.progress() == state.progress() == {"step": 7, "epoch": 2, "position": 4, "elapsed_s": 12.5}
    assert loaded.output_dir == tmp_path / "run"
    assert torch.equal(loaded.rng["cpu"], state.rng["cpu"])  # type: ignore[index]
    assert torch.equal(torch.get_rng_state(), state.rng["cpu"])  # type: ignore[index]  # restored in place
    for (name, a), (_, b) in zip(saved.model.state_dict().items(), fresh.model.state_dict().items()):
        assert torch.equal(a, b), name
    before, after = saved.optimizer.state_dict(), fresh.optimizer.state_dict()
    # torch's set_optimizer_state_dict hands betas back as a list; Adam unpacks either the same way.
    groups = [[{**g, "betas": tuple(g["betas"])} for g in d["param_groups"]] for d in (before, after)]
    assert groups[0] == groups[1]
    assert before["state"].keys() == after["state"].keys()
    for index, values in before["state"].items():
        for key, value in values.items():
            assert torch.equal(value, after["state"][index][key]), (index, key)


def snapshot(run: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every file under ``run`` (but the lock) with its bytes, inode and mtime: a rewrite shows."""
    return {
        str(p.relative_to(run)): (p.read_bytes(), p.stat().st_ino, p.stat().st_mtime_ns)
        for p in sorted(run.rglob("*"))
        if p.is_file() and p.name != ".zoo-train.lock"
    }


def test_a_refused_resume_changes_nothing_in_the_output_dir(
    resumable: Callable[..., TrainConfig], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    train(resumable(run, 3))
    before = snapshot(run)
    other = resumable(run, 6).override(**{"model.overrides.ffn.d_ff": 128})
    with pytest.raises(ValueError, match="model spec differs"):
        train(other, resume=True)
    assert snapshot(run) == before  # train_config.yaml, tokenizer.json, run.json, metrics.jsonl untouched


def test_resume_drops_a_torn_last_record_and_names_its_line(
    resumable: Callable[..., TrainConfig], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = tmp_path / "run"
    train(resumable(run, 3))
    metrics = run / "metrics.jsonl"
    whole = len(metrics.read_text().splitlines())
    with metrics.open("a") as f:
        f.write('{"step": 4, "loss"')  # a full disk cut the record short
    with caplog.at_level("WARNING", logger="zoo.training"):
        assert train(resumable(run, 6), resume=True).step == 6
    assert f"{metrics}, line {whole + 1}: an incomplete last record" in caplog.text
    assert sorted(losses(run)) == [1, 2, 3, 4, 5, 6]


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-7])


CORRUPTIONS: dict[str, tuple[str, Callable[[Path], None]]] = {
    "a torn trainer_state.json": (
        "trainer_state.json: not valid JSON",
        lambda p: p.write_text('{"step": 6, "ep'),
    ),
    "an incomplete trainer_state.json": (
        "trainer_state.json: incomplete: no valid epoch, position",
        lambda p: p.write_text('{"step": 6, "elapsed_s": 1.0, "world_size": 1, "grad_accum": 2}'),
    ),
    "a truncated optimizer.safetensors": ("optimizer.safetensors: truncated", _truncate),
    "a truncated rng.safetensors": ("rng.safetensors: truncated", _truncate),
    "a truncated model.safetensors": ("model.safetensors: truncated", _truncate),
    "a missing rng.safetensors": ("rng.safetensors missing", Path.unlink),
}
FILE_OF = {
    "a torn trainer_state.json": "trainer_state.json",
    "an incomplete trainer_state.json": "trainer_state.json",
    "a truncated optimizer.safetensors": "optimizer.safetensors",
    "a truncated rng.safetensors": "rng.safetensors",
    "a truncated model.safetensors": "model.safetensors",
    "a missing rng.safetensors": "rng.safetensors",
}


def test_resume_falls_back_to_the_newest_checkpoint_that_verifies(
    resumable: Callable[..., TrainConfig], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    original = tmp_path / "original"
    train(resumable(original, 6))  # checkpoints at steps 3 and 6
    for number, (case, (problem, corrupt)) in enumerate(CORRUPTIONS.items()):
        run = tmp_path / f"run{number}"
        shutil.copytree(original, run)
        corrupt(run / "checkpoints" / "step-00000006" / FILE_OF[case])
        caplog.clear()
        with caplog.at_level("WARNING", logger="zoo.training"):
            resumed = train(resumable(run, 6), resume=True)
        assert resumed.step == 6, case
        assert (
            f"resuming from {run}/checkpoints/step-00000003; skipped the newer step-00000006 (" in caplog.text
        )
        assert problem in caplog.text, (case, caplog.text)
        assert sorted(losses(run)) == [1, 2, 3, 4, 5, 6], case  # steps 4-6 redone, not duplicated


def test_resume_without_a_checkpoint_that_verifies_lists_each_one_and_its_problem(
    resumable: Callable[..., TrainConfig], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    train(resumable(run, 6))
    _truncate(run / "checkpoints" / "step-00000006" / "optimizer.safetensors")
    (run / "checkpoints" / "step-00000003" / "trainer_state.json").write_text("{")
    before = snapshot(run)
    with pytest.raises(ValueError, match="none of its checkpoints can be resumed from") as refused:
        train(resumable(run, 9), resume=True)
    message = str(refused.value)
    assert "step-00000006 (optimizer.safetensors: truncated" in message
    assert "step-00000003 (trainer_state.json: not valid JSON" in message
    with pytest.raises(ValueError, match=r"step-00000003: cannot resume from this checkpoint: trainer_state"):
        train(resumable(run, 9), resume=run / "checkpoints" / "step-00000003")
    assert snapshot(run) == before
