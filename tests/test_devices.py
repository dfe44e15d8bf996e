"""Device strings are checked up front, with messages that name the device (this machine has no CUDA)."""

from __future__ import annotations

import pytest
import torch

from zoo.devices import resolve_device


def test_auto_is_the_gpu_when_there_is_one_else_the_cpu() -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_cuda_without_cuda_says_so(name: str) -> None:
    with pytest.raises(ValueError, match=rf"device '{name}' requested but CUDA is not available"):
        resolve_device(name)


def test_a_misspelt_device_is_named() -> None:
    with pytest.raises(ValueError, match=r"device 'gpu' is not a device; expected auto, cpu, cuda"):
        resolve_device("gpu")


def test_cuda_means_the_process_gpu_only_when_a_rank_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda", local_rank=1) == torch.device("cuda:1")
    assert resolve_device("cuda") == torch.device("cuda")
    with pytest.raises(ValueError, match=r"only 2 CUDA device\(s\) exist"):
        resolve_device("cuda:2")
