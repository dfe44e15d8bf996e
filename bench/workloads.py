"""The benchmark workloads, defined once: model shapes and batch shapes every contender runs.

Shapes: a GPT-2-shaped decoder, a BERT-shaped MLM encoder, Vaswani/Marian-, BART- and T5-small-shaped
encoder-decoders, all 6 layers (encoder-decoders: 6+6), width 512, 8 heads, vocab 8192.
The MLM workload scores 15% of the positions, as BERT's recipe does; every other one scores every position.

On CUDA two training workloads are added, both in bf16 mixed precision (float32 weights, bf16 autocast, as
zoo's trainer runs ``precision: bf16``), with their MFU against the GPU's dense bf16 peak (`bench.peaks`):
GPT-2 medium's shape at sequence length 1024 under ``torch.compile``, and the 2017 Transformer base
(Vaswani et al. table 3: 6+6 layers, width 512, FFN 2048, 8 heads, 37k shared vocabulary) against
`transformers`' Marian of the same shape, eager.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

VOCAB = 8192


@dataclass(frozen=True)
class TrainWorkload:
    name: str
    family: str  # "decoder" | "encoder" | "encoder-decoder"
    spec: dict[str, Any]  # a zoo spec (dict form)
    batch: int
    seq: int  # decoder-only / encoder-only length, or the target length of an encoder-decoder
    source: int = 0  # encoder-decoder source length
    contenders: tuple[str, ...] = ("zoo", "hf")
    precision: str = "fp32"  # or "bf16": autocast to bfloat16 around float32 weights, for every contender
    compile: bool = False  # torch.compile the whole model, for every contender

    @property
    def tokens_per_step(self) -> int:
        """Tokens counted for tokens/s: the trained (target) positions of the batch."""
        return self.batch * self.seq


@dataclass(frozen=True)
class GenerateWorkload:
    name: str
    family: str
    spec: dict[str, Any]
    batch: int
    prompt: int  # decoder prompt length, or encoder source length
    new_tokens: int = 128
    dtype: str = "float32"
    contenders: tuple[str, ...] = ("zoo", "zoo-compiled", "hf", "floor")
    # Loaded from a checkpoint the bench writes into a temporary folder (as a user loads a model), not built
    # in the process; such a row is measured for memory only (`bench.memory`), never timed.
    from_checkpoint: bool = False


GPT = {
    "family": "decoder",
    "vocab_size": VOCAB,
    "d_model": 512,
    "num_layers": 6,
    "max_positions": 512,
    "attention": {"num_heads": 8},
    "ffn": {"d_ff": 2048, "activation": "gelu_tanh"},
    "norm": {"kind": "layernorm", "eps": 1e-5, "placement": "pre"},
    "position": {"kind": "learned"},
    "lm_head": {"tied": True},
    "dropout": 0.0,
    "init": {"scheme": "normal", "std": 0.02, "scaled_residual": True},
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
BERT = {
    "family": "encoder",
    "vocab_size": VOCAB,
    "d_model": 512,
    "num_layers": 6,
    "max_positions": 512,
    "attention": {"num_heads": 8},
    "ffn": {"d_ff": 2048, "activation": "gelu"},
    "norm": {"kind": "layernorm", "eps": 1e-12, "placement": "post"},
    "position": {"kind": "learned"},
    "embedding": {"segment_vocab_size": 2, "norm": True},
    "heads": {"mlm": {"activation": "gelu"}},
    "dropout": 0.0,
    "pad_token_id": 0,
}
MARIAN = {
    "family": "encoder-decoder",
    "vocab_size": VOCAB,
    "d_model": 512,
    "num_layers": 6,
    "max_positions": 512,
    "attention": {"num_heads": 8},
    "ffn": {"d_ff": 2048, "activation": "relu"},
    "norm": {"kind": "layernorm", "eps": 1e-5, "placement": "post"},
    "position": {"kind": "sinusoidal", "layout": "half"},
    "embedding": {"scale": True},
    "lm_head": {"tied": True, "logits_bias": True},
    "dropout": 0.0,
    "pad_token_id": 0,
    "eos_token_id": 2,
    "decoder_start_token_id": 0,
}
BART = {
    "family": "encoder-decoder",
    "vocab_size": VOCAB,
    "d_model": 512,
    "num_layers": 6,
    "max_positions": 512,
    "attention": {"num_heads": 8},
    "ffn": {"d_ff": 2048, "activation": "gelu"},
    "norm": {"kind": "layernorm", "eps": 1e-5, "placement": "post"},
    "position": {"kind": "learned", "offset": 2},
    "embedding": {"norm": True},
    "lm_head": {"tied": True, "logits_bias": True},
    "dropout": 0.0,
    "pad_token_id": 1,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "decoder_start_token_id": 2,
}
T5 = {
    "family": "encoder-decoder",
    "vocab_size": VOCAB,
    "d_model": 512,
    "num_layers": 6,
    "max_positions": 512,
    "attention": {"num_heads": 8, "head_dim": 64, "bias": False, "scaled": False},
    "ffn": {"d_ff": 2048, "activation": "relu", "bias": False},
    "norm": {"kind": "rmsnorm", "eps": 1e-6, "placement": "pre"},
    "position": {"kind": "relative_bias", "num_buckets": 32, "max_distance": 128},
    "lm_head": {"tied": True, "rescale_tied": True},
    "dropout": 0.0,
    "init": {"scheme": "t5"},
    "pad_token_id": 0,
    "eos_token_id": 1,
    "decoder_start_token_id": 0,
}


# Llama 3.2 1B's shape (presets/llama-3.2-1b.yaml: 1.24B parameters, the 128256 x 2048 embedding tied to the
# head), for the memory rows only; max_positions 8192 rather than 131072 keeps the rotary tables small and
# leaves every weight the same. pad/bos/eos as in the real model.
LLAMA_1B = {
    "family": "decoder",
    "vocab_size": 128256,
    "d_model": 2048,
    "num_layers": 16,
    "max_positions": 8192,
    "attention": {"num_heads": 32, "num_kv_heads": 8, "bias": False},
    "ffn": {"d_ff": 8192, "activation": "silu", "gated": True, "bias": False},
    "norm": {"kind": "rmsnorm", "eps": 1e-5, "placement": "pre"},
    "position": {"kind": "rotary", "theta": 500000.0},
    "lm_head": {"tied": True},
    "dropout": 0.0,
    "pad_token_id": None,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}


# GPU-only shapes. GPT-2 medium (24 layers, width 1024, 16 heads) with its 50257-token vocabulary padded to
# 50304 (a multiple of 64, as nanoGPT does: the head's GEMM runs on aligned tiles).
GPT2_MEDIUM = {
    **GPT,
    "d_model": 1024,
    "num_layers": 24,
    "attention": {"num_heads": 16},
    "ffn": {"d_ff": 4096, "activation": "gelu_tanh"},
    "max_positions": 1024,
    "vocab_size": 50304,
}
# The 2017 Transformer base in Marian's wiring (the only way transformers has it): sinusoids in the
# half/half layout rather than interleaved and a (frozen) logits bias — neither changes the cost.
TRANSFORMER_BASE = {**MARIAN, "vocab_size": 37000, "max_positions": 1024}


# `make gpu-check` (bench/gpu_check.py) reads its figures from the rows of these workloads.
GPT2_MEDIUM_TRAIN = "gpt2-medium-shaped train step, seq 1024, bf16 + compile"
TRANSFORMER_BASE_TRAIN = "transformer-base (Marian-shaped) seq2seq train step, bf16"


def gpt2_medium_greedy(batch: int) -> str:
    return f"gpt2-medium-shaped greedy, batch {batch}, bfloat16"


@dataclass(frozen=True)
class Suite:
    train: list[TrainWorkload] = field(default_factory=list)
    generate: list[GenerateWorkload] = field(default_factory=list)


def suite(*, quick: bool, device: str) -> Suite:
    """The workloads for one run. ``quick`` (``make bench``: ~3 minutes on 2 CPU cores) keeps the GPT and BERT
    training shapes and the GPT generation rows without the compiled contender (compiling a decode step
    takes 20-60 s on a CPU) and without the encoder-decoders. The full run on a CPU adds the memory rows of
    Llama 3.2 1B's shape, loaded from a checkpoint in float32."""
    train = [
        TrainWorkload("gpt2-shaped train step", "decoder", GPT, batch=8, seq=256),
        TrainWorkload("bert-shaped MLM train step", "encoder", BERT, batch=8, seq=256),
        TrainWorkload(
            "marian-shaped seq2seq train step",
            "encoder-decoder",
            MARIAN,
            batch=8,
            seq=128,
            source=128,
            contenders=("zoo", "hf", "torch"),
        ),
        TrainWorkload(
            "bart-shaped seq2seq train step", "encoder-decoder", BART, batch=8, seq=128, source=128
        ),
        TrainWorkload("t5-small-shaped train step", "encoder-decoder", T5, batch=8, seq=128, source=128),
    ]
    if quick:
        train = train[:2]
    dtypes = ["float32", "bfloat16"]
    generate = [
        GenerateWorkload(
            f"gpt2-shaped greedy, batch {batch}, {dtype}",
            "decoder",
            GPT,
            batch=batch,
            prompt=32,
            dtype=dtype,
            contenders=("zoo", "hf", "floor") if quick else ("zoo", "zoo-compiled", "hf", "floor"),
        )
        for dtype in dtypes
        for batch in ((1, 8) if quick else (1, 8, 32))
    ]
    if not quick:
        generate += [
            GenerateWorkload(
                f"marian-shaped greedy, batch {batch}, {dtype}",
                "encoder-decoder",
                MARIAN,
                batch=batch,
                prompt=64,
                dtype=dtype,
            )
            for dtype in dtypes
            for batch in (1, 8)
        ]
    if not quick and device == "cpu":  # memory only: the weight layout's conversion at a real size
        generate += [
            GenerateWorkload(
                f"llama-3.2-1b-shaped greedy, batch {batch}, float32",
                "decoder",
                LLAMA_1B,
                batch=batch,
                prompt=8,
                new_tokens=4,
                contenders=("zoo", "hf"),
                from_checkpoint=True,
            )
            for batch in (1, 8)
        ]
    if device.startswith("cuda"):
        train += [
            TrainWorkload(
                GPT2_MEDIUM_TRAIN,
                "decoder",
                GPT2_MEDIUM,
                batch=8,
                seq=1024,
                precision="bf16",
                compile=True,
            ),
            TrainWorkload(
                TRANSFORMER_BASE_TRAIN,
                "encoder-decoder",
                TRANSFORMER_BASE,
                batch=64,
                seq=128,
                source=128,
                precision="bf16",
                contenders=("zoo", "hf", "torch"),
            ),
        ]
    return Suite(train=train, generate=generate)


