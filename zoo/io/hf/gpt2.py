"""GPT-2 (``model_type: gpt2``): ``GPT2LMHeadModel`` and the headless ``GPT2Model``.

transformers' ``models/gpt2/modeling_gpt2.py``: pre-norm LayerNorm, learned positions, a fused ``c_attn``
(rows q, k, v after transposing, exactly zoo's ``qkv_proj``), and ``Conv1D`` layers that store their matrix
as (in, out), so every matrix but the embeddings is transposed. The LM head is tied to ``wte``.

Checkpoints saved by ``GPT2LMHeadModel`` prefix the body with ``transformer.``; OpenAI's original files
and ``GPT2Model`` do not. Old files also carry the causal-mask buffers ``attn.bias`` / ``attn.masked_bias``.
"""

from __future__ import annotations

from typing import Any

from zoo.io.hf.common import (
    ACTIVATIONS_TO_HF,
    FamilyMapping,
    Rule,
    activation_from_hf,
    decoder_converters,
    has_lm_head,
    layernorm,
    linear,
    reject,
    rename,
    require,
    token_id,
)
from zoo.spec import DecoderSpec, ModelSpec, parse_spec

PREFIX = "transformer."
HEADED = "GPT2LMHeadModel"
_OLD_BUFFERS = (r"h\.\d+\.attn\.(bias|masked_bias)", r"h\.\d+\.crossattention\.(bias|masked_bias)")


def config_to_spec(config: dict[str, Any], names: set[str]) -> ModelSpec:
    reject(config, "add_cross_attention", False, why="GPT-2 with cross-attention is not a decoder-only model")
    reject(config, "scale_attn_weights", True, why="attention logits are always scaled by 1/sqrt(head_dim)")
    reject(config, "scale_attn_by_inverse_layer_idx", False, why="no per-layer attention scaling in zoo")
    has_head = has_lm_head(config, names, headed=HEADED, prefix=PREFIX)
    d_model, vocab = config.get("n_embd", 768), config.get("vocab_size", 50257)
    activation = config.get("activation_function", "gelu_new")
    return parse_spec({
        "family": "decoder",
        "vocab_size": vocab,
        "d_model": d_model,
        "num_layers": config.get("n_layer", 12),
        "max_positions": config.get("n_positions", 1024),
        "attention": {"num_heads": config.get("n_head", 12), "dropout": config.get("attn_pdrop", 0.1)},
        "ffn": {
            "d_ff": config.get("n_inner") or 4 * d_model,
            "activation": activation_from_hf(activation, field="activation_function"),
        },
        "norm": {"kind": "layernorm", "eps": config.get("layer_norm_epsilon", 1e-5), "placement": "pre"},
        "position": {"kind": "learned"},
        "lm_head": {"tied": config.get("tie_word_embeddings", True)} if has_head else None,
        "dropout": config.get("resid_pdrop", 0.1),
        "init": {"std": config.get("initializer_range", 0.02), "scaled_residual": True},
        "pad_token_id": token_id(config, "pad_token_id", vocab, padding_idx=False),  # wte has none
        "bos_token_id": token_id(config, "bos_token_id", vocab, 50256),
        "eos_token_id": token_id(config, "eos_token_id", vocab, 50256),
    })  # fmt: skip


def spec_to_config(spec: ModelSpec) -> dict[str, Any]:
    require("gpt2", [("family", spec.family, "decoder")])
    assert isinstance(spec, DecoderSpec)
    stack = spec.stacks()["decoder"]
    attention, ffn, norm = stack.attention, stack.ffn, stack.norm
    head = spec.lm_head
    return {
        "model_type": "gpt2",
        "architectures": [HEADED if head else "GPT2Model"],
        "vocab_size": spec.vocab_size,
        "n_embd": spec.d_model,
        "n_layer": stack.num_layers,
        "n_head": attention.num_heads,
        "n_inner": ffn.d_ff,
        "n_positions": spec.max_positions,
        "activation_function": ACTIVATIONS_TO_HF[ffn.activation],
        "layer_norm_epsilon": norm.eps,
        "resid_pdrop": spec.dropout,
        "embd_pdrop": spec.dropout,
        "attn_pdrop": attention.dropout,
        "initializer_range": spec.init.std,
        "scale_attn_weights": True,
        "tie_word_embeddings": head.tied if head else True,
        "pad_token_id": spec.pad_token_id,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
    }


def _rules(spec: DecoderSpec, prefix: str) -> list[Rule]:
    """zoo <-> HF names; body names carry ``prefix`` (``transformer.`` under the LM head class)."""
    rules = [
        rename("embed.tokens.weight", f"{prefix}wte.weight"),
        rename("decoder.positions.weight", f"{prefix}wpe.weight"),
        *layernorm("decoder.final_norm", f"{prefix}ln_f"),
    ]
    for i in range(spec.stacks()["decoder"].num_layers):
        zoo, hf = f"decoder.layers.{i}", f"{prefix}h.{i}"
        rules += [
            *layernorm(f"{zoo}.self_attn_norm", f"{hf}.ln_1"),
            *linear(f"{zoo}.self_attn.qkv_proj", f"{hf}.attn.c_attn", transpose=True),  # (C, 3C) -> (3C, C)
            *linear(f"{zoo}.self_attn.out_proj", f"{hf}.attn.c_proj", transpose=True),
            *layernorm(f"{zoo}.ffn_norm", f"{hf}.ln_2"),
            *linear(f"{zoo}.ffn.up_proj", f"{hf}.mlp.c_fc", transpose=True),
            *linear(f"{zoo}.ffn.down_proj", f"{hf}.mlp.c_proj", transpose=True),
        ]
    if spec.lm_head is not None and not spec.lm_head.tied:
        rules.append(rename("lm_head.weight", "lm_head.weight"))
    return rules


hf_to_zoo, zoo_to_hf = decoder_converters(_rules, prefix=PREFIX, ignore=_OLD_BUFFERS)


MAPPING = FamilyMapping(
    model_types=("gpt2",),
    config_to_spec=config_to_spec,
    spec_to_config=spec_to_config,
    hf_to_zoo=hf_to_zoo,
    zoo_to_hf=zoo_to_hf,
)
