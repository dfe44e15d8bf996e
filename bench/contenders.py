"""Each contender builds its model for a workload and runs one timed unit of work.

zoo, Hugging Face `transformers` (SDPA attention, the library's defaults) and `torch.nn.Transformer` (with
embeddings, sinusoidal positions and a tied output projection) get the same shapes; `check_same_size` makes
sure their trainable parameter counts agree before anything is timed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

import zoo
from bench.workloads import GenerateWorkload, TrainWorkload
from zoo.blocks.position import sinusoidal_table
from zoo.generation.weight_layout import wants_column_major
from zoo.losses import IGNORE_INDEX, shift_labels_left
from zoo.training.tasks.masking import mask_tokens


def trainable(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# -- Hugging Face models of the same shapes ------------------------------------------------------------------


def hf_model(spec: dict[str, Any]) -> nn.Module:
    import transformers as tf

    common = {"attn_implementation": "sdpa"}
    C, L, V = spec["d_model"], spec["num_layers"], spec["vocab_size"]
    H, F_ = spec["attention"]["num_heads"], spec["ffn"]["d_ff"]
    if spec["family"] == "decoder":
        config = tf.GPT2Config(
            vocab_size=V, n_positions=spec["max_positions"], n_embd=C, n_layer=L, n_head=H, n_inner=F_,
            activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            bos_token_id=spec["bos_token_id"], eos_token_id=spec["eos_token_id"], pad_token_id=spec["pad_token_id"],
            **common,
        )  # fmt: skip
        model = tf.GPT2LMHeadModel(config)
        # transformers looks its causal-LM loss up by this name and, without it, logs a warning on every
        # forward, which under torch.compile is a graph break; the loss is the same either way.
        model.loss_type = "ForCausalLM"
        return model
    if spec["family"] == "encoder":
        config = tf.BertConfig(
            vocab_size=V, hidden_size=C, num_hidden_layers=L, num_attention_heads=H, intermediate_size=F_,
            max_position_embeddings=spec["max_positions"], hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            **common,
        )  # fmt: skip
        return tf.BertForMaskedLM(config)
    if spec["position"]["kind"] == "relative_bias":
        config = tf.T5Config(
            vocab_size=V, d_model=C, d_kv=spec["attention"]["head_dim"], d_ff=F_, num_layers=L, num_heads=H,
            feed_forward_proj="relu", dropout_rate=0.0, tie_word_embeddings=True, pad_token_id=0, eos_token_id=1,
            decoder_start_token_id=0, **common,
        )  # fmt: skip
        return tf.T5ForConditionalGeneration(config)
    if spec["embedding"].get("norm"):  # BART: learned positions, an embedding LayerNorm, GELU
        config = tf.BartConfig(
            vocab_size=V, d_model=C, encoder_layers=L, decoder_layers=L, encoder_attention_heads=H,
            decoder_attention_heads=H, encoder_ffn_dim=F_, decoder_ffn_dim=F_, max_position_embeddings=spec["max_positions"],
            activation_function="gelu", scale_embedding=False, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
            pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None, **common,
        )  # fmt: skip
        return tf.BartForConditionalGeneration(config)
    config = tf.MarianConfig(
        vocab_size=V, d_model=C, encoder_layers=L, decoder_layers=L, encoder_attention_heads=H,
        decoder_attention_heads=H, encoder_ffn_dim=F_, decoder_ffn_dim=F_, max_position_embeddings=spec["max_positions"],
        activation_function="relu", scale_embedding=True, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        pad_token_id=0, eos_token_id=2, decoder_start_token_id=0, forced_eos_token_id=None, **common,
    )  # fmt: skip
    return tf.MarianMTModel(config)


class TorchTransformer(nn.Module):
    """`torch.nn.Transformer` made a whole translator: shared scaled embeddings, sinusoids, tied output."""

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__()
        C, V = spec["d_model"], spec["vocab_size"]
        self.scale = math.sqrt(C)
        self.embed = nn.Embedding(V, C)
        self.register_buffer(
            "positions", sinusoidal_table(spec["max_positions"], C, layout="half"), persistent=False
        )
        self.transformer = nn.Transformer(
            d_model=C, nhead=spec["attention"]["num_heads"], num_encoder_layers=spec["num_layers"],
            num_decoder_layers=spec["num_layers"], dim_feedforward=spec["ffn"]["d_ff"], dropout=0.0,
            batch_first=True, norm_first=False,
        )  # fmt: skip
        # nn.Transformer adds a final LayerNorm per stack; the post-norm Marian shape has none.
        self.transformer.encoder.norm = nn.Identity()
        self.transformer.decoder.norm = nn.Identity()

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed(ids) * self.scale + self.positions[: ids.shape[1]]

    def forward(self, src: torch.Tensor, src_mask: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        T = tgt.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(T, device=tgt.device, dtype=torch.bool)
        hidden = self.transformer(
            self._embed(src), self._embed(tgt), tgt_mask=causal, tgt_is_causal=True,
            src_key_padding_mask=src_mask == 0, memory_key_padding_mask=src_mask == 0,
        )  # fmt: skip
        return F.linear(hidden, self.embed.weight)


def build(contender: str, spec: dict[str, Any], device: str, dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    if contender.startswith("zoo"):
        model = zoo.build(spec, device=device)
    elif contender == "hf":
        model = hf_model(spec).to(device)
    elif contender == "torch":
        model = TorchTransformer(spec).to(device)
    else:
        raise ValueError(f"unknown contender {contender!r}")
    return model.to(dtype)


def check_same_size(models: dict[str, nn.Module]) -> int:
    counts = {name: trainable(model) for name, model in models.items()}
    if len(set(counts.values())) != 1:
        raise AssertionError(f"contenders differ in trainable parameters: {counts}")
    return next(iter(counts.values()))


# -- one unit of work per contender --------------------------------------------------------------------------


MASK_ID = 3  # the [MASK] token of the MLM workload; ids 0-2 are pad/bos/eos


def train_batch(workload: TrainWorkload, device: str) -> dict[str, torch.Tensor]:
    """Random full-length sequences. MLM is BERT's recipe (and `transformers`' data collator's): 15% of the
    positions are predicted, their inputs masked 80/10/10; every other workload predicts every position."""
    g = torch.Generator().manual_seed(1)
    V = workload.spec["vocab_size"]
    ids = torch.randint(4, V, (workload.batch, workload.seq), generator=g)
    labels = ids.clone()
    if workload.family == "encoder":
        ids, labels = mask_tokens(
            ids, maskable=torch.ones_like(ids, dtype=torch.bool), mask_token_id=MASK_ID,
            replacement_ids=torch.arange(4, V), probability=0.15, generator=g,
        )  # fmt: skip
    ids, labels = ids.to(device), labels.to(device)
    mask = torch.ones_like(ids)
    batch = {"ids": ids, "mask": mask, "labels": labels}
    if workload.family == "encoder-decoder":
        src = torch.randint(3, V, (workload.batch, workload.source), generator=g).to(device)
        batch |= {"src": src, "src_mask": torch.ones_like(src)}
    return batch


def train_step_fn(
    contender: str, workload: TrainWorkload, model: nn.Module, batch: dict
) -> Callable[[], float]:
    """A closure running forward + backward + optimizer step; returns the loss.

    ``workload.precision`` "bf16" runs forward and loss under bf16 autocast (weights, gradients and AdamW
    stay float32); ``workload.compile`` runs the model through ``torch.compile``. Both apply alike to every
    contender.
    """
    model.train()
    # The same optimizer for every contender: fused AdamW, the default of zoo's trainer and of HF's Trainer.
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    labels = batch["labels"]
    # zoo runs its head only where a label is, as its trainer does (`logits_mask`); the others everywhere.
    # Not when compiled: selecting rows has a data-dependent shape, which would break the graph (and with
    # every position but the last scored, there is nothing to save).
    scored = shift_labels_left(labels) if workload.family == "decoder" else labels
    extra = {"logits_mask": scored != IGNORE_INDEX} if contender == "zoo" and not workload.compile else {}
    # The sequences are full length, so zoo and transformers get no attention mask, as zoo's trainer passes
    # none for a batch without padding: given one, a model on a GPU or under torch.compile cannot look
    # inside it without a host sync or a graph break, applies it, and leaves SDPA's flash kernel.
    run = torch.compile(model) if workload.compile else model
    device_type = labels.device.type

    def autocast() -> AbstractContextManager:
        if workload.precision == "bf16":
            return torch.autocast(device_type, dtype=torch.bfloat16)
        return nullcontext()

    def loss() -> torch.Tensor:
        if workload.family == "encoder-decoder":
            if contender == "torch":
                dec_in = torch.cat([torch.zeros_like(labels[:, :1]), labels[:, :-1]], dim=1)
                logits = run(batch["src"], batch["src_mask"], dec_in)
                return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
            return run(batch["src"], labels=labels, **extra).loss
        return run(batch["ids"], labels=labels, **extra).loss

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            value = loss()
        value.backward()
        optimizer.step()
        return float(value.detach())

    return step


def generate_fn(
    contender: str, workload: GenerateWorkload, model: nn.Module, device: str
) -> Callable[[], Any]:
    """A closure generating ``new_tokens`` tokens greedily with the KV cache (exactly that many: eos is blocked)."""
    g = torch.Generator().manual_seed(2)
    V, n = workload.spec["vocab_size"], workload.new_tokens
    ids = torch.randint(3, V, (workload.batch, workload.prompt), generator=g).to(device)
    mask = torch.ones_like(ids)
    model.eval()
    if contender.startswith("zoo"):
        # zoo-compiled: torch.compile'd decode step, compiled during the warm-up call; zoo-cuda-graphs: the
        # per-token step captured as a CUDA graph once per call (the capture is inside the timed call)
        compile = {"zoo": False, "zoo-compiled": True, "zoo-cuda-graphs": "cuda-graphs"}[contender]
        return lambda: model.generate(
            ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, compile=compile
        )
    if contender == "hf":
        kwargs = dict(
            do_sample=False, num_beams=1, max_new_tokens=n, min_new_tokens=n, pad_token_id=0, use_cache=True
        )
        return lambda: model.generate(ids, attention_mask=mask, **kwargs)
    raise ValueError(f"{contender} does not generate")


def floor_fn(workload: GenerateWorkload, device: str, dtype: torch.dtype) -> Callable[[], None]:
    """The bare chain of one decode step's weight matmuls, repeated ``new_tokens`` times: no attention over the
    cache, no norms, no Python around it beyond the loop. The matrices are in the layout zoo decodes this
    many rows with (`zoo.generation.weight_layout`: the wide ones column-major for one or two float32 rows on
    the CPU), the faster one: nothing that reads these weights through ``F.linear`` beats it."""
    spec = workload.spec
    C, F_, V, L = spec["d_model"], spec["ffn"]["d_ff"], spec["vocab_size"], spec["num_layers"]
    cross = workload.family == "encoder-decoder"

    def weight(rows: int, cols: int) -> torch.Tensor:
        w = torch.randn(rows, cols, device=device, dtype=dtype) * 0.02
        return w.t().contiguous().t() if wants_column_major(w.shape, w.device, dtype, workload.batch) else w

    layers = [
        {"qkv": weight(3 * C, C), "out": weight(C, C), "up": weight(F_, C), "down": weight(C, F_)}
        | (
            {"cross_q": weight(C, C), "cross_out": weight(C, C)} if cross else {}
        )  # cross K/V are computed once
        for _ in range(L)
    ]
    head = weight(V, C)
    x0 = torch.randn(workload.batch, 1, C, device=device, dtype=dtype)

    def run() -> None:
        for _ in range(workload.new_tokens):
            x = x0
            for w in layers:
                x = F.linear(F.linear(x, w["qkv"])[..., :C], w["out"])
                if cross:
                    x = F.linear(F.linear(x, w["cross_q"]), w["cross_out"])
                x = F.linear(F.linear(x, w["up"]), w["down"])
            F.linear(x, head)

    return run
