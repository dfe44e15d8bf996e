"""DeepSeek-V3 (``model_type: deepseek_v3``; also Kimi K2's checkpoints): ``DeepseekV3ForCausalLM`` and
``DeepseekV3Model``, after transformers' ``models/deepseek_v3/modeling_deepseek_v3.py``; DeepSeek-V2
(``deepseek_v2``, `V2_MAPPING`): the same tensors less the score bias, with softmax routing (greedy, or
within the groups whose best score is highest: ``ffn.group_score: max``); and GLM-4 MoE (``glm4_moe``,
GLM-4.5), Llama-style attention (q/k/v biases, never o; partial rotary; optional q/k norm) over the same
routed experts (`GLM4_MOE`).

Llama's layer (pre-norm RMSNorm, SwiGLU) with two blocks of its own, both spec options:

    attention   multi-head latent attention (`zoo.blocks.mla`, ``attention.latent``)
                q_lora_rank (null: one q_proj), kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim (zoo's
                head_dim), v_head_dim; attention_bias on q_a_proj, kv_a_proj_with_mqa and o_proj
    ffn         Mixture-of-Experts with DeepSeek-V3's routing (``ffn.scoring: sigmoid``, ``score_bias``,
                ``num_groups`` / ``top_groups``, ``routed_scale``), a shared expert of n_shared_experts x
                moe_intermediate_size, the first first_k_dense_replace layers dense (intermediate_size)

    HF (model.layers.{i}.)                          zoo (decoder.layers.{i}.)
    self_attn.q_proj | q_a_proj, q_a_layernorm,     self_attn.q_proj | q_a_proj, q_norm, q_b_proj
              q_b_proj
    self_attn.kv_a_proj_with_mqa, kv_a_layernorm    self_attn.kv_a_proj, kv_norm
    self_attn.kv_b_proj, o_proj                     self_attn.kv_b_proj, out_proj
    mlp.gate.weight, mlp.gate.e_score_correction_bias   ffn.router.weight, ffn.score_bias
    mlp.experts.{e}.{gate,up,down}_proj             ffn.experts.up_proj (E, 2F, C), down_proj (E, C, F)
    mlp.shared_experts.{gate,up,down}_proj          ffn.shared.up_proj, down_proj

``rope_interleave: true`` (DeepSeek's release) lays each rotary pair out as adjacent dims; transformers
rotates them into the rotate-half layout on the fly. zoo reads the rope rows of q_b_proj (q_proj) and
kv_a_proj_with_mqa into that layout once (`Rule.rows`), so the block rotates as Llama does, and export
writes them back interleaved (``rope_interleave: false`` is refused on import: the tensor table is read
from the spec alone, which holds no layout). The latent norms' epsilon is transformers' fixed 1e-6. ``num_key_value_heads``
must equal the heads (latent attention expands a key per head). YaRN (DeepSeek-V3's release) is read as
``position.scaling`` with, under ``mscale_all_dim``, its softmax scale in ``attention.scale``
(`yarn_softmax_scale`); the multi-token-prediction layer (``num_nextn_predict_layers``) is
not built by transformers and its tensors, if present, are not read.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from zoo.io.hf.common import (
    ACTIVATIONS_TO_HF,
    FamilyMapping,
    HFError,
    Rule,
    StateDict,
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
from zoo.io.hf.moe import MoEFormat, moe_rules
from zoo.io.hf.rope import (
    LONG_CONTEXT,
    max_positions_from_config,
    max_positions_to_config,
    rope_from_config,
    rope_to_config,
)
from zoo.spec import AttentionSpec, DecoderSpec, ModelSpec, MoESpec, ResolvedStack, parse_spec

PREFIX = "model."
HEADED = "DeepseekV3ForCausalLM"
LATENT_NORM_EPS = 1e-6  # transformers builds q_a_layernorm / kv_a_layernorm with the class default
EXPERTS = MoEFormat(
    "mlp", "n_routed_experts", ("gate_proj", "up_proj", "down_proj"), "norm_topk_prob", shared=False,
    jitter=False, per_layer=True,
)  # fmt: skip
# DeepseekV3Config's defaults, for keys a config.json may leave out.
DEFAULTS: dict[str, Any] = {
    "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": None, "n_shared_experts": 1,
    "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4,
    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "norm_topk_prob": True, "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6, "bos_token_id": 0, "eos_token_id": 1, "rope_interleave": True,
}  # fmt: skip


def _getter(config: dict[str, Any], defaults: dict[str, Any]) -> Callable[[str], Any]:
    """Reads a key with the config class's default (also for a group key written as null)."""

    def get(key: str) -> Any:
        value = config.get(key, defaults.get(key))
        return defaults.get(key) if value is None and key in ("n_group", "topk_group") else value

    return get


