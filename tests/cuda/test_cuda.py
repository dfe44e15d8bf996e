"""On a CUDA GPU: every family gives the CPU's logits, trains in bf16 (and fp16 with loss scaling), decodes
the same tokens compiled as eager, runs the demo end to end, and fits a training step in the memory
`zoo.summary` estimates. Run with ``make test-gpu`` (``pytest -m cuda -rs``); without CUDA every test here
is collected and skipped. Nothing CUDA-only is touched at import.

Tolerances, and why:

    fp32 logits     atol 1e-4 + rtol 1e-4 against the CPU: cuBLAS and the CPU's GEMMs sum in another order
                    (torch's default keeps float32 matmuls in full precision on CUDA: no TF32)
    bf16 logits     max |CUDA bf16 - CPU fp32| <= 2e-2 x max |CPU fp32 logit|: bf16 keeps 8 bits of mantissa
                    (2^-9 relative rounding per weight and activation), accumulated over the layers (CPU
                    bf16 against CPU fp32 measured 0.4-1.2e-2 over these models)
    peak memory     0.7 to 1.2 x the estimate (weights + gradients + Adam + activations, float32): the
                    estimate counts what autograd keeps, attention matrices included, which fused SDPA
                    kernels do not keep; temporaries (the logits' gradient, kernel buffers) come on top.
                    Measured with torch's MemTracker on CPU the ratio was 0.91-1.09 over these shapes.
"""

from __future__ import annotations

import copy
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from support import TINY_PRESETS, padded_batch

import zoo
from zoo.demo import toy_corpus, write_tsv
from zoo.training import train
from zoo.training.config import OptimConfig, TrainConfig
from zoo.training.optim import build_optimizer

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available())"),
]

CUDA = "cuda"  # a name, not a torch.device: nothing here asks torch about CUDA before a test runs

# Mid-size shapes, where the kernels CUDA picks differ from the tiny ones' (head dim 64: flash and
# memory-efficient attention; GQA with a padding mask: keys expanded; T5's relative bias: the math kernel).
MID_SIZE: dict[str, dict[str, Any]] = {
    "gpt2-mid": {
        "preset": "gpt2-tiny",
        "d_model": 512,
        "num_layers": 6,
        "attention.num_heads": 8,
        "ffn.d_ff": 2048,
    },
    "llama-mid": {
        "preset": "llama-tiny",
        "d_model": 512,
        "num_layers": 4,
        "attention.num_heads": 8,
        "attention.num_kv_heads": 2,
        "ffn.d_ff": 1408,
    },
    "t5-mid": {
        "preset": "t5-tiny",
        "d_model": 512,
        "num_layers": 4,
        "attention.num_heads": 8,
        "attention.head_dim": 64,
        "ffn.d_ff": 1024,
    },
}
SHARED = {"vocab_size": 8192, "max_positions": 512}
MODELS = TINY_PRESETS + list(MID_SIZE)
GENERATIVE = [name for name in TINY_PRESETS if zoo.preset(name).family != "encoder"]


def spec_of(name: str) -> zoo.ModelSpec:
    if name in MID_SIZE:
        fields = dict(MID_SIZE[name])
        return zoo.preset(fields.pop("preset")).override(**SHARED, **fields)
    return zoo.preset(name)


def built(name: str, **overrides: Any) -> zoo.ZooModel:
    """A seeded float32 model on the CPU (eval mode: no dropout)."""
    spec = spec_of(name)
    if overrides:
        spec = spec.override(**overrides)
    torch.manual_seed(0)
    return zoo.build(spec).eval()


def inputs(model: zoo.ZooModel, *, batch: int = 3, length: int = 24) -> dict[str, torch.Tensor]:
    """A right-padded batch for the model's forward (rows of ``length``, ``length - 7``, ...)."""
    V = model.spec.vocab_size
    lengths = [max(length - 7 * i, 2) for i in range(batch)]
    ids, mask = padded_batch(V, lengths)
    if model.spec.family == "encoder-decoder":
        target, target_mask = padded_batch(V, [max(n - 3, 2) for n in lengths])
        return dict(
            input_ids=ids, attention_mask=mask, decoder_input_ids=target, decoder_attention_mask=target_mask
        )
    return dict(input_ids=ids, attention_mask=mask)


