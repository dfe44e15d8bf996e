"""The Llama family: ``llama``, ``mistral``, ``qwen2``, ``qwen3``, ``smollm3`` and the Mixture-of-Experts
``mixtral``, ``qwen2_moe``, ``qwen3_moe`` (``*ForCausalLM`` and headless ``*Model``).

One table serves the four, after transformers' ``models/{llama,mistral,qwen2,qwen3}/modeling_*.py``: pre-norm
RMSNorm, rotary positions in the rotate-half layout (zoo's too, so q/k weights need no permutation),
SwiGLU, grouped-query attention. HF keeps q/k/v and gate/up as separate matrices; zoo fuses them (rows
[q; k; v] and [gate; up]). What differs is a `Variant` row, never a branch on a name:

    model_type  attention biases            q/k norm                sliding window                     MLP bias
    llama       attention_bias: q, k, v, o  -                       -                                  mlp_bias
    mistral     none                        -                       sliding_window, every layer        none
    qwen2       q, k, v always, never o     -                       use_sliding_window + layer_types   none
    qwen3       attention_bias: q, k, v, o  per head, rms_norm_eps  use_sliding_window + layer_types   none
    smollm3     attention_bias: q, k, v, o  -                       use_sliding_window + layer_types   mlp_bias
    mixtral     none                        -                       sliding_window, every layer        experts
    qwen2_moe   qkv_bias: q, k, v, never o  -                       use_sliding_window + layer_types   experts
    qwen3_moe   attention_bias: q, k, v, o  per head, rms_norm_eps  use_sliding_window, every layer    experts

The MoE variants' FFN rows (router, stacked experts, Qwen2-MoE's shared expert, dense layers) are a
`zoo.io.hf.moe.MoEFormat` on the variant.

Rotary scaling (``llama3``, ``linear``, ``yarn``, ``dynamic``) is read and written by `zoo.io.hf.rope` for
every variant. SmolLM3's layers without rotary positions (``no_rope_layers``, 1 = rotates, or one in every
``no_rope_layer_interval``) are ``position.nope_layers``; without ``layer_types`` its sliding layers are
those (with ``use_sliding_window``). A sliding window (query i sees keys j with i - W < j <= i) becomes
``decoder.pattern`` when every layer has it and ``decoder.layer_patterns`` when only some do (Qwen's
``layer_types``); a window at least as long as ``max_position_embeddings`` never hides a key and is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from zoo.io.hf.common import (
    ACTIVATIONS_TO_HF,
    FamilyMapping,
    HFError,
    Rule,
    activation_from_hf,
    decoder_converters,
    fused_linear,
    has_lm_head,
    layernorm,
    linear,
    rename,
    require,
    token_id,
)
from zoo.io.hf.moe import (
    MIXTRAL,
    QWEN2_MOE,
    QWEN3_MOE,
    MoEFormat,
    check_shared_expert,
    moe_from_config,
    moe_rules,
    moe_to_config,
)
from zoo.io.hf.rope import (
    LONG_CONTEXT,
    max_positions_from_config,
    max_positions_to_config,
    rope_from_config,
    rope_to_config,
)
from zoo.spec import (
    DecoderSpec,
    FFNSpec,
    ModelSpec,
    MoESpec,
    ResolvedStack,
    RotaryPositions,
    SlidingWindowPattern,
    parse_spec,
)
from zoo.spec.limits import LAYERS

PREFIX = "model."
FULL, SLIDING = "full_attention", "sliding_attention"  # transformers' layer_types


@dataclass(frozen=True)
class Variant:
    """What one ``model_type`` of the family can say.

    biases: ``config`` reads/writes ``attention_bias`` (all four projections), ``qkv`` is Qwen2's fixed
    q/k/v-only biases, ``qkv_bias`` Qwen2-MoE's q/k/v-only biases switched by ``qkv_bias``, ``none`` is
    Mistral's bias-free attention. window: ``mistral`` is one ``sliding_window`` for every layer (null =
    none), ``every`` the same behind ``use_sliding_window`` (Qwen3-MoE), ``qwen`` the per-layer
    ``use_sliding_window`` / ``max_window_layers`` / ``layer_types`` (without ``layer_types``, Qwen2 slides
    from layer ``max_window_layers`` on, Qwen2-MoE on the even layers below it: ``odd_windows``), ``smollm3``
    the same without ``max_window_layers`` (without ``layer_types``, the no-rope layers slide).
    nope: config.json has SmolLM3's ``no_rope_layers`` / ``no_rope_layer_interval``.
    moe: how the FFN's experts are written, or None for a dense MLP. defaults: the transformers config
    class's defaults, for keys a config.json may leave out.
    """

    model_type: str
    prefix: str  # of the class names: LlamaForCausalLM / LlamaModel
    biases: Literal["config", "qkv", "qkv_bias", "none"]
    mlp_bias: bool  # config.json has ``mlp_bias``
    qk_norm: bool
    window: Literal["none", "mistral", "every", "qwen", "smollm3"]
    defaults: dict[str, Any] = field(default_factory=dict)
    moe: MoEFormat | None = None
    odd_windows: bool = False
    nope: bool = False

    @property
    def headed(self) -> str:
        return f"{self.prefix}ForCausalLM"


_QWEN_DEFAULTS = {"vocab_size": 151936, "intermediate_size": 22016, "max_position_embeddings": 32768}
VARIANTS = (
    Variant("llama", "Llama", biases="config", mlp_bias=True, qk_norm=False, window="none"),
    Variant(
        "mistral", "Mistral", biases="none", mlp_bias=False, qk_norm=False, window="mistral",
        defaults={"intermediate_size": 14336, "num_key_value_heads": 8, "max_position_embeddings": 131072,
                  "sliding_window": 4096},
    ),
    Variant(
        "qwen2", "Qwen2", biases="qkv", mlp_bias=False, qk_norm=False, window="qwen",
        defaults={**_QWEN_DEFAULTS, "num_key_value_heads": 32, "bos_token_id": None, "eos_token_id": None},
    ),
    Variant(
        "qwen3", "Qwen3", biases="config", mlp_bias=False, qk_norm=True, window="qwen",
        defaults={**_QWEN_DEFAULTS, "num_key_value_heads": 32, "head_dim": 128, "bos_token_id": None,
                  "eos_token_id": None},
    ),
    Variant(
        "smollm3", "SmolLM3", biases="config", mlp_bias=True, qk_norm=False, window="smollm3", nope=True,
        defaults={"vocab_size": 128256, "hidden_size": 2048, "num_hidden_layers": 36, "num_attention_heads": 16,
                  "num_key_value_heads": 4, "max_position_embeddings": 32768, "pad_token_id": 128004,
                  "bos_token_id": 128000, "eos_token_id": 128001, "sliding_window": None,
                  "tie_word_embeddings": True, "rope_theta": 2000000.0},
    ),
    Variant(
        "mixtral", "Mixtral", biases="none", mlp_bias=False, qk_norm=False, window="mistral", moe=MIXTRAL,
        defaults={"intermediate_size": 14336, "num_key_value_heads": 8, "max_position_embeddings": 131072,
                  "rms_norm_eps": 1e-5, "sliding_window": None, "num_local_experts": 8, "num_experts_per_tok": 2,
                  "rope_theta": 1000000.0},
    ),
    Variant(
        "qwen2_moe", "Qwen2Moe", biases="qkv_bias", mlp_bias=False, qk_norm=False, window="qwen", moe=QWEN2_MOE,
        odd_windows=True,
        defaults={**_QWEN_DEFAULTS, "intermediate_size": 5632, "hidden_size": 2048, "num_hidden_layers": 24,
                  "num_attention_heads": 16, "num_key_value_heads": 16, "bos_token_id": None, "eos_token_id": None,
                  "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                  "shared_expert_intermediate_size": 5632},
    ),
    Variant(
        "qwen3_moe", "Qwen3Moe", biases="config", mlp_bias=False, qk_norm=True, window="every", moe=QWEN3_MOE,
        defaults={**_QWEN_DEFAULTS, "intermediate_size": 6144, "hidden_size": 2048, "num_hidden_layers": 24,
                  "num_key_value_heads": 4, "bos_token_id": None, "eos_token_id": None, "num_experts": 128,
                  "num_experts_per_tok": 8, "moe_intermediate_size": 768},
    ),
)  # fmt: skip
# LlamaConfig's defaults; a variant's own replace them.
_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None, "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 2, "sliding_window": 4096,
    "tie_word_embeddings": False, "rope_theta": 10000.0,
}  # fmt: skip


# -- config -> spec ----------------------------------------------------------------------------------------


def config_to_spec(variant: Variant, config: dict[str, Any], names: set[str]) -> ModelSpec:
    def default(key: str) -> Any:
        return variant.defaults.get(key, _DEFAULTS.get(key))

    def get(key: str) -> Any:
        return config.get(key, default(key))

    has_head = has_lm_head(config, names, headed=variant.headed, prefix=PREFIX)
    d_model, vocab, num_heads = get("hidden_size"), get("vocab_size"), get("num_attention_heads")
    max_positions, eps, head_dim = get("max_position_embeddings"), get("rms_norm_eps"), get("head_dim")
    qkv_bias = {
        "config": config.get("attention_bias", False),
        "qkv": True,
        "qkv_bias": config.get("qkv_bias", True),
        "none": False,
    }[variant.biases]
    position = rope_from_config(
        config,
        layer_types=config.get("layer_types"),
        kinds=LONG_CONTEXT,
        max_positions=max_positions,
        default_theta=default("rope_theta"),
    )
    nope = _nope_from_config(config, get) if variant.nope else []
    if nope:
        position["nope_layers"] = nope
    windows = _windows_from_config(variant, config, get, nope)
    return parse_spec({
        "family": "decoder",
        "vocab_size": vocab,
        "d_model": d_model,
        "num_layers": get("num_hidden_layers"),
        "max_positions": max_positions_from_config(position, max_positions),
        "attention": {
            "num_heads": num_heads,
            "num_kv_heads": get("num_key_value_heads") or num_heads,
            "head_dim": head_dim if head_dim and num_heads and head_dim != d_model // num_heads else None,
            "bias": qkv_bias,
            "out_bias": None if variant.biases not in ("qkv", "qkv_bias") else False,
            "qk_norm": variant.qk_norm,
            **({"qk_norm_eps": eps} if variant.qk_norm else {}),
            "dropout": config.get("attention_dropout", 0.0),
        },
        "ffn": moe_from_config(variant.moe, config, get) if variant.moe else {
            "d_ff": get("intermediate_size"),
            "activation": activation_from_hf(config.get("hidden_act", "silu"), field="hidden_act"),
            "gated": True,
            "bias": config.get("mlp_bias", False) if variant.mlp_bias else False,
        },
        "norm": {"kind": "rmsnorm", "eps": eps, "placement": "pre"},
        "position": position,
        "decoder": _patterns_spec(windows, max_positions),
        "lm_head": {"tied": get("tie_word_embeddings")} if has_head else None,
        "dropout": 0.0,
        "init": {"std": config.get("initializer_range", 0.02)},
        "pad_token_id": token_id(config, "pad_token_id", vocab, default("pad_token_id")),
        "bos_token_id": token_id(config, "bos_token_id", vocab, default("bos_token_id")),
        "eos_token_id": token_id(config, "eos_token_id", vocab, default("eos_token_id")),
    })  # fmt: skip


def _num_layers(get: Callable[[str], Any]) -> int:
    num_layers = get("num_hidden_layers")
    if not isinstance(num_layers, int) or not 1 <= num_layers <= LAYERS.value:  # before per-layer lists
        raise HFError(
            f"config.json num_hidden_layers={num_layers} must be in [1, {LAYERS.value:,}] ({LAYERS.env} raises it)"
        )
    return num_layers


def _nope_from_config(config: dict[str, Any], get: Callable[[str], Any]) -> list[int]:
    """SmolLM3's layers without rotary positions: the 0s of ``no_rope_layers`` (1 = the layer rotates; at
    least one entry per layer), else every ``no_rope_layer_interval``-th layer (transformers' default 4)."""
    num_layers = _num_layers(get)
    flags = config.get("no_rope_layers")
    if flags is None:
        interval = config.get("no_rope_layer_interval", 4)
        if not isinstance(interval, int) or isinstance(interval, bool) or interval < 1:
            raise HFError(f"config.json no_rope_layer_interval={interval!r}: a positive integer is expected")
        return [i for i in range(num_layers) if (i + 1) % interval == 0]
    if (
        not isinstance(flags, list)
        or len(flags) < num_layers
        or any(flag not in (0, 1) or isinstance(flag, float) for flag in flags)
    ):
        raise HFError(
            f"config.json no_rope_layers must list 1 (rotary) or 0 (none) for each of the {num_layers} layers "
            "(num_hidden_layers)"
        )
    return [i for i in range(num_layers) if not flags[i]]


def _windows_from_config(
    variant: Variant, config: dict[str, Any], get: Callable[[str], Any], nope: list[int]
) -> list[int | None]:
    """Per layer: its sliding window, or None for full causal attention (transformers' own rules)."""
    num_layers, window = _num_layers(get), get("sliding_window")
    if variant.window == "none":
        return [None] * num_layers
    if variant.window in ("every", "qwen", "smollm3") and not config.get("use_sliding_window", False):
        window = None  # switched off: the size says nothing (Qwen2-MoE writes 0 there)
    if window is not None and (not isinstance(window, int) or window < 1):
        raise HFError(f"config.json sliding_window={window!r}: a positive number of keys or null is expected")
    if variant.window in ("mistral", "every"):
        return [window] * num_layers
    # Qwen: the window exists only with use_sliding_window; layer_types (or, without it, the layers from
    # max_window_layers on) say which layers use it.
    window = window if config.get("use_sliding_window", False) else None
    types = config.get("layer_types")
    if types is None and variant.window == "smollm3":  # the no-rope layers slide
        types = [SLIDING if window is not None and i in nope else FULL for i in range(num_layers)]
    if types is None:
        first = config.get("max_window_layers", 28)
        below = [(i + 1) % 2 == 1 and i < first for i in range(num_layers)]  # Qwen2-MoE's own rule
        types = [
            SLIDING if window is not None and (below[i] if variant.odd_windows else i >= first) else FULL
            for i in range(num_layers)
        ]
    if (
        not isinstance(types, list)
        or len(types) != num_layers
        or any(t not in (FULL, SLIDING) for t in types)
    ):
        raise HFError(
            f"config.json layer_types must list {num_layers} entries of {FULL!r} / {SLIDING!r} "
            f"(num_hidden_layers={num_layers})"
        )
    if SLIDING in types and window is None:
        raise HFError(
            "config.json layer_types has 'sliding_attention' layers but no window (use_sliding_window is "
            "false or sliding_window is null); transformers cannot run such a config either"
        )
    return [window if kind == SLIDING else None for kind in types]


def _patterns_spec(windows: list[int | None], max_positions: int) -> dict[str, Any]:
    """``decoder:`` overrides for per-layer windows: none, one ``pattern``, or ``layer_patterns``."""
    windows = [w if w is not None and w < max_positions else None for w in windows]  # longer: never bites
    if all(w is None for w in windows):
        return {}
    if len(set(windows)) == 1:
        return {"pattern": {"kind": "sliding_window", "window": windows[0]}}
    return {
        "layer_patterns": [
            {"kind": "causal"} if w is None else {"kind": "sliding_window", "window": w} for w in windows
        ]
    }


# -- spec -> config ----------------------------------------------------------------------------------------


def spec_to_config(variant: Variant, spec: ModelSpec) -> dict[str, Any]:
    family = variant.model_type
    require(family, [("family", spec.family, "decoder")])
    assert isinstance(spec, DecoderSpec)
    stack = spec.stacks()["decoder"]
    src, head = stack.sources, spec.lm_head
    attention, ffn, norm, position = stack.attention, stack.ffn, stack.norm, stack.position
    if variant.moe is not None:
        check_shared_expert(family, variant.moe, ffn, src["ffn"])
    config = {
        "model_type": family,
        "architectures": [variant.headed if head else f"{variant.prefix}Model"],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        "intermediate_size": ffn.d_ff,
        "num_hidden_layers": stack.num_layers,
        "num_attention_heads": attention.num_heads,
        "num_key_value_heads": attention.kv_heads,
        "head_dim": attention.resolved_head_dim(spec.d_model),
        "hidden_act": ACTIVATIONS_TO_HF[ffn.activation],
        **(moe_to_config(variant.moe, ffn) if variant.moe and isinstance(ffn, MoESpec) else {}),
        "max_position_embeddings": max_positions_to_config(position, spec.max_positions),
        "rms_norm_eps": norm.eps,
        **rope_to_config(position, kinds=LONG_CONTEXT),
        "attention_dropout": attention.dropout,
        "initializer_range": spec.init.std,
        "tie_word_embeddings": head.tied if head else False,
        "pad_token_id": spec.pad_token_id,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
    }
    if variant.biases == "config":
        config["attention_bias"] = attention.bias
    if variant.biases == "qkv_bias":
        config["qkv_bias"] = attention.bias
    if variant.mlp_bias:
        config["mlp_bias"] = ffn.bias
    if variant.nope:
        nope = position.nope_layers if isinstance(position, RotaryPositions) else []
        config["no_rope_layers"] = [int(i not in nope) for i in range(stack.num_layers)]
    return config | _windows_to_config(variant, stack)


def _windows_to_config(variant: Variant, stack: ResolvedStack) -> dict[str, Any]:
    """The variant's sliding-window fields for the stack's per-layer patterns, as far as it holds them: none
    (llama), one window for every layer (mistral, qwen3_moe), one window for the layers that slide (qwen).
    Patterns it cannot hold read back as what it wrote, and the export guard names them (`faithful`)."""
    windows = layer_windows(stack)
    window = next((w for w in windows if w is not None), None)  # the variant's one window size
    if variant.window == "none":
        return {}
    if variant.window == "mistral":
        return {"sliding_window": window}
    if variant.window == "every":
        return {"use_sliding_window": window is not None, "sliding_window": window}
    types = [FULL if w is None else SLIDING for w in windows]
    if variant.window == "smollm3":
        return {"use_sliding_window": window is not None, "sliding_window": window, "layer_types": types}
    return {
        "use_sliding_window": window is not None,
        "sliding_window": window,
        # transformers before layer_types (4.53) reads this: sliding from this layer on
        "max_window_layers": types.index(SLIDING) if window is not None else len(types),
        "layer_types": types,
    }


def layer_windows(stack: ResolvedStack) -> list[int | None]:
    """Per layer of a causal stack: its sliding window, or None for plain causal attention (and for a
    pattern of another kind, which a config of these families then reads back as causal)."""
    patterns = [stack.layer_pattern(i) for i in range(stack.num_layers)]
    return [p.window if isinstance(p, SlidingWindowPattern) else None for p in patterns]


# -- tensors -----------------------------------------------------------------------------------------------


def _rules(spec: DecoderSpec, prefix: str, moe: MoEFormat | None = None) -> list[Rule]:
    """zoo <-> HF names; body names carry ``prefix`` (``model.`` under ``*ForCausalLM``); ``moe``: how the
    variant writes a Mixture-of-Experts FFN."""
    stack = spec.stacks()["decoder"]
    attention = stack.attention
    H, K = attention.num_heads, attention.kv_heads
    D = attention.resolved_head_dim(spec.d_model)
    ffn = stack.ffn
    rules = [
        rename("embed.tokens.weight", f"{prefix}embed_tokens.weight"),
        *layernorm("decoder.final_norm", f"{prefix}norm", bias=False),
    ]
    for i in range(stack.num_layers):
        zoo, hf = f"decoder.layers.{i}", f"{prefix}layers.{i}"
        attn = f"{hf}.self_attn"
        rules += [
            *fused_linear(
                f"{zoo}.self_attn.qkv_proj",
                [f"{attn}.{n}_proj" for n in "qkv"],
                (H * D, K * D, K * D),
                bias=attention.bias,
            ),
            *linear(f"{zoo}.self_attn.out_proj", f"{attn}.o_proj", bias=attention.has_out_bias),
            *_ffn_rules(ffn, zoo, hf, layer_idx=i, d_model=spec.d_model, moe=moe),
            *layernorm(f"{zoo}.self_attn_norm", f"{hf}.input_layernorm", bias=False),
            *layernorm(f"{zoo}.ffn_norm", f"{hf}.post_attention_layernorm", bias=False),
        ]
        if attention.qk_norm:
            rules += [
                rename(f"{zoo}.self_attn.q_norm.weight", f"{attn}.q_norm.weight"),
                rename(f"{zoo}.self_attn.k_norm.weight", f"{attn}.k_norm.weight"),
            ]
    if spec.lm_head is not None and not spec.lm_head.tied:
        rules.append(rename("lm_head.weight", "lm_head.weight"))
    return rules


def _ffn_rules(
    ffn: FFNSpec | MoESpec, zoo: str, hf: str, *, layer_idx: int, d_model: int, moe: MoEFormat | None
) -> list[Rule]:
    """Layer ``layer_idx``'s MLP: Llama's gate/up/down, or the variant's experts (`zoo.io.hf.moe`)."""
    mlp = f"{hf}.mlp"
    if isinstance(ffn, MoESpec):
        assert moe is not None  # a dense variant's config never reads as, and refuses to write, an MoE spec
        return moe_rules(moe, ffn, zoo, hf, layer_idx=layer_idx, d_model=d_model)
    F = ffn.d_ff
    return [
        *fused_linear(f"{zoo}.ffn.up_proj", [f"{mlp}.gate_proj", f"{mlp}.up_proj"], (F, F), bias=ffn.bias),
        *linear(f"{zoo}.ffn.down_proj", f"{mlp}.down_proj", bias=ffn.bias),
    ]


def _mapping(variant: Variant) -> FamilyMapping:
    def to_spec(config: dict[str, Any], names: set[str]) -> ModelSpec:
        return config_to_spec(variant, config, names)

    def to_config(spec: ModelSpec) -> dict[str, Any]:
        return spec_to_config(variant, spec)

    def rules(spec: DecoderSpec, prefix: str) -> list[Rule]:
        return _rules(spec, prefix, variant.moe)

    hf_to_zoo, zoo_to_hf = decoder_converters(rules, prefix=PREFIX)
    return FamilyMapping(
        model_types=(variant.model_type,),
        config_to_spec=to_spec,
        spec_to_config=to_config,
        hf_to_zoo=hf_to_zoo,
        zoo_to_hf=zoo_to_hf,
        ffn_kinds=("moe",) if variant.moe else ("dense",),
    )


# In this order `to_hf` tries them: the plainest format that can express a spec wins.
MAPPINGS = [_mapping(variant) for variant in VARIANTS]