def config_to_spec(config: dict[str, Any], names: set[str]) -> ModelSpec:
    get = _getter(config, DEFAULTS)
    if get("rope_interleave") is not True:
        raise HFError(
            f"config.json rope_interleave={get('rope_interleave')!r} is not supported: zoo reads DeepSeek's "
            "interleaved rotary rows (rope_interleave: true, every DeepSeek-V3 and Kimi K2 release) into its "
            "rotate-half layout"
        )
    return latent_spec(config, names, get, family="deepseek_v3", headed=HEADED, ffn=routed_ffn(config, get))


def latent_spec(
    config: dict[str, Any],
    names: set[str],
    get: Callable[[str], Any],
    *,
    family: str,
    headed: str,
    ffn: dict[str, Any],
) -> ModelSpec:
    """The spec of a DeepSeek-V2/V3 config: latent attention, pre-norm RMSNorm, rope, the given ``ffn``."""
    heads, d_model, vocab = get("num_attention_heads"), get("hidden_size"), get("vocab_size")
    kv_heads = get("num_key_value_heads") or heads
    if kv_heads != heads:
        raise HFError(
            f"config.json num_key_value_heads={kv_heads} with num_attention_heads={heads}: latent attention "
            f"expands one key per head, and transformers' {family} repeats them only when the two are equal"
        )
    has_head = has_lm_head(config, names, headed=headed, prefix=PREFIX)
    position = rope_from_config(config, kinds=LONG_CONTEXT, max_positions=get("max_position_embeddings"))
    return parse_spec({
        "family": "decoder",
        "vocab_size": vocab,
        "d_model": d_model,
        "num_layers": get("num_hidden_layers"),
        "max_positions": max_positions_from_config(position, get("max_position_embeddings")),
        "attention": {
            "num_heads": heads,
            "head_dim": get("qk_nope_head_dim"),
            "scale": yarn_softmax_scale(position, get("qk_nope_head_dim") + get("qk_rope_head_dim")),
            "bias": config.get("attention_bias", False),
            "dropout": config.get("attention_dropout", 0.0),
            "latent": {
                "q_lora_rank": get("q_lora_rank"),
                "kv_lora_rank": get("kv_lora_rank"),
                "rope_head_dim": get("qk_rope_head_dim"),
                "v_head_dim": get("v_head_dim"),
                "norm_eps": LATENT_NORM_EPS,
            },
        },
        "ffn": ffn,
        "norm": {"kind": "rmsnorm", "eps": get("rms_norm_eps"), "placement": "pre"},
        "position": position,
        "lm_head": {"tied": config.get("tie_word_embeddings", False)} if has_head else None,
        "dropout": 0.0,
        "init": {"std": config.get("initializer_range", 0.02)},
        "pad_token_id": token_id(config, "pad_token_id", vocab),
        "bos_token_id": token_id(config, "bos_token_id", vocab, get("bos_token_id")),
        "eos_token_id": token_id(config, "eos_token_id", vocab, get("eos_token_id")),
    })  # fmt: skip


