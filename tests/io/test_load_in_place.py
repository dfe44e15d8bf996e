"""Loading holds no second copy of the weights: `zoo.load` and `zoo.from_hf` assign tensors straight from
the memory-mapped files, and every copy they must make (fused q/k/v, a cast) gives its source's file pages
back (`zoo.io.checkpoint.mapped`). Values are those of the files, sharded or not, whatever ``dtype`` casts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import zoo
from zoo.io.names import INDEX_NAME, WEIGHTS_NAME
from zoo.spec.presets import preset

ROOT = Path(__file__).resolve().parents[2]


def llama(dtype: torch.dtype, **overrides: object) -> zoo.ZooModel:
    """llama-tiny with random weights in ``dtype`` (norms and all, so a cast has something to change)."""
    model = zoo.build(preset("llama-tiny", **overrides), dtype=dtype)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn_like(parameter, dtype=torch.float32))
    return model


def shard_hf(folder: Path) -> None:
    """Split a Hugging Face folder's ``model.safetensors`` into two shards named by an index, as
    transformers writes large checkpoints."""
    tensors = load_file(folder / WEIGHTS_NAME)
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, held in halves.items():
        save_file({n: tensors[n] for n in held}, str(folder / shard), metadata={"format": "pt"})
    weight_map = {name: shard for shard, held in halves.items() for name in held}
    (folder / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / WEIGHTS_NAME).unlink()


def state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def assert_same(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> None:
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert ours[name].dtype == theirs[name].dtype, name
        assert torch.equal(ours[name], theirs[name]), name


@pytest.mark.parametrize("sharded", [False, True])
@pytest.mark.parametrize(
    ("stored", "cast"),
    [(torch.bfloat16, torch.float32), (torch.float16, torch.bfloat16), (torch.float32, torch.bfloat16)],
)
def test_a_cast_load_equals_the_plain_load_cast(
    tmp_path: Path, sharded: bool, stored: torch.dtype, cast: torch.dtype
) -> None:
    model = llama(stored)
    zoo.save(model, tmp_path / "zoo", max_shard_size="40KB" if sharded else "10GB")
    zoo.to_hf(model, tmp_path / "hf")
    if sharded:
        shard_hf(tmp_path / "hf")
        assert len(list((tmp_path / "zoo").glob("model-*.safetensors"))) > 1
    for load in (zoo.load, zoo.from_hf):
        folder = tmp_path / ("zoo" if load is zoo.load else "hf")
        plain, cast_model = load(folder), load(folder, dtype=cast)
        assert_same(state(plain), state(model))  # the stored values, bit for bit
        assert_same(state(cast_model), {n: t.to(cast) for n, t in state(plain).items()})


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads Linux's list of mappings")
def test_loaded_weights_are_views_of_the_file_where_nothing_is_fused(tmp_path: Path) -> None:
    """zoo.load (the file holds zoo's fused tensors) and from_hf's renamed tensors adopt the file's pages."""
    model = llama(torch.bfloat16)
    zoo.save(model, tmp_path / "zoo")
    zoo.to_hf(model, tmp_path / "hf")
    loaded, imported = zoo.load(tmp_path / "zoo"), zoo.from_hf(tmp_path / "hf")
    mapped = _file_mappings()
    assert all(_inside(p, mapped) for p in loaded.parameters())
    for name, parameter in imported.named_parameters():  # fused q/k/v and gate/up are copies; the rest not
        assert _inside(parameter, mapped) == ("qkv_proj" not in name and "up_proj" not in name), name


def test_a_second_load_leaves_the_first_models_writes_alone(tmp_path: Path) -> None:
    """Giving pages back touches only the mapping a load opened: a model loaded earlier from the same file
    and changed in place (its pages copied on write) keeps its values."""
    zoo.to_hf(llama(torch.bfloat16), tmp_path)
    first = zoo.from_hf(tmp_path)
    with torch.no_grad():
        for parameter in first.parameters():
            parameter.add_(1.0)
    before = state(first)
    second = zoo.from_hf(tmp_path, dtype=torch.float32)  # casts every tensor: releases every source
    assert_same(state(first), before)
    assert not torch.equal(second.embed.tokens.weight, first.embed.tokens.weight.float())


# -- peak memory, in a fresh process ----------------------------------------------------------------------

_CHILD = r"""
import gc, json, sys
from pathlib import Path
import torch, zoo

torch.set_num_threads(1)
folder = Path(sys.argv[1])

def status(key):
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith(key + ":"))
    return int(line.split()[1]) * 1024

def peak(load):
    gc.collect()
    base = status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark from here on
    model = load()
    with torch.no_grad():
        model(torch.arange(8)[None] + 3)  # every weight read: a mapped file's pages resident
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    result = (status("VmHWM") - base) / weights
    del model
    gc.collect()
    return result

peak(lambda: zoo.from_hf(folder / "hf"))  # warm-up: lazy imports, kernels, the page cache
print(json.dumps({
    "from_hf": peak(lambda: zoo.from_hf(folder / "hf")),
    "from_hf sharded, float32": peak(lambda: zoo.from_hf(folder / "hf-sharded", dtype=torch.float32)),
    "load sharded, float32": peak(lambda: zoo.load(folder / "zoo", dtype=torch.float32)),
}))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="reads Linux's resident-set peak")
def test_load_and_one_forward_peak_at_about_the_weights(tmp_path: Path) -> None:
    """A ~145 MB bf16 Llama (two thirds of each layer fused q/k/v and gate/up), loaded and run once in a fresh
    process: the resident set grows by the loaded weights, not by the file plus its fused or cast copies
    (before: 1.6x for from_hf, 1.5x for a float32 cast of zoo.load)."""
    overrides = {"d_model": 512, "num_layers": 6, "attention.num_heads": 8, "attention.num_kv_heads": 4}
    spec = preset("llama-tiny", **overrides, **{"ffn.d_ff": 2048, "vocab_size": 2048, "lm_head.tied": True})
    model = zoo.build(spec, dtype=torch.bfloat16, init=False)  # the values do not matter here
    zoo.save(model, tmp_path / "zoo", max_shard_size="20MB")
    zoo.to_hf(model, tmp_path / "hf")
    zoo.to_hf(model, tmp_path / "hf-sharded")
    shard_hf(tmp_path / "hf-sharded")
    del model
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MALLOC_MMAP_THRESHOLD_": "65536"}  # frees go back
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path)], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    ratios = json.loads(result.stdout.strip().splitlines()[-1])
    assert all(ratio < 1.3 for ratio in ratios.values()), ratios


def _file_mappings() -> list[tuple[int, int]]:
    """[start, end) of every file-backed mapping of a .safetensors file in this process."""
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[5].endswith(".safetensors"):
            low, high = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((low, high))
    return ranges


def _inside(tensor: torch.Tensor, ranges: list[tuple[int, int]]) -> bool:
    return any(low <= tensor.data_ptr() < high for low, high in ranges)
