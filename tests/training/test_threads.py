"""The CPU threads a training run uses when its config does not say (`zoo.training.threads`): never more than
half the CPUs, so that torch's threads do not wait on cores that other work holds."""

from __future__ import annotations

import pytest
import torch

from zoo.training.threads import resolve_threads


@pytest.mark.parametrize(
    ("cpus", "processes", "threads"),
    [(1, 1, 1), (2, 1, 1), (3, 1, 1), (4, 1, 2), (16, 1, 8), (16, 4, 2), (16, 16, 1), (2, 2, 1)],
)
def test_a_cpu_run_takes_half_the_cpus_shared_among_the_local_processes(
    cpus: int, processes: int, threads: int
) -> None:
    assert resolve_threads(None, device_type="cpu", cpus=cpus, processes=processes) == threads


def test_a_two_core_machine_trains_on_one_thread() -> None:
    """docs/training.md's DPO example: 48 s with torch's 2 threads, 9 s with 1, on a shared 2-core machine."""
    assert resolve_threads(None, device_type="cpu", cpus=2, processes=1) == 1


def test_the_config_wins_and_a_gpu_run_keeps_torchs_choice() -> None:
    assert resolve_threads(3, device_type="cpu", cpus=2, processes=1) == 3
    assert resolve_threads(None, device_type="cuda", cpus=16, processes=1) is None


def test_a_run_sets_the_resolved_count(tmp_path, monkeypatch) -> None:
    """What the trainer does with it: torch.set_num_threads, before anything is built."""
    from support import tiny_seq2seq_run

    from zoo.training import TrainConfig, train

    seen: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", seen.append)
    monkeypatch.setattr("zoo.training.threads.available_cpus", lambda: 4)
    config = tiny_seq2seq_run(tmp_path, train_size=50, valid_size=5, max_steps=1, device="cpu")
    train(TrainConfig.model_validate(config), progress=False)
    assert seen == [2]