def routed_ffn(config: dict[str, Any], get: Callable[[str], Any]) -> dict[str, Any]:
    """The ``ffn`` sub-spec of DeepSeek-V3's (and GLM-4 MoE's) Mixture-of-Experts; ``get`` reads a key with
    the config class's default."""
    return {
        **experts_ffn(config, get),
        "normalize_top_k": get("norm_topk_prob"),
        "scoring": "sigmoid",
        "score_bias": True,
        "num_groups": get("n_group"),
        "top_groups": get("topk_group"),
        "routed_scale": get("routed_scaling_factor"),
    }


def experts_ffn(config: dict[str, Any], get: Callable[[str], Any]) -> dict[str, Any]:
    """The routing-independent part of a DeepSeek ``ffn`` sub-spec: the experts, the shared experts of
    n_shared_experts x moe_intermediate_size, the first first_k_dense_replace layers dense."""
    layers, shared = get("num_hidden_layers"), get("n_shared_experts")
    if not isinstance(shared, int) or shared < 1:
        raise HFError(f"config.json n_shared_experts={shared!r}: a positive integer is expected")
    first_dense = get("first_k_dense_replace") or 0
    if not isinstance(first_dense, int) or first_dense < 0:
        raise HFError(f"config.json first_k_dense_replace={first_dense!r}: a count of layers is expected")
    dense = list(range(min(first_dense, layers))) if isinstance(layers, int) else []
    width = get("moe_intermediate_size")
    return {
        "kind": "moe",
        "num_experts": get("n_routed_experts"),
        "top_k": get("num_experts_per_tok"),
        "d_ff": width,
        "activation": activation_from_hf(config.get("hidden_act", "silu"), field="hidden_act"),
        "shared_d_ff": width * shared if isinstance(width, int) else width,
        "shared_gate": False,
        "dense_layers": dense,
        "dense_d_ff": get("intermediate_size") if dense else None,
    }


def routed_ffn_config(family: str, stack: ResolvedStack) -> dict[str, Any]:
    """The config.json fields of a stack's DeepSeek-V3-routed FFN; HFError for what the format never has."""
    ffn, src = stack.ffn, stack.sources
    if not isinstance(ffn, MoESpec):  # `check_ffn_kinds` refuses a dense FFN first
        raise HFError(f"{family} cannot express {src['ffn']}.kind='dense'", fields=(f"{src['ffn']}.kind",))
    first_dense = 0
    while first_dense < stack.num_layers and not ffn.is_sparse(first_dense):
        first_dense += 1  # the dense layers it can say: a leading run (any other reads back otherwise)
    shared = (ffn.shared_d_ff or 0) // ffn.d_ff
    if shared < 1:
        raise HFError(
            f"{family} cannot express {src['ffn']}.shared_d_ff={ffn.shared_d_ff}: it always has shared experts, "
            f"n_shared_experts x moe_intermediate_size ({ffn.d_ff}) wide",
            fields=(f"{src['ffn']}.shared_d_ff",),
        )
    return {
        "intermediate_size": ffn.dense_d_ff or ffn.d_ff,  # read only by the dense layers
        "moe_intermediate_size": ffn.d_ff,
        "hidden_act": ACTIVATIONS_TO_HF[ffn.activation],
        "n_routed_experts": ffn.num_experts,
        "num_experts_per_tok": ffn.top_k,
        "n_shared_experts": shared,
        "norm_topk_prob": ffn.normalize_top_k,
        "n_group": ffn.num_groups,
        "topk_group": ffn.active_groups,
        "routed_scaling_factor": ffn.routed_scale,
        "first_k_dense_replace": first_dense,
    }