def gpu_check_suite(*, tiny: bool = False) -> Suite:
    """`make gpu-check`'s rows, sized to run in about 3 minutes on one H100: the two bf16 training rows (zoo
    and transformers; compiling GPT-2 medium's step is most of the time) and bf16 greedy decoding of GPT-2
    medium's shape at batch 1 and 8, eager, with CUDA graphs, transformers' ``generate`` and the matmul
    floor. GPT-2 medium rather than the 6-layer shape, so a step reads enough weights (0.7 GB) for the
    weights-read floor to mean something. ``tiny``: the same rows at test sizes, eager (the orchestration
    test, on CPU)."""
    medium, base = GPT2_MEDIUM, TRANSFORMER_BASE
    train_batch, seq, base_batch, base_seq, new = 8, 1024, 64, 128, 128
    if tiny:
        small = {"d_model": 64, "num_layers": 2, "attention": {"num_heads": 2}, "vocab_size": 256}
        medium = {**medium, **small, "ffn": {"d_ff": 128, "activation": "gelu_tanh"}}
        base = {**base, **small, "ffn": {"d_ff": 128, "activation": "relu"}}
        train_batch, seq, base_batch, base_seq, new = 2, 32, 2, 16, 8
    train = [  # the eager row first: compiling GPT-2 medium's step is the longest part of the run
        TrainWorkload(
            TRANSFORMER_BASE_TRAIN,
            "encoder-decoder",
            base,
            batch=base_batch,
            seq=base_seq,
            source=base_seq,
            precision="bf16",
        ),
        TrainWorkload(
            GPT2_MEDIUM_TRAIN,
            "decoder",
            medium,
            batch=train_batch,
            seq=seq,
            precision="bf16",
            compile=not tiny,
        ),
    ]
    generate = [
        GenerateWorkload(
            gpt2_medium_greedy(batch),
            "decoder",
            medium,
            batch=batch,
            prompt=32,
            new_tokens=new,
            dtype="bfloat16",
            contenders=("zoo", "zoo-cuda-graphs", "hf", "floor"),
        )
        for batch in (1, 8)
    ]
    return Suite(train=train, generate=generate)
