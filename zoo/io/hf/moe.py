"""Mixture-of-Experts feed-forwards in Hugging Face checkpoints: ``mixtral``, ``qwen2_moe``, ``qwen3_moe``.

The Llama table (`zoo.io.hf.llama`) serves their attention, norms and positions; a `MoEFormat` row on the
variant says how its sparse FFN is written, after transformers' ``models/{mixtral,qwen2_moe,qwen3_moe}``:

    model_type  module            experts key        expert names (gate, up, down)    top-k renorm     shared  per layer
    mixtral     block_sparse_moe  num_local_experts  w1, w3, w2                       always           -       every layer
    qwen2_moe   mlp               num_experts        gate_proj, up_proj, down_proj    norm_topk_prob   yes     sparse_step,
    qwen3_moe   mlp               num_experts        gate_proj, up_proj, down_proj    norm_topk_prob   -       mlp_only_layers

Checkpoints keep one ``(F, C)`` matrix per expert and projection (``experts.{e}.w1.weight``: what
``save_pretrained`` writes and published files hold; transformers 5 fuses them into ``gate_up_proj`` only in
memory). zoo stacks them: ``experts.up_proj.weight`` (E, 2F, C) is ``[gate_0; up_0; gate_1; up_1; ...]`` and
``experts.down_proj.weight`` (E, C, F) the down matrices, so each is one `common.stacked` rule. A dense layer of a
Qwen-MoE stack is a gated MLP of width ``intermediate_size`` under the same ``mlp.`` prefix as Llama's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zoo.io.hf.common import (
    ACTIVATIONS_TO_HF,
    HFError,
    Rule,
    activation_from_hf,
    fused_linear,
    linear,
    stacked,
)
from zoo.spec import FFNSpec, MoESpec


@dataclass(frozen=True)
class MoEFormat:
    """How one ``model_type`` writes its Mixture-of-Experts FFN.

    block: the layer's attribute holding it; experts_key: the config field counting experts; names: the
    per-expert (gate, up, down) linears; renorm_key: the config field saying whether top-k weights are
    renormalised (None: always, Mixtral); shared: Qwen2-MoE's gated shared expert; jitter: Mixtral's
    ``router_jitter_noise``; per_layer: ``decoder_sparse_step`` / ``mlp_only_layers`` with dense layers of
    ``intermediate_size`` (else every layer is sparse and ``intermediate_size`` is the experts' width).
    """

    block: str
    experts_key: str
    names: tuple[str, str, str]
    renorm_key: str | None
    shared: bool
    jitter: bool
    per_layer: bool

    @property
    def expert_width_key(self) -> str:
        return "moe_intermediate_size" if self.per_layer else "intermediate_size"


MIXTRAL = MoEFormat(
    "block_sparse_moe",
    "num_local_experts",
    ("w1", "w3", "w2"),
    None,
    shared=False,
    jitter=True,
    per_layer=False,
)
QWEN2_MOE = MoEFormat(
    "mlp", "num_experts", ("gate_proj", "up_proj", "down_proj"), "norm_topk_prob", shared=True, jitter=False,
    per_layer=True,
)  # fmt: skip
QWEN3_MOE = MoEFormat(
    "mlp", "num_experts", ("gate_proj", "up_proj", "down_proj"), "norm_topk_prob", shared=False, jitter=False,
    per_layer=True,
)  # fmt: skip


def moe_from_config(fmt: MoEFormat, config: dict[str, Any], get: Callable[[str], Any]) -> dict[str, Any]:
    """The ``ffn`` sub-spec (a dict) of a config; ``get`` reads a key with the config class's default."""
    # Qwen3MoeConfig maps num_experts onto num_local_experts, and save_pretrained writes that name
    experts = config.get(fmt.experts_key, config.get("num_local_experts", get(fmt.experts_key)))
    ffn: dict[str, Any] = {
        "kind": "moe",
        "num_experts": experts,
        "top_k": get("num_experts_per_tok"),
        "d_ff": get(fmt.expert_width_key),
        "activation": activation_from_hf(config.get("hidden_act", "silu"), field="hidden_act"),
        "normalize_top_k": True if fmt.renorm_key is None else config.get(fmt.renorm_key, False),
    }
    if fmt.jitter:
        ffn["jitter"] = config.get("router_jitter_noise", 0.0)
    if fmt.shared:
        ffn |= {"shared_d_ff": get("shared_expert_intermediate_size"), "shared_gate": True}
    if fmt.per_layer:
        step, dense = config.get("decoder_sparse_step", 1), config.get("mlp_only_layers") or []
        if not isinstance(step, int) or step < 1:
            raise HFError(f"config.json decoder_sparse_step={step!r}: a positive integer is expected")
        if not isinstance(dense, list) or not all(isinstance(i, int) and i >= 0 for i in dense):
            raise HFError(f"config.json mlp_only_layers={dense!r}: a list of layer indices is expected")
        layers = get("num_hidden_layers")
        dense = sorted({i for i in dense if i < layers})  # transformers never reads the others
        any_dense = any(not MoESpec(sparse_step=step, dense_layers=dense).is_sparse(i) for i in range(layers))
        ffn |= {"sparse_step": step, "dense_layers": dense}
        # the dense layers' width only where a layer is dense: an unused intermediate_size says nothing
        ffn["dense_d_ff"] = get("intermediate_size") if any_dense else None
    return ffn


def check_shared_expert(family: str, fmt: MoEFormat, ffn: FFNSpec | MoESpec, path: str) -> None:
    """HFError for an FFN without the shared expert a format always has (Qwen2-MoE): its config would read
    back one of the default width. What else a format cannot write, the export guard names (`faithful`)."""
    if fmt.shared and isinstance(ffn, MoESpec) and ffn.shared_d_ff is None:
        raise HFError(
            f"{family} cannot express {path}.shared_d_ff=None: Hugging Face {family} always has a shared expert",
            fields=(f"{path}.shared_d_ff",),
        )


def moe_to_config(fmt: MoEFormat, ffn: MoESpec) -> dict[str, Any]:
    """The config.json fields of a Mixture-of-Experts FFN in this format."""
    config: dict[str, Any] = {
        fmt.experts_key: ffn.num_experts,
        "num_experts_per_tok": ffn.top_k,
        fmt.expert_width_key: ffn.d_ff,
        "hidden_act": ACTIVATIONS_TO_HF[ffn.activation],
    }
    if fmt.renorm_key is not None:
        config[fmt.renorm_key] = ffn.normalize_top_k
    if fmt.jitter:
        config["router_jitter_noise"] = ffn.jitter
    if fmt.shared:
        config["shared_expert_intermediate_size"] = ffn.shared_d_ff
    if fmt.per_layer:
        config |= {
            "decoder_sparse_step": ffn.sparse_step,
            "mlp_only_layers": list(ffn.dense_layers),
            "intermediate_size": ffn.dense_d_ff or ffn.d_ff,  # read only by dense layers
        }
    return config


def moe_rules(fmt: MoEFormat, ffn: MoESpec, zoo: str, hf: str, *, layer_idx: int, d_model: int) -> list[Rule]:
    """Layer ``layer_idx``'s FFN tensors: ``zoo`` / ``hf`` are the layer's module paths."""
    block = f"{hf}.{fmt.block}"
    if not ffn.is_sparse(layer_idx):  # a Qwen-MoE dense layer: Llama's gated MLP
        F = ffn.dense_spec().d_ff
        return [
            *fused_linear(
                f"{zoo}.ffn.up_proj", [f"{block}.gate_proj", f"{block}.up_proj"], (F, F), bias=False
            ),
            *linear(f"{zoo}.ffn.down_proj", f"{block}.down_proj", bias=False),
        ]
    E, F, C = ffn.num_experts, ffn.d_ff, d_model
    gate, up, down = fmt.names
    experts = f"{block}.experts"
    rules = [
        Rule(f"{zoo}.ffn.router.weight", (f"{block}.gate.weight",)),
        stacked(
            f"{zoo}.ffn.experts.up_proj.weight",
            [f"{experts}.{e}.{name}.weight" for e in range(E) for name in (gate, up)],
            [F] * (2 * E),
            (E, 2 * F, C),
        ),
        stacked(
            f"{zoo}.ffn.experts.down_proj.weight",
            [f"{experts}.{e}.{down}.weight" for e in range(E)],
            [C] * E,
            (E, C, F),
        ),
    ]
    if ffn.shared_d_ff is not None:
        S, shared = ffn.shared_d_ff, f"{block}.shared_expert"
        rules += [
            *fused_linear(
                f"{zoo}.ffn.shared.up_proj", [f"{shared}.gate_proj", f"{shared}.up_proj"], (S, S), bias=False
            ),
            *linear(f"{zoo}.ffn.shared.down_proj", f"{shared}.down_proj", bias=False),
        ]
        if ffn.shared_gate:
            rules += linear(f"{zoo}.ffn.shared_gate", f"{block}.shared_expert_gate", bias=False)
    return rules