def yarn_softmax_scale(position: dict[str, Any], qk_head_dim: int) -> float | None:
    """DeepSeek's logits scale under YaRN with ``mscale_all_dim`` (transformers' ``yarn_apply_mscale``):
    1/sqrt(qk_head_dim) times mscale(factor, mscale_all_dim)², written into ``attention.scale``; None (the
    plain 1/sqrt(qk_head_dim)) otherwise. Read back on export, so a spec whose scale disagrees with its
    rotary settings is refused by the export guard, naming ``attention.scale``."""
    scaling = position.get("scaling") or {}
    if scaling.get("type") != "yarn" or not scaling.get("mscale_all_dim"):
        return None
    factor = scaling["factor"]
    mscale = 0.1 * scaling["mscale_all_dim"] * math.log(factor) + 1.0 if factor > 1 else 1.0
    return float(qk_head_dim**-0.5 * mscale * mscale)


def spec_to_config(spec: ModelSpec) -> dict[str, Any]:
    require("deepseek_v3", [("family", spec.family, "decoder")])
    assert isinstance(spec, DecoderSpec)
    stack = spec.stacks()["decoder"]
    latent = latent_config("deepseek_v3", spec, stack)
    head = spec.lm_head
    return {
        "model_type": "deepseek_v3",
        "architectures": [HEADED if head else "DeepseekV3Model"],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        **routed_ffn_config("deepseek_v3", stack),
        **latent,
        "rope_interleave": True,
        "num_nextn_predict_layers": 0,
        **common_config(spec, stack),
    }


def latent_config(family: str, spec: DecoderSpec, stack: ResolvedStack) -> dict[str, Any]:
    """The config.json fields of a stack's latent attention; HFError when it has none."""
    attention, src = stack.attention, stack.sources
    latent = attention.latent
    if latent is None:
        raise HFError(
            f"{family} cannot express {src['attention']}.latent=None: its attention is always latent",
            fields=(f"{src['attention']}.latent",),
        )
    return {
        "num_hidden_layers": stack.num_layers,
        "num_attention_heads": attention.num_heads,
        "num_key_value_heads": attention.num_heads,
        "q_lora_rank": latent.q_lora_rank,
        "kv_lora_rank": latent.kv_lora_rank,
        "qk_rope_head_dim": latent.rope_head_dim,
        "qk_nope_head_dim": attention.resolved_head_dim(spec.d_model),
        "v_head_dim": latent.v_head_dim or attention.resolved_head_dim(spec.d_model),
        "attention_bias": attention.bias,
        "attention_dropout": attention.dropout,
    }


def common_config(spec: DecoderSpec, stack: ResolvedStack) -> dict[str, Any]:
    """The config.json fields DeepSeek-V2 and V3 share past attention and experts: positions, norms, tokens."""
    head = spec.lm_head
    return {
        "max_position_embeddings": max_positions_to_config(stack.position, spec.max_positions),
        "rms_norm_eps": stack.norm.eps,
        **rope_to_config(stack.position, kinds=LONG_CONTEXT),
        "initializer_range": spec.init.std,
        "tie_word_embeddings": head.tied if head else False,
        "pad_token_id": spec.pad_token_id,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
    }


# -- tensors -----------------------------------------------------------------------------------------------


def rope_rows(width: int, rope: int, *, repeats: int = 1) -> tuple[int, ...]:
    """Rows of ``repeats`` blocks of ``width`` rows each ending in ``rope`` rotary rows, the rotary ones
    de-interleaved: zoo's row order (``x0 x2 x4 .. x1 x3 ..``) as indices into HF's (``x0 x1 x2 x3 ..``)."""
    order = [*range(width - rope), *range(width - rope, width, 2), *range(width - rope + 1, width, 2)]
    return tuple(block * width + i for block in range(repeats) for i in order)