def logits(model: zoo.ZooModel, batch: dict[str, torch.Tensor], device: str) -> torch.Tensor:
    """Logits at the real positions only (padding rows differ by design), as float32 on the CPU."""
    with torch.no_grad():
        out = model(**{k: v.to(device) for k, v in batch.items()}).logits
    real = batch.get("decoder_attention_mask", batch["attention_mask"]).bool()
    return out.float().cpu()[real]


@pytest.mark.parametrize("name", MODELS)
def test_cuda_logits_equal_cpu_logits_in_fp32(name: str) -> None:
    model = built(name)
    batch = inputs(model, length=64 if name in MID_SIZE else 24)
    expected = logits(model, batch, "cpu")
    got = logits(copy.deepcopy(model).to(CUDA), batch, CUDA)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", MODELS)
def test_cuda_bf16_logits_stay_within_bf16_rounding_of_fp32(name: str) -> None:
    model = built(name)
    batch = inputs(model, length=64 if name in MID_SIZE else 24)
    expected = logits(model, batch, "cpu")
    got = logits(copy.deepcopy(model).to(CUDA, torch.bfloat16), batch, CUDA)
    assert torch.isfinite(got).all()
    scale = expected.abs().max()
    error = (got - expected).abs().max()
    assert error <= 2e-2 * scale, f"max error {error:.3g} vs logits scale {scale:.3g}"


