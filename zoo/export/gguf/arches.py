"""The Hugging Face families llama.cpp runs, as rows: the GGUF architecture each is written as, the
metadata llama.cpp reads for it, the config values it hard-codes (anything else is refused by name) and what
its tensors undergo on the way.

Facts from llama.cpp's ``convert_hf_to_gguf.py`` and ``src/llama-model.cpp`` (read, not copied):

    model_type            arch       rotary pairs    norms        notes
    llama mistral mixtral llama      interleaved *   weight       * q/k rows permuted from HF's halves;
                                                                  llama3 rope scaling (rope_freqs.weight)
    qwen2 qwen3           qwen2/3    halves          weight       qwen3: q/k RMSNorm per head
    qwen2_moe qwen3_moe   qwen2moe/3 halves          weight       every layer sparse; stacked experts
    gemma gemma2          gemma/2    halves          1 + weight   head tied to the embeddings
    gemma3_text           gemma3     halves          1 + weight   local layers: 5 of every 6, rope base 10k
    phi3                  phi3       halves          weight       fused qkv and gate-up, as HF stores them
    gpt2                  gpt2       learned         layernorm    Conv1D (in, out) stored (out, in)

Every rotary architecture takes linear rope scaling (its ``rope.scaling`` keys); other scalings are refused
(`refusals`). Config keys below are the ``config.json`` that `zoo.io.hf.to_hf_state` gives (a missing key
reads None).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from zoo.export.gguf.rope import linear_factor, linear_type, scaling_kind
from zoo.spec.errors import short_repr

Config = Mapping[str, Any]
ValueKind = Literal["u32", "i32", "f32", "bool", "str"]


@dataclass(frozen=True)
class Meta:
    """One metadata row: the GGUF key (``{arch}`` filled in), its value from the config (a key, or a
    function of the config; None leaves the row out) and its GGUF type."""

    key: str
    value: str | Callable[[Config], Any]
    kind: ValueKind = "u32"

    def read(self, config: Config) -> Any:
        return config.get(self.value) if isinstance(self.value, str) else self.value(config)


@dataclass(frozen=True)
class Require:
    """A config value llama.cpp hard-codes for the architecture: ``key`` must be one of ``allowed``."""

    key: str
    allowed: tuple[Any, ...]
    why: str


@dataclass(frozen=True)
class Arch:
    """How one group of Hugging Face model types is written as one GGUF architecture.

    rope_permute: llama.cpp's ``llama`` rotates interleaved pairs, HF the two halves of each head: the q and k
    rows are permuted on the way (their biases too). norm_offset: HF scales by ``1 + weight``, llama.cpp by the
    stored weight. transposed: GPT-2's ``Conv1D`` tensors (stored (in, out)), by GGUF name. tied_only: llama.cpp
    always uses the embeddings as the head. checks: further refusals, each a message or None. rope_scalings:
    the rope scaling types written for it (`rope`: linear as metadata, llama3 as ``rope_freqs.weight``, which
    only llama.cpp's ``llama`` reads); any other is refused.
    """

    name: str
    model_types: tuple[str, ...]
    metadata: tuple[Meta, ...]
    requires: tuple[Require, ...] = ()
    checks: tuple[Callable[[Config], str | None], ...] = ()
    rope_permute: bool = False
    norm_offset: bool = False
    transposed: tuple[str, ...] = ()
    tied_only: bool = False
    rope_scalings: tuple[str, ...] = ("linear",)


def head_dim(config: Config) -> int:
    """The attention head width: ``head_dim`` where the config states it, else hidden / heads."""
    return int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])


def rotary_dims(config: Config) -> int:
    """How many of each head's dimensions rotate (Phi-4-mini's partial rotary: a fraction of the head)."""
    return int(head_dim(config) * (config.get("partial_rotary_factor") or 1.0))


def _window_covers_context(config: Config) -> str | None:
    window, context = config.get("sliding_window"), config.get("max_position_embeddings")
    if window is None or (context is not None and window >= context):
        return None
    return (
        f"sliding_window {window} is shorter than the context ({context}): llama.cpp runs every layer of this "
        f"architecture with full attention; export a spec with max_positions <= {window} (the same attention "
        f"up to the window) or a window >= {context} (full attention, as llama.cpp would run it)"
    )


def _pattern(every: int) -> Callable[[Config], str | None]:
    """A check that the layers' kinds are llama.cpp's fixed pattern: sliding except every ``every``-th."""

    def check(config: Config) -> str | None:
        kinds = config.get("layer_types")
        if kinds is None:
            return "the config does not say which layers are local (layer_types)"
        expected = [
            "full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(len(kinds))
        ]
        if list(kinds) != expected:
            return (
                f"layer_types {list(kinds)} is not llama.cpp's fixed pattern for it (local layers, a global one "
                f"every {every})"
            )
        return None

    return check


def _scale_is_head_dim(config: Config) -> str | None:
    scalar = config.get("query_pre_attn_scalar")
    if scalar is None or scalar == head_dim(config):
        return None
    return (
        f"query_pre_attn_scalar {scalar} differs from head_dim {head_dim(config)}: llama.cpp scales the queries "
        "by the head width"
    )


def _kv_heads(config: Config) -> int:
    return int(config.get("num_key_value_heads") or config["num_attention_heads"])


# -- metadata rows shared by the RMSNorm decoders ----------------------------------------------------------

_DECODER = (
    Meta("{arch}.context_length", "max_position_embeddings"),
    Meta("{arch}.embedding_length", "hidden_size"),
    Meta("{arch}.block_count", "num_hidden_layers"),
    Meta("{arch}.feed_forward_length", "intermediate_size"),
    Meta("{arch}.attention.head_count", "num_attention_heads"),
    Meta("{arch}.attention.head_count_kv", _kv_heads),
    Meta("{arch}.attention.key_length", head_dim),
    Meta("{arch}.attention.value_length", head_dim),
    Meta("{arch}.attention.layer_norm_rms_epsilon", "rms_norm_eps", "f32"),
    Meta("{arch}.rope.freq_base", "rope_theta", "f32"),
    Meta("{arch}.rope.dimension_count", rotary_dims),
    Meta("{arch}.rope.scaling.type", linear_type, "str"),
    Meta("{arch}.rope.scaling.factor", linear_factor, "f32"),
    Meta("{arch}.vocab_size", "vocab_size"),
)
_EXPERTS = (
    Meta("{arch}.expert_count", lambda c: c.get("num_local_experts") or c.get("num_experts")),
    Meta("{arch}.expert_used_count", "num_experts_per_tok"),
)
_SILU = Require("hidden_act", ("silu",), "llama.cpp's SwiGLU FFN")
_GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")


def _all_sparse(config: Config) -> str | None:
    if config.get("mlp_only_layers") or (config.get("decoder_sparse_step") or 1) != 1:
        return "dense layers between sparse ones (mlp_only_layers, decoder_sparse_step): llama.cpp's are all sparse"
    return None


ARCHES: tuple[Arch, ...] = (
    Arch(
        "llama",
        ("llama", "mistral", "mixtral"),
        _DECODER + _EXPERTS,
        requires=(_SILU,),
        checks=(_window_covers_context,),
        rope_permute=True,
        rope_scalings=("linear", "llama3"),
    ),
    Arch(
        "qwen2",
        ("qwen2",),
        _DECODER,
        requires=(_SILU, Require("use_sliding_window", (None, False), "llama.cpp's qwen2")),
    ),
    Arch(
        "qwen3",
        ("qwen3",),
        _DECODER,
        requires=(_SILU, Require("use_sliding_window", (None, False), "llama.cpp's qwen3")),
    ),
    Arch(
        "qwen2moe",
        ("qwen2_moe",),
        _DECODER
        + _EXPERTS
        + (
            Meta("{arch}.expert_feed_forward_length", "moe_intermediate_size"),
            Meta("{arch}.expert_shared_feed_forward_length", "shared_expert_intermediate_size"),
        ),
        requires=(
            _SILU,
            Require("use_sliding_window", (None, False), "llama.cpp's qwen2moe"),
            Require(
                "norm_topk_prob", (None, False), "llama.cpp's qwen2moe keeps the top-k weights as routed"
            ),
        ),
        checks=(_all_sparse,),
    ),
    Arch(
        "qwen3moe",
        ("qwen3_moe",),
        _DECODER + _EXPERTS + (Meta("{arch}.expert_feed_forward_length", "moe_intermediate_size"),),
        requires=(
            _SILU,
            Require("use_sliding_window", (None, False), "llama.cpp's qwen3moe"),
            Require("norm_topk_prob", (True,), "llama.cpp's qwen3moe renormalises the top-k weights"),
        ),
        checks=(_all_sparse,),
    ),
    Arch(
        "gemma",
        ("gemma",),
        _DECODER,
        requires=(Require("hidden_act", _GELU_TANH, "llama.cpp's GeGLU (tanh GELU)"),),
        norm_offset=True,
        tied_only=True,
    ),
    Arch(
        "gemma2",
        ("gemma2",),
        (
            *_DECODER,
            Meta("{arch}.attn_logit_softcapping", "attn_logit_softcapping", "f32"),
            Meta("{arch}.final_logit_softcapping", "final_logit_softcapping", "f32"),
            Meta("{arch}.attention.sliding_window", "sliding_window"),
        ),
        requires=(Require("hidden_activation", _GELU_TANH, "llama.cpp's GeGLU (tanh GELU)"),),
        checks=(_pattern(2), _scale_is_head_dim),
        norm_offset=True,
        tied_only=True,
    ),
    Arch(
        "gemma3",
        ("gemma3_text",),
        (*_DECODER, Meta("{arch}.attention.sliding_window", "sliding_window")),
        requires=(
            Require("hidden_activation", _GELU_TANH, "llama.cpp's GeGLU (tanh GELU)"),
            Require("rope_local_base_freq", (None, 10000.0), "llama.cpp's gemma3 local layers"),
            Require("attn_logit_softcapping", (None,), "llama.cpp's gemma3 does not soft-cap attention"),
            Require("final_logit_softcapping", (None,), "llama.cpp's gemma3 does not soft-cap the logits"),
        ),
        checks=(_pattern(6), _scale_is_head_dim),
        norm_offset=True,
    ),
    Arch(
        "phi3",
        ("phi3",),
        _DECODER,
        requires=(_SILU,),
        checks=(_window_covers_context,),
    ),
    Arch(
        "gpt2",
        ("gpt2",),
        (
            Meta("{arch}.context_length", "n_positions"),
            Meta("{arch}.embedding_length", "n_embd"),
            Meta("{arch}.block_count", "n_layer"),
            Meta("{arch}.feed_forward_length", lambda c: c.get("n_inner") or 4 * c["n_embd"]),
            Meta("{arch}.attention.head_count", "n_head"),
            Meta("{arch}.attention.layer_norm_epsilon", "layer_norm_epsilon", "f32"),
            Meta("{arch}.vocab_size", "vocab_size"),
        ),
        requires=(
            Require("activation_function", ("gelu_new", "gelu_pytorch_tanh"), "llama.cpp's gpt2 (tanh GELU)"),
            Require("scale_attn_weights", (None, True), "llama.cpp's gpt2 scales attention by 1/sqrt(head)"),
            Require("scale_attn_by_inverse_layer_idx", (None, False), "llama.cpp's gpt2"),
        ),
        transposed=("attn_qkv", "attn_output", "ffn_up", "ffn_down"),
    ),
)

BY_MODEL_TYPE: dict[str, Arch] = {t: arch for arch in ARCHES for t in arch.model_types}


def refusals(arch: Arch, config: Config) -> list[str]:
    """Why llama.cpp's ``arch`` cannot run the model this config describes (empty: it can)."""
    found = []
    for row in arch.requires:
        value = config.get(row.key)
        if value not in row.allowed:
            allowed = " or ".join("none" if a is None else repr(a) for a in row.allowed)
            found.append(f"{row.key} {short_repr(value)} (expected {allowed}: {row.why})")
    kind = scaling_kind(config)
    if kind is not None and kind not in arch.rope_scalings:
        written = " or ".join(arch.rope_scalings) or "none"
        why = (
            "only llama.cpp's llama reads llama3's per-frequency factors"
            if kind == "llama3"
            else f"{kind} rope scaling is not written yet"
        )
        found.append(f"rope_scaling {kind!r} (expected none or {written} for llama.cpp's {arch.name}: {why})")
    found += [reason for check in arch.checks if (reason := check(config)) is not None]
    if arch.tied_only and not config.get("tie_word_embeddings", True):
        found.append("an untied head (llama.cpp's gemma uses the embeddings as the head)")
    return found