def _attention_rules(attention: AttentionSpec, zoo: str, hf: str, *, d_model: int) -> list[Rule]:
    latent = attention.latent
    assert latent is not None  # a spec that reached the tensors went through `spec_to_config`'s checks
    H, N, P, R = (
        attention.num_heads,
        attention.resolved_head_dim(d_model),
        latent.rope_head_dim,
        latent.kv_lora_rank,
    )
    q_rows, kv_rows = rope_rows(N + P, P, repeats=H), rope_rows(R + P, P)
    bias = attention.bias
    rules = [
        Rule(f"{zoo}.kv_a_proj.weight", (f"{hf}.kv_a_proj_with_mqa.weight",), rows=kv_rows),
        rename(f"{zoo}.kv_norm.weight", f"{hf}.kv_a_layernorm.weight"),
        *linear(f"{zoo}.kv_b_proj", f"{hf}.kv_b_proj", bias=False),
        *linear(f"{zoo}.out_proj", f"{hf}.o_proj", bias=attention.has_out_bias),
    ]
    if bias:
        rules.append(Rule(f"{zoo}.kv_a_proj.bias", (f"{hf}.kv_a_proj_with_mqa.bias",), rows=kv_rows))
    if latent.q_lora_rank is None:
        return [*rules, Rule(f"{zoo}.q_proj.weight", (f"{hf}.q_proj.weight",), rows=q_rows)]
    return [
        *rules,
        *linear(f"{zoo}.q_a_proj", f"{hf}.q_a_proj", bias=bias),
        rename(f"{zoo}.q_norm.weight", f"{hf}.q_a_layernorm.weight"),
        Rule(f"{zoo}.q_b_proj.weight", (f"{hf}.q_b_proj.weight",), rows=q_rows),
    ]


def _ffn_rules(ffn: MoESpec, zoo: str, hf: str, *, layer_idx: int, d_model: int) -> list[Rule]:
    if not ffn.is_sparse(layer_idx):
        return moe_rules(EXPERTS, ffn, zoo, hf, layer_idx=layer_idx, d_model=d_model)  # Llama's gated MLP
    routed = ffn.model_copy(update={"shared_d_ff": None})  # the shared experts are named below
    rules = moe_rules(EXPERTS, routed, zoo, hf, layer_idx=layer_idx, d_model=d_model)
    if ffn.score_bias:  # DeepSeek-V3's; DeepSeek-V2 has none
        rules.append(rename(f"{zoo}.ffn.score_bias", f"{hf}.mlp.gate.e_score_correction_bias"))
    if ffn.shared_d_ff is not None:
        S, shared = ffn.shared_d_ff, f"{hf}.mlp.shared_experts"
        rules += [
            *fused_linear(
                f"{zoo}.ffn.shared.up_proj", [f"{shared}.gate_proj", f"{shared}.up_proj"], (S, S), bias=False
            ),
            *linear(f"{zoo}.ffn.shared.down_proj", f"{shared}.down_proj", bias=False),
        ]
    return rules


def _rules(spec: DecoderSpec, prefix: str) -> list[Rule]:
    stack = spec.stacks()["decoder"]
    ffn = stack.ffn
    rules = [
        rename("embed.tokens.weight", f"{prefix}embed_tokens.weight"),
        *layernorm("decoder.final_norm", f"{prefix}norm", bias=False),
    ]
    for i in range(stack.num_layers):
        zoo, hf = f"decoder.layers.{i}", f"{prefix}layers.{i}"
        rules += [
            *_attention_rules(stack.attention, f"{zoo}.self_attn", f"{hf}.self_attn", d_model=spec.d_model),
            *layernorm(f"{zoo}.self_attn_norm", f"{hf}.input_layernorm", bias=False),
            *layernorm(f"{zoo}.ffn_norm", f"{hf}.post_attention_layernorm", bias=False),
        ]
        if isinstance(ffn, MoESpec):
            rules += _ffn_rules(ffn, zoo, hf, layer_idx=i, d_model=spec.d_model)
    if spec.lm_head is not None and not spec.lm_head.tied:
        rules.append(rename("lm_head.weight", "lm_head.weight"))
    return rules


def _checked_rules(spec: DecoderSpec, prefix: str) -> list[Rule]:
    if spec.stacks()["decoder"].attention.latent is None:
        return []  # nothing to map: `spec_to_config` refuses it, naming the field
    return _rules(spec, prefix)


_hf_to_zoo, zoo_to_hf = decoder_converters(_checked_rules, prefix=PREFIX)
_LAYER = re.compile(r"(?:model\.)?layers\.(\d+)\.")