def _loss(model: zoo.ZooModel, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Every real position scored: the MLM head over all tokens, a decoder's next tokens, a target's tokens.
    A batch without masks has no padding."""

    def real(ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return ids if mask is None else ids.masked_fill(mask == 0, -100)

    mask = batch.get("attention_mask")
    if model.spec.family == "encoder-decoder":
        labels = real(batch["decoder_input_ids"], batch.get("decoder_attention_mask"))
        return model(batch["input_ids"], attention_mask=mask, labels=labels).loss
    return model(batch["input_ids"], attention_mask=mask, labels=real(batch["input_ids"], mask)).loss


@pytest.mark.parametrize("name", MODELS)
def test_bf16_autocast_training_lowers_the_loss_on_a_fixed_batch(name: str) -> None:
    model = built(name, dropout=0.0).to(CUDA).train()  # no dropout: the loss must fall step by step
    optimizer = build_optimizer(model, OptimConfig(name="adamw", eps=1e-8))  # fused on CUDA
    for group in optimizer.param_groups:
        group["lr"] = 1e-3
    batch = {k: v.to(CUDA) for k, v in inputs(model, length=64 if name in MID_SIZE else 24).items()}
    losses = []
    for _ in range(8):
        with torch.autocast(CUDA, dtype=torch.bfloat16):
            loss = _loss(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    assert all(math.isfinite(x) for x in losses), losses
    assert all(p.dtype == torch.float32 for p in model.parameters())  # autocast: the weights stay float32
    assert losses[-1] < 0.95 * losses[0], losses  # on CPU (bf16 autocast): 0.35-0.87 after 8 steps


@pytest.fixture(scope="module")
def toy_tsv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("toy")
    corpus = toy_corpus(seed=0, train_size=400, valid_size=20)
    write_tsv(corpus.train, directory / "train.tsv")
    write_tsv(corpus.valid, directory / "valid.tsv")
    return directory / "train.tsv", directory / "valid.tsv"


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_the_trainer_trains_on_cuda_in_half_precision(
    precision: str, toy_tsv: tuple[Path, Path], tmp_path: Path
) -> None:
    """fp16 goes through GradScaler (its records carry the loss scale); bf16 needs none."""
    train_path, valid_path = toy_tsv
    config = TrainConfig.from_dict(
        {
            "model": {"preset": "transformer-tiny", "overrides": {"num_layers": 2, "max_positions": 64}},
            "data": {"train": str(train_path), "valid": str(valid_path)},
            "tokenizer": {"kind": "bpe", "vocab_size": 400},
            "schedule": {"kind": "noam", "warmup_steps": 20},
            "batch": {"max_tokens": 600, "grad_accum": 2},
            "task": {"kind": "seq2seq", "bleu": False},
            "checkpoint": {"every_steps": 10},
            "max_steps": 20,
            "log_every": 5,
            "device": "cuda",
            "precision": precision,
            "output_dir": str(tmp_path / "run"),
        }
    )
    records: list[dict[str, Any]] = []

    class Keep:
        def on_log(self, state: Any, record: dict[str, Any]) -> None:
            records.append(record)

    result = train(config, callbacks=[Keep()], progress=False)
    assert next(result.model.parameters()).device.type == "cuda"
    assert all(math.isfinite(r["loss"]) for r in records)
    assert records[-1]["loss"] < records[0]["loss"]
    assert math.isfinite(result.final["val_loss"])
    if precision == "fp16":
        assert all(r["loss_scale"] > 0 for r in records)
        assert sum(r["skipped_steps"] for r in records) < 10  # a few while the scale calibrates, at most
    else:
        assert "loss_scale" not in records[0]


@pytest.mark.parametrize("name", GENERATIVE)
def test_compiled_decoding_gives_the_eager_tokens_on_cuda(name: str) -> None:
    """`generate(compile=True)` compiles the decode step with Inductor's default mode, not
    "reduce-overhead", so no CUDA graph is captured: this checks the compiled kernels, not graph replay."""
    model = built(name).to(CUDA)
    # Lively weights: greedy paths that depend on the whole context (as `liven` in tests/generation).
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if param.dim() >= 2:
                lookup = "embed" in param_name or "positions" in param_name
                param.normal_(0.0, 0.3 if lookup else 2.0 / math.sqrt(param.shape[-1]))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, model.spec.vocab_size, (2, 6), generator=g).to(CUDA)
    mask = torch.ones_like(ids)
    kwargs: dict[str, Any] = dict(attention_mask=mask, max_new_tokens=8, eos_token_id=[])
    eager = model.generate(ids, **kwargs)
    compiled = model.generate(ids, compile=True, **kwargs)
    assert torch.equal(compiled, eager)
    one = {**kwargs, "attention_mask": mask[:1]}  # a single float32 row compiles with frozen weights
    assert torch.equal(model.generate(ids[:1], compile=True, **one), model.generate(ids[:1], **one))


def test_the_demo_runs_end_to_end_on_cuda(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "zoo", "demo", "--device", "cuda", "--steps", "20"]
    command += ["--output-dir", str(tmp_path / "demo")]
    env = {**os.environ, "COLUMNS": "200"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    output = " ".join((done.stdout + done.stderr).split())  # however the console wrapped its lines
    assert done.returncode == 0, output[-3000:]
    assert "on cuda" in output and "reloaded from disk: same translations" in output, output[-3000:]


@pytest.mark.parametrize("name", MODELS)
def test_a_training_step_fits_in_the_summary_estimate(name: str) -> None:
    """Peak allocated memory of a float32 training step (forward, backward, fused AdamW) against
    ``zoo.summary(model, ...).training_step_bytes``. The step before it allocates Adam's moments and the
    cuBLAS workspaces; what was allocated at the start of the measured step, other than the weights and
    Adam's moments, is not the model's (workspaces, the batch) and is left out."""
    batch_size, length = (8, 256) if name in MID_SIZE else (4, 64)
    model = built(name).to(CUDA).train()  # the preset's dropout: the estimate counts its masks
    optimizer = build_optimizer(model, OptimConfig(name="adamw"))
    for group in optimizer.param_groups:
        group["lr"] = 1e-4
    V = model.spec.vocab_size
    # Full-length rows and no masks, as the trainer passes a batch without padding (`Batch.to`).
    batch = {"input_ids": torch.randint(3, V, (batch_size, length), device=CUDA)}
    if model.spec.family == "encoder-decoder":  # the summary's assumption: the source as long as the target
        batch["decoder_input_ids"] = torch.randint(3, V, (batch_size, length), device=CUDA)

    def step() -> None:
        _loss(model, batch).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    resident = sum(p.numel() * p.element_size() for p in model.parameters())
    resident += sum(
        t.numel() * t.element_size()
        for s in optimizer.state.values()
        for t in s.values()
        if torch.is_tensor(t)
    )
    measured = peak - start + resident
    estimate = zoo.summary(model, seq_len=length, batch=batch_size, dtype="float32").training_step_bytes
    ratio = measured / estimate
    assert 0.7 <= ratio <= 1.2, f"measured {measured / 2**20:.1f} MiB, estimated {estimate / 2**20:.1f} MiB"