def hf_to_zoo(tensors: StateDict, spec: ModelSpec) -> StateDict:
    """The checkpoint's tensors without its multi-token-prediction layers (index num_hidden_layers on, which
    transformers leaves unread too), through the table."""
    layers = spec.stacks()["decoder"].num_layers

    def mtp(name: str) -> bool:
        found = _LAYER.match(name)
        return found is not None and int(found.group(1)) >= layers

    return _hf_to_zoo({name: t for name, t in tensors.items() if not mtp(name)}, spec)


MAPPING = FamilyMapping(
    model_types=("deepseek_v3",),
    config_to_spec=config_to_spec,
    spec_to_config=spec_to_config,
    hf_to_zoo=hf_to_zoo,
    zoo_to_hf=zoo_to_hf,
    ffn_kinds=("moe",),
)


# -- DeepSeek-V2: the same latent attention, softmax routing ------------------------------------------------

V2_HEADED = "DeepseekV2ForCausalLM"
TOPK_METHODS = ("greedy", "group_limited_greedy")
# DeepseekV2Config's defaults (deepseek-ai/DeepSeek-V2-Lite's shapes), for keys a config.json may leave out.
V2_DEFAULTS: dict[str, Any] = {
    "vocab_size": 102400, "hidden_size": 4096, "intermediate_size": 11008, "moe_intermediate_size": 1407,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": None, "n_shared_experts": 2,
    "n_routed_experts": 64, "routed_scaling_factor": 1.0, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": None, "topk_group": None,
    "topk_method": "greedy", "num_experts_per_tok": None, "first_k_dense_replace": 0, "norm_topk_prob": False,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 2,
}  # fmt: skip


def v2_config_to_spec(config: dict[str, Any], names: set[str]) -> ModelSpec:
    get = _getter(config, V2_DEFAULTS)
    return latent_spec(
        config, names, get, family="deepseek_v2", headed=V2_HEADED, ffn=v2_routed_ffn(config, get)
    )


def v2_routed_ffn(config: dict[str, Any], get: Callable[[str], Any]) -> dict[str, Any]:
    """DeepSeek-V2's ``ffn``: softmax scores, no bias, the top-k chosen greedily or within the ``topk_group``
    groups of ``n_group`` whose best score is highest (``group_limited_greedy``), weights times
    ``routed_scaling_factor`` and never renormalised (transformers' ``DeepseekV2TopkRouter``)."""
    method = get("topk_method")
    if method not in TOPK_METHODS:
        raise HFError(f"config.json topk_method={method!r} is not supported: deepseek_v2 has {TOPK_METHODS}")
    if get("norm_topk_prob"):
        raise HFError(
            "config.json norm_topk_prob=True is not supported: transformers' deepseek_v2 never renormalises "
            "the top-k weights (DeepSeek's own code does), so the two disagree"
        )
    if config.get("moe_layer_freq", 1) != 1:
        raise HFError(
            f"config.json moe_layer_freq={config['moe_layer_freq']!r} is not supported: transformers' "
            "deepseek_v2 makes every layer from first_k_dense_replace on sparse (moe_layer_freq 1)"
        )
    if config.get("mlp_bias"):
        raise HFError(
            "config.json mlp_bias=True is not supported: zoo's dense and shared experts have no biases"
        )
    ffn = {
        **experts_ffn(config, get),
        "normalize_top_k": False,
        "scoring": "softmax",
        "score_bias": False,
        "routed_scale": get("routed_scaling_factor"),
    }
    if method == "greedy":
        return ffn
    groups, top = get("n_group"), get("topk_group")
    if groups is None or top is None:
        raise HFError(
            f"config.json topk_method='group_limited_greedy' with n_group={groups!r}, topk_group={top!r}: "
            "both counts are expected"
        )
    return {**ffn, "num_groups": groups, "top_groups": top, "group_score": "max"}


def v2_spec_to_config(spec: ModelSpec) -> dict[str, Any]:
    require("deepseek_v2", [("family", spec.family, "decoder")])
    assert isinstance(spec, DecoderSpec)
    stack = spec.stacks()["decoder"]
    latent = latent_config("deepseek_v2", spec, stack)
    routed = routed_ffn_config("deepseek_v2", stack)
    grouped = routed["n_group"] > 1  # a spec's other routing options come back as read, and differ
    head = spec.lm_head
    return {
        "model_type": "deepseek_v2",
        "architectures": [V2_HEADED if head else "DeepseekV2Model"],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        **routed,
        "topk_method": "group_limited_greedy" if grouped else "greedy",
        "norm_topk_prob": False,
        **latent,
        **common_config(spec, stack),
    }


V2_MAPPING = FamilyMapping(
    model_types=("deepseek_v2",),
    config_to_spec=v2_config_to_spec,
    spec_to_config=v2_spec_to_config,
    hf_to_zoo=_hf_to_zoo,
    zoo_to_hf=zoo_to_hf,
    ffn_kinds=("moe",),
)

# -- GLM-4 MoE: Llama-style attention, DeepSeek-V3's routed experts ------------------------------------------

GLM_HEADED = "Glm4MoeForCausalLM"
# Glm4MoeConfig's defaults (partial_rotary_factor 0.5 is written into rope_parameters by the config class).
GLM_DEFAULTS: dict[str, Any] = {
    "vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 10944, "num_hidden_layers": 46,
    "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": None, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "moe_intermediate_size": 1408, "num_experts_per_tok": 8, "n_shared_experts": 1,
    "n_routed_experts": 128, "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1,
    "first_k_dense_replace": 1, "norm_topk_prob": True,
}  # fmt: skip


def glm_config_to_spec(config: dict[str, Any], names: set[str]) -> ModelSpec:
    def get(key: str) -> Any:
        value = config.get(key, GLM_DEFAULTS.get(key))
        return GLM_DEFAULTS.get(key) if value is None and key in ("n_group", "topk_group") else value

    heads, d_model, vocab, eps = (
        get("num_attention_heads"),
        get("hidden_size"),
        get("vocab_size"),
        get("rms_norm_eps"),
    )
    head_dim, qk_norm = get("head_dim"), config.get("use_qk_norm", False)
    return parse_spec({
        "family": "decoder",
        "vocab_size": vocab,
        "d_model": d_model,
        "num_layers": get("num_hidden_layers"),
        "max_positions": get("max_position_embeddings"),
        "attention": {
            "num_heads": heads,
            "num_kv_heads": get("num_key_value_heads") or heads,
            "head_dim": head_dim if head_dim and isinstance(heads, int) and head_dim != d_model // heads else None,
            "bias": config.get("attention_bias", False),
            "out_bias": False,
            "qk_norm": qk_norm,
            **({"qk_norm_eps": eps} if qk_norm else {}),
            "dropout": config.get("attention_dropout", 0.0),
        },
        "ffn": routed_ffn(config, get),
        "norm": {"kind": "rmsnorm", "eps": eps, "placement": "pre"},
        "position": rope_from_config(config, partial=True),
        "lm_head": {"tied": config.get("tie_word_embeddings", False)}
        if has_lm_head(config, names, headed=GLM_HEADED, prefix=PREFIX)
        else None,
        "dropout": 0.0,
        "init": {"std": config.get("initializer_range", 0.02)},
        "pad_token_id": token_id(config, "pad_token_id", vocab),
        "bos_token_id": token_id(config, "bos_token_id", vocab),
        "eos_token_id": token_id(config, "eos_token_id", vocab),
    })  # fmt: skip


def glm_spec_to_config(spec: ModelSpec) -> dict[str, Any]:
    require("glm4_moe", [("family", spec.family, "decoder")])
    assert isinstance(spec, DecoderSpec)
    stack = spec.stacks()["decoder"]
    attention, head = stack.attention, spec.lm_head
    return {
        "model_type": "glm4_moe",
        "architectures": [GLM_HEADED if head else "Glm4MoeModel"],
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        **routed_ffn_config("glm4_moe", stack),
        "num_hidden_layers": stack.num_layers,
        "num_attention_heads": attention.num_heads,
        "num_key_value_heads": attention.kv_heads,
        "head_dim": attention.resolved_head_dim(spec.d_model),
        "attention_bias": attention.bias,
        "use_qk_norm": attention.qk_norm,
        "attention_dropout": attention.dropout,
        "num_nextn_predict_layers": 0,
        "max_position_embeddings": spec.max_positions,
        "rms_norm_eps": stack.norm.eps,
        **rope_to_config(stack.position, partial=True),
        "initializer_range": spec.init.std,
        "tie_word_embeddings": head.tied if head else False,
        "pad_token_id": spec.pad_token_id,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
    }


def _glm_rules(spec: DecoderSpec, prefix: str) -> list[Rule]:
    stack = spec.stacks()["decoder"]
    attention, ffn = stack.attention, stack.ffn
    if attention.latent is not None:
        return []  # latent attention is deepseek_v3's: the read-back names attention.latent
    H, K, D = attention.num_heads, attention.kv_heads, attention.resolved_head_dim(spec.d_model)
    rules = [
        rename("embed.tokens.weight", f"{prefix}embed_tokens.weight"),
        *layernorm("decoder.final_norm", f"{prefix}norm", bias=False),
    ]
    for i in range(stack.num_layers):
        zoo, hf = f"decoder.layers.{i}", f"{prefix}layers.{i}"
        attn = f"{hf}.self_attn"
        rules += [
            *fused_linear(
                f"{zoo}.self_attn.qkv_proj", [f"{attn}.{n}_proj" for n in "qkv"], (H * D, K * D, K * D),
                bias=attention.bias,
            ),
            *linear(f"{zoo}.self_attn.out_proj", f"{attn}.o_proj", bias=attention.has_out_bias),
            *layernorm(f"{zoo}.self_attn_norm", f"{hf}.input_layernorm", bias=False),
            *layernorm(f"{zoo}.ffn_norm", f"{hf}.post_attention_layernorm", bias=False),
        ]  # fmt: skip
        if attention.qk_norm:
            rules += [
                rename(f"{zoo}.self_attn.q_norm.weight", f"{attn}.q_norm.weight"),
                rename(f"{zoo}.self_attn.k_norm.weight", f"{attn}.k_norm.weight"),
            ]
        if isinstance(ffn, MoESpec):
            rules += _ffn_rules(ffn, zoo, hf, layer_idx=i, d_model=spec.d_model)
    if spec.lm_head is not None and not spec.lm_head.tied:
        rules.append(rename("lm_head.weight", "lm_head.weight"))
    return rules


_glm_hf_to_zoo, glm_zoo_to_hf = decoder_converters(_glm_rules, prefix=PREFIX)


def glm_hf_to_zoo(tensors: StateDict, spec: ModelSpec) -> StateDict:
    """As `hf_to_zoo`: GLM-4 MoE's multi-token-prediction layers are left unread too."""
    layers = spec.stacks()["decoder"].num_layers
    kept = {name: t for name, t in tensors.items() if not _past(name, layers)}
    return _glm_hf_to_zoo(kept, spec)


def _past(name: str, layers: int) -> bool:
    found = _LAYER.match(name)
    return found is not None and int(found.group(1)) >= layers


GLM4_MOE = FamilyMapping(
    model_types=("glm4_moe",),
    config_to_spec=glm_config_to_spec,
    spec_to_config=glm_spec_to_config,
    hf_to_zoo=glm_hf_to_zoo,
    zoo_to_hf=glm_zoo_to_hf,
    ffn_kinds=("moe",),
)
MAPPINGS = [MAPPING, V2_MAPPING, GLM4_MOE]
