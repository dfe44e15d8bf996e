"""Sub-specs for the shared blocks: attention, feed-forward, norm, positions, embeddings.

Each block module in `zoo.blocks` is built from exactly one of these. They hold only what the block
itself needs; context the parent owns (``d_model``, whether the stack is causal) is passed to the block
as keyword arguments, never stored here twice.

This module imports no torch: specs, presets and the JSON Schema load in a bare environment.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Discriminator,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Tag,
    model_validator,
)

from zoo.spec.errors import CleanModel

Probability = Annotated[float, Field(ge=0.0, lt=1.0)]
Epsilon = Annotated[float, Field(gt=0.0, lt=1.0)]
"""A norm's epsilon, in (0, 1): one that dwarfs the variance makes every position's output the same."""

Activation = Literal["relu", "gelu", "gelu_tanh", "silu", "quick_gelu"]
"""FFN nonlinearities. ``gelu_tanh`` is GPT-2's ``gelu_new``; ``silu`` is also called swish; ``quick_gelu`` is
CLIP's x * sigmoid(1.702 x)."""


class Spec(CleanModel):
    """Base for every spec: unknown fields are errors, instances are immutable, and types are strict.

    Strict: an int field takes an int only (``num_layers: true`` is not 1 layer, ``"12"`` is not 12), a
    bool field a bool only (not ``1`` or ``"yes"``), a float field an int or a float (not ``true``, not a
    string: YAML reads ``1e-5`` as a float, `zoo.spec.files`). Every float is finite: ``eps: .inf`` or
    ``std: 1e999`` is refused by name like NaN, before any bound on the field is checked. A validation error
    is one ``field: problem`` line each, without pydantic's input reprs and links (`CleanModel`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class LatentAttentionSpec(Spec):
    """Multi-head latent attention (MLA; DeepSeek-V2, arXiv 2405.04434, section 2.1; DeepSeek-V3, Kimi K2).

    Keys and values come from one compressed latent per token, ``c = norm(W_dkv x)`` of width
    ``kv_lora_rank``, expanded per head by ``kv_b_proj`` into the no-rope key (``head_dim`` wide) and the
    value (``v_head_dim``); rotary positions ride on ``rope_head_dim`` extra dims, a query part per head and
    one key part shared by all heads. Queries come from x directly, or through a low-rank bottleneck with its
    own norm (``q_lora_rank``). A head's query and key are ``head_dim + rope_head_dim`` wide, and the logits
    are scaled by that width's ``**-0.5`` unless ``scale`` says otherwise. The KV cache holds the latent and
    the rotated shared key only: ``kv_lora_rank + rope_head_dim`` numbers per token and layer, against
    ``2 · kv_heads · head_dim`` for (grouped-query) attention.
    """

    q_lora_rank: PositiveInt | None = Field(
        None, description="Width of the query bottleneck (with its RMSNorm); default: none, one q projection."
    )
    kv_lora_rank: PositiveInt = Field(512, description="Width of the cached key/value latent.")
    rope_head_dim: PositiveInt = Field(
        64,
        description="Rotary dims per head, beside head_dim (qk_rope_head_dim); their key is shared by all heads.",
    )
    v_head_dim: PositiveInt | None = Field(None, description="Width of one value head; default: head_dim.")
    norm_eps: Epsilon = Field(
        1e-6, description="Epsilon of the latent RMSNorms (kv and, with q_lora_rank, q)."
    )

    @model_validator(mode="after")
    def _even_rope(self) -> LatentAttentionSpec:
        if self.rope_head_dim % 2:
            raise ValueError(f"rope_head_dim ({self.rope_head_dim}) must be even: rotary dims come in pairs")
        return self


class TemperatureTuning(Spec):
    """Llama 4's attention temperature tuning (arXiv 2501.19399) on layers without rotary positions."""

    floor_scale: PositiveInt = Field(8192, description="Slots per step of the scale (floor_scale).")
    scale: PositiveFloat = Field(0.1, description="Strength of the scale (attn_scale).")
    count: Literal["slot", "position"] = Field(
        "slot",
        description="What i counts: slot, the query's slot in its row with left padding included "
        "(transformers: a left-padded row differs from the row alone); position, its position from the row's "
        "first token (Meta's and vLLM's: padding changes nothing). In packed rows both count from the "
        "document's start.",
    )


class AttentionSpec(Spec):
    """Multi-head attention (MHA), grouped-query (GQA, ``num_kv_heads < num_heads``) or multi-query (1); with
    ``latent``, multi-head latent attention (`LatentAttentionSpec`), whose ``head_dim`` is the no-rope part."""

    num_heads: PositiveInt = 8
    num_kv_heads: PositiveInt | None = Field(
        None, description="Key/value heads for grouped-query attention; default: num_heads (plain MHA)."
    )
    head_dim: PositiveInt | None = Field(
        None, description="Width of one head; default d_model // num_heads. T5 sets it freely (d_kv)."
    )
    bias: bool = Field(True, description="Biases on the q/k/v and output projections.")
    out_bias: bool | None = Field(
        None, description="A bias on the output projection; default: same as bias (Qwen2: q/k/v biases only)."
    )
    key_bias: bool | None = Field(
        None,
        description="A bias on the key projection; default: same as bias. Whisper has none (false): q and v "
        "keep theirs. It never changes the output (it adds q·b to every logit of a query; softmax ignores that).",
    )
    scaled: bool = Field(True, description="Divide logits by sqrt(head_dim). T5 folds this into its init.")
    qk_norm: bool = Field(False, description="RMS-normalise queries and keys per head before the product.")
    qk_norm_eps: Epsilon = Field(
        1e-6, description="Epsilon of the q/k RMS norms (Qwen3 uses its rms_norm_eps); only with qk_norm."
    )
    qk_norm_scope: Literal["head", "all_heads"] = Field(
        "head",
        description="head: one RMSNorm over head_dim, its weight shared by every head (Qwen3, Gemma 3); "
        "all_heads: one over the whole query (H·D) and key (K·D) projections before they split into heads, "
        "a weight per channel (OLMo 2); only with qk_norm.",
    )
    qk_norm_weight: bool = Field(
        True,
        description="A learned scale on the q/k norms; false: a plain RMS (L2) normalisation with no parameter "
        "(Llama 4's use_qk_norm); only with qk_norm.",
    )
    qk_norm_layers: Literal["all", "rotary"] = Field(
        "all",
        description="Which layers normalise q/k: all, or only those that rotate (Llama 4: not the "
        "position.nope_layers); rotary needs qk_norm_weight: false.",
    )
    temperature_tuning: TemperatureTuning | None = Field(
        None,
        description="Llama 4's attention temperature tuning on the layers without rotary positions "
        "(position.nope_layers): queries scaled by 1 + scale * log(1 + floor((i + 1) / floor_scale)), i the "
        "query's slot or position (count); default: none.",
    )
    dropout: Probability = Field(0.0, description="Dropout on the attention weights (training only).")
    scale: PositiveFloat | None = Field(
        None,
        description="Multiply logits by this instead of 1/sqrt(head_dim) (Gemma 2/3: query_pre_attn_scalar**-0.5); "
        "only with scaled.",
    )
    softcap: PositiveFloat | None = Field(
        None,
        description="Soft-cap the scaled logits to (-softcap, softcap) as softcap * tanh(logits / softcap), "
        "before the mask (Gemma 2's attn_logit_softcapping); takes flex_attention or the math path, not SDPA.",
    )
    sinks: bool = Field(
        False,
        description="Attention sinks (gpt-oss): a learned logit per head joins every query's softmax as an extra "
        "key with a zero value, so a head may attend to nothing; one (num_heads,) parameter per layer.",
    )
    latent: LatentAttentionSpec | None = Field(
        None,
        description="Multi-head latent attention (DeepSeek-V2/V3): keys and values from a cached low-rank "
        "latent, rotary on separate dims; self-attention only, with no kv head groups and no qk_norm.",
    )

    @model_validator(mode="after")
    def _latent_options(self) -> AttentionSpec:
        if self.latent is None:
            return self
        if self.num_kv_heads not in (None, self.num_heads):
            raise ValueError(
                f"num_kv_heads ({self.num_kv_heads}) must be unset or num_heads ({self.num_heads}) with latent: "
                "every head expands its own key and value from the one shared latent"
            )
        if self.qk_norm:
            raise ValueError("qk_norm cannot go with latent: latent attention normalises its latents instead")
        if self.sinks:
            raise ValueError("sinks cannot go with latent: latent attention has no sink column")
        return self

    @model_validator(mode="after")
    def _scale_needs_scaled(self) -> AttentionSpec:
        if self.scale is not None and not self.scaled:
            raise ValueError(
                f"scale ({self.scale}) is given but scaled is false: unscaled logits take no scale"
            )
        if self.qk_norm_scope != "head" and not self.qk_norm:
            raise ValueError(
                f"qk_norm_scope {self.qk_norm_scope!r} needs qk_norm: true (there is no q/k norm)"
            )
        if (not self.qk_norm_weight or self.qk_norm_layers != "all") and not self.qk_norm:
            raise ValueError("qk_norm_weight and qk_norm_layers need qk_norm: true (there is no q/k norm)")
        if self.qk_norm_layers == "rotary" and self.qk_norm_scope != "head":
            raise ValueError("qk_norm_layers 'rotary' needs qk_norm_scope 'head' (Llama 4's per-head norm)")
        if self.qk_norm_layers == "rotary" and self.qk_norm_weight:
            raise ValueError(
                "qk_norm_layers 'rotary' needs qk_norm_weight: false (the other layers' weights would go unused)"
            )
        return self

    def resolved_scale(self, d_model: int) -> float:
        """What the q·k logits are multiplied by: ``scale``, else 1/sqrt(head_dim) when scaled, else 1."""
        if not self.scaled:
            return 1.0
        return self.scale if self.scale is not None else self.qk_head_dim(d_model) ** -0.5

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def has_out_bias(self) -> bool:
        return self.bias if self.out_bias is None else self.out_bias

    @property
    def has_key_bias(self) -> bool:
        return self.bias and self.key_bias is not False

    def resolved_head_dim(self, d_model: int) -> int:
        """Width of one head (with ``latent``: its query/key dims without rotary)."""
        return self.head_dim or d_model // self.num_heads

    def qk_head_dim(self, d_model: int) -> int:
        """Width of one head's query and key: head_dim, plus latent attention's rotary dims."""
        rope = self.latent.rope_head_dim if self.latent is not None else 0
        return self.resolved_head_dim(d_model) + rope

    def rotary_head_dim(self, d_model: int) -> int:
        """The dims rotary positions act on per head: all of head_dim, or latent attention's rope dims."""
        return self.latent.rope_head_dim if self.latent is not None else self.resolved_head_dim(d_model)

    def cache_width(self, d_model: int) -> int:
        """Numbers one layer caches per token: k and v of every kv head, or the latent and the rope key."""
        if self.latent is not None:
            return self.latent.kv_lora_rank + self.latent.rope_head_dim
        return 2 * self.kv_heads * self.resolved_head_dim(d_model)


class FFNSpec(Spec):
    """Position-wise feed-forward: ``down(act(up(x)))``, or gated ``down(act(gate(x)) * up(x))``.

    The dense member of the FFN union (`FeedForwardSpec`): ``kind: dense`` may be written or left out, and is
    never dumped, so specs and checkpoints written before the union existed read and compare the same.
    """

    kind: Literal["dense"] = Field("dense", exclude=True, description="dense (this) or moe (`MoESpec`).")
    d_ff: PositiveInt = 2048
    activation: Activation = "relu"
    gated: bool = Field(False, description="Gated linear unit: silu -> SwiGLU, gelu/gelu_tanh -> GeGLU.")
    bias: bool = True
    dropout: Probability = Field(0.0, description="Dropout after the activation (BART's activation_dropout).")


class MoESpec(Spec):
    """Mixture-of-Experts feed-forward (Shazeer et al. 2017; Switch, Mixtral, Qwen-MoE, DeepSeek-V3): a linear
    router scores ``num_experts`` SwiGLU experts per token, the ``top_k`` best run and their outputs are
    summed, weighted by the router's softmax probabilities (or sigmoid scores, ``scoring``).

    DeepSeek-V3's routing (arXiv 2412.19437, section 2.1.2): ``scoring: sigmoid``, a ``score_bias`` that
    chooses experts without weighing them (balanced during training by ``bias_update_rate``), experts in
    ``num_groups`` groups of which a token uses the ``top_groups`` best, weights times ``routed_scale``.
    DeepSeek-V2's: softmax scores, no bias, a group ranked by its best score (``group_score: max``).

    Layer ``i`` of a stack is sparse when ``(i + 1) % sparse_step == 0`` and ``i`` is not in
    ``dense_layers``; the other layers run one dense gated FFN of width ``dense_d_ff`` (transformers'
    ``decoder_sparse_step``, ``mlp_only_layers`` and ``intermediate_size``). With ``shared_d_ff`` every
    token also runs one shared expert, scaled by ``sigmoid(shared_gate(x))`` when ``shared_gate`` (Qwen2-MoE).
    """

    # ``kind`` is required in the JSON Schema: the dense member's fields are all optional too, so a written
    # ``kind: moe`` is what tells the two apart for a schema-driven editor (Python defaults it, as here).
    model_config = ConfigDict(**Spec.model_config, json_schema_extra={"required": ["kind"]})

    kind: Literal["moe"] = "moe"
    num_experts: PositiveInt = Field(8, description="Routed experts per sparse layer.")
    top_k: PositiveInt = Field(2, description="Experts each token runs (num_experts_per_tok).")
    d_ff: PositiveInt = Field(2048, description="Hidden width of each expert (moe_intermediate_size).")
    activation: Activation = Field("silu", description="Of the gated experts: silu -> SwiGLU, as in Mixtral.")
    normalize_top_k: bool = Field(
        True, description="Renormalise the top-k weights to sum to 1 (Mixtral; Qwen's norm_topk_prob)."
    )
    shared_d_ff: PositiveInt | None = Field(
        None, description="Hidden width of a shared expert every token runs (Qwen2-MoE); default: none."
    )
    shared_gate: bool = Field(
        True, description="Scale the shared expert by sigmoid(linear(x)) (Qwen2-MoE); only with shared_d_ff."
    )
    jitter: Probability = Field(
        0.0, description="Training only: the router input is multiplied by U(1 - jitter, 1 + jitter) noise."
    )
    sparse_step: PositiveInt = Field(1, description="Layer i is sparse when (i + 1) % sparse_step == 0.")
    dense_layers: list[NonNegativeInt] = Field(
        default_factory=list,
        description="Layers that stay dense whatever sparse_step says (mlp_only_layers).",
    )
    dense_d_ff: PositiveInt | None = Field(
        None, description="Hidden width of the dense layers' gated FFN; needed when a layer is dense."
    )
    router_bias: bool = Field(False, description="A bias on the router's logits (gpt-oss).")
    expert_bias: bool = Field(
        False, description="Biases on every expert's up and down projections (gpt-oss)."
    )
    clamped_glu: ClampedGLU | None = Field(
        None,
        description="The experts' gate is gpt-oss's clamped SwiGLU (`ClampedGLU`) instead of act(gate) * up; "
        "activation must then be silu (what the config says; the clamped gate replaces it).",
    )
    scoring: Literal["softmax", "sigmoid"] = Field(
        "softmax",
        description="Router scores: a softmax over the experts (Mixtral, Qwen), or each expert's sigmoid "
        "(DeepSeek-V3, GLM-4 MoE); the chosen experts' scores weigh their outputs.",
    )
    score_bias: bool = Field(
        False,
        description="DeepSeek-V3's aux-loss-free balancing: a per-expert bias (e_score_correction_bias, a "
        "buffer) added to the scores to choose the experts, never to weigh them.",
    )
    bias_update_rate: Annotated[float, Field(ge=0.0)] = Field(
        0.0,
        description="Training only, with score_bias: after each training forward, every expert's bias moves "
        "by this rate toward balance, +rate when it took fewer than the mean of the tokens, -rate when more "
        "(DeepSeek-V3's gamma, 0.001); 0: the bias stays as loaded.",
    )
    num_groups: PositiveInt = Field(
        1, description="Group-limited routing (n_group): experts split into this many equal groups."
    )
    top_groups: PositiveInt | None = Field(
        None,
        description="Groups a token may route into (topk_group), those whose two best (biased) scores sum "
        "highest (or whose best is highest, group_score: max); default: every group.",
    )
    group_score: Literal["top2_sum", "max"] = Field(
        "top2_sum",
        description="How group-limited routing ranks a group: the sum of its two best (biased) scores "
        "(DeepSeek-V3's noaux_tc), or its best score (DeepSeek-V2's group_limited_greedy).",
    )
    weighted_input: bool = Field(
        False,
        description="The router weight multiplies each expert's input, not its output (Llama 4: "
        "expert(w · x) instead of w · expert(x)).",
    )
    routed_scale: PositiveFloat = Field(
        1.0, description="The routed experts' weights are multiplied by this (routed_scaling_factor)."
    )

    @model_validator(mode="after")
    def _check_routing(self) -> MoESpec:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) must be at most num_experts ({self.num_experts})")
        if self.num_experts % self.num_groups:
            raise ValueError(
                f"num_experts ({self.num_experts}) must be divisible by num_groups ({self.num_groups})"
            )
        groups = self.active_groups
        if groups > self.num_groups:
            raise ValueError(f"top_groups ({groups}) must be at most num_groups ({self.num_groups})")
        if self.num_groups > 1 and self.group_score == "top2_sum" and self.num_experts // self.num_groups < 2:
            raise ValueError(
                f"num_groups ({self.num_groups}) leaves one expert a group: a group's score is its two best"
            )
        if groups * (self.num_experts // self.num_groups) < self.top_k:
            raise ValueError(
                f"top_k ({self.top_k}) is more than the experts of top_groups ({groups}) groups hold"
            )
        if self.bias_update_rate > 0 and not self.score_bias:
            raise ValueError(f"bias_update_rate ({self.bias_update_rate}) needs score_bias: true")
        if self.clamped_glu is not None and self.activation != "silu":
            raise ValueError(
                f"clamped_glu replaces the experts' activation: activation must be 'silu', got {self.activation!r}"
            )
        return self

    @property
    def active_groups(self) -> int:
        """Groups a token routes into: ``top_groups``, else every group."""
        return self.top_groups if self.top_groups is not None else self.num_groups

    # What every expert is, read where any FFN spec is (costs, the dense families' export checks, which
    # refuse an MoE spec by its kind before they look): gated, biased only with expert_bias, no dropout inside.
    @property
    def gated(self) -> bool:
        return True

    @property
    def bias(self) -> bool:
        return self.expert_bias

    @property
    def dropout(self) -> float:
        return 0.0

    def is_sparse(self, layer_idx: int) -> bool:
        """Whether layer ``layer_idx`` (from 0) of its stack runs the experts rather than the dense FFN."""
        return (layer_idx + 1) % self.sparse_step == 0 and layer_idx not in self.dense_layers

    def dense_spec(self) -> FFNSpec:
        """The gated FFN of this stack's dense layers (bias-free, as in Qwen-MoE's MLP)."""
        assert self.dense_d_ff is not None  # the stack's validation requires it where a layer is dense
        return FFNSpec(d_ff=self.dense_d_ff, activation=self.activation, gated=True, bias=False)


class ClampedGLU(Spec):
    """gpt-oss's clamped SwiGLU (transformers' ``swiglu_alpha`` / ``swiglu_limit``), in place of the experts'
    ``act(gate) * up``::

        gate = min(gate, limit); up = clamp(up, -limit, limit)
        out  = (up + 1) * gate * sigmoid(alpha * gate)
    """

    alpha: PositiveFloat = Field(1.702, description="Slope inside the sigmoid gate (swiglu_alpha).")
    limit: PositiveFloat = Field(7.0, description="Gate clamped above, up clamped to +-limit (swiglu_limit).")


def _ffn_kind(value: Any) -> str:
    """The union member of an FFN spec: its ``kind``, ``dense`` when none is written (older specs)."""
    kind = value.get("kind", "dense") if isinstance(value, dict) else getattr(value, "kind", "dense")
    return kind if kind in ("dense", "moe") else str(kind)


FeedForwardSpec = Annotated[
    Annotated[FFNSpec, Tag("dense")] | Annotated[MoESpec, Tag("moe")],
    Discriminator(
        _ffn_kind, custom_error_type="ffn_kind", custom_error_message="kind must be 'dense' or 'moe'"
    ),
]
"""An FFN block: dense (`FFNSpec`, the default when ``kind`` is left out) or Mixture-of-Experts (`MoESpec`)."""


class NormSpec(Spec):
    """Normalisation kind and where it sits around each residual sub-layer."""

    kind: Literal["layernorm", "rmsnorm"] = "layernorm"
    eps: Epsilon = 1e-5
    bias: bool = Field(True, description="LayerNorm has a bias; ignored by RMSNorm, which never has one.")
    placement: Literal["pre", "post", "sandwich", "post_sublayer"] = Field(
        "post",
        description="post: x = norm(x + f(x)) as in the paper; pre: x = x + f(norm(x)) as in GPT-2/T5; "
        "sandwich: x = x + norm2(f(norm1(x))), a norm before and after each sub-layer (Gemma 2/3); "
        "post_sublayer: x = x + norm(f(x)), a norm on each sub-layer's output only, inside the residual "
        "branch (OLMo 2).",
    )
    final: bool | None = Field(
        None, description="A norm after the last layer; default: yes for every placement but post."
    )
    unit_offset: bool = Field(
        False,
        description="RMSNorm only: scale by (1 + weight), weights starting at zero (Gemma); the stack's q/k "
        "norms (attention.qk_norm) too.",
    )
    first_attention_norm: bool = Field(
        True,
        description="Pre-norm only: false leaves the first layer's self-attention input un-normalised, the "
        "embedding norm standing in for it (ModernBERT).",
    )
    residual: Literal["sequential", "parallel", "parallel_shared"] = Field(
        "sequential",
        description="sequential: each branch reads the previous branch's output; parallel (GPT-NeoX): "
        "every branch reads the layer's input through its own norm and the outputs are summed, "
        "x + attn(norm1(x)) + ffn(norm2(x)); parallel_shared (GPT-J, Cohere): the same with one norm that "
        "every branch reads, x + attn(norm(x)) + ffn(norm(x)); pre-norm only.",
    )

    @property
    def parallel(self) -> bool:
        """Whether the branches read the layer's input side by side (``parallel`` or ``parallel_shared``)."""
        return self.residual != "sequential"

    @property
    def has_final(self) -> bool:
        return self.placement != "post" if self.final is None else self.final

    @model_validator(mode="after")
    def _check_options(self) -> NormSpec:
        if self.unit_offset and self.kind != "rmsnorm":
            raise ValueError(f"unit_offset is an RMSNorm option (Gemma's 1 + weight); kind is {self.kind!r}")
        if not self.first_attention_norm and self.placement != "pre":
            raise ValueError(
                f"first_attention_norm: false needs placement 'pre' (got {self.placement!r}): only a pre-norm "
                "layer has a norm on the attention input to leave out"
            )
        if not self.first_attention_norm and self.residual == "parallel_shared":
            raise ValueError(
                "first_attention_norm: false cannot go with residual 'parallel_shared': the one norm the "
                "branches share is the attention's"
            )
        return self

    @model_validator(mode="after")
    def _parallel_is_pre(self) -> NormSpec:
        if self.parallel and self.placement != "pre":
            raise ValueError(
                f"residual {self.residual!r} needs placement 'pre' (each branch normalises the layer's input), "
                f"got placement {self.placement!r}"
            )
        return self


class SinusoidalPositions(Spec):
    """Fixed sin/cos table added to the embeddings (Vaswani et al. 2017, section 3.5).

    fairseq's variant (M2M-100): ``layout="half"``, ``frequencies="fairseq"``, ``offset=pad_token_id + 1``.
    """

    kind: Literal["sinusoidal"] = "sinusoidal"
    layout: Literal["interleaved", "half"] = Field(
        "interleaved",
        description="interleaved: PE[2i]=sin, PE[2i+1]=cos as in the paper; half: all sines then all cosines (Marian).",
    )
    offset: NonNegativeInt = Field(
        0,
        description="Table rows reserved before position 0: position p reads row p + offset "
        "(fairseq/M2M-100 count from padding_idx + 1 = 2).",
    )
    frequencies: Literal["paper", "fairseq"] = Field(
        "paper",
        description="paper: angle rates 10000^(-2i/dim); fairseq (tensor2tensor, M2M-100): "
        "exp(-i * ln(10000) / (dim/2 - 1)), i < dim/2; only with layout 'half'.",
    )

    @model_validator(mode="after")
    def _fairseq_is_half(self) -> SinusoidalPositions:
        if self.frequencies == "fairseq" and self.layout != "half":
            raise ValueError(
                f"frequencies 'fairseq' needs layout 'half' (fairseq and tensor2tensor put all sines before all "
                f"cosines), got layout {self.layout!r}"
            )
        return self


class RelativeBiasSpec(Spec):
    """T5's bucketed relative position bias as a second position signal beside an absolute table (MPNet):
    one (num_buckets, H) table per stack, added to every layer's attention logits."""

    num_buckets: PositiveInt = 32
    max_distance: PositiveInt = 128


class LearnedPositions(Spec):
    """A trained position table added to the embeddings (BERT, GPT-2, BART).

    ``relative_bias``: also T5's bucketed relative bias on the attention logits (MPNet uses both: learned
    absolute positions from padding_idx + 1, and one relative bias table shared by all layers).
    """

    kind: Literal["learned"] = "learned"
    offset: NonNegativeInt = Field(0, description="Rows reserved before position 0 (BART and RoBERTa use 2).")
    relative_bias: RelativeBiasSpec | None = Field(
        None,
        description="MPNet: a bucketed relative position bias (one table per stack, bidirectional in an "
        "encoder, causal in a decoder) added to every layer's logits on top of the learned table.",
    )


class Llama3RopeScaling(Spec):
    """Llama 3.1's long-context rotary schedule (transformers' ``rope_type: llama3``), by wavelength 2π/freq:

        wavelength < original_max_positions / high_freq_factor   kept (high frequencies: local order)
        wavelength > original_max_positions / low_freq_factor    divided by factor (low frequencies)
        in between                                               interpolated smoothly between the two

    Defaults are Llama 3.1's; Llama 3.2 1B/3B use factor 32. Equal factors leave no band in between (Llama 4
    Scout: 1.0 and 1.0): every wavelength is kept or scaled.
    """

    type: Literal["llama3"] = "llama3"
    factor: PositiveFloat = Field(8.0, description="How much the low frequencies are slowed down.")
    low_freq_factor: PositiveFloat = Field(1.0, description="Wavelengths above original / this are scaled.")
    high_freq_factor: PositiveFloat = Field(4.0, description="Wavelengths below original / this are kept.")
    original_max_positions: PositiveInt = Field(
        8192, description="The context length the model was pretrained with, before the extension."
    )

    @model_validator(mode="after")
    def _check_band(self) -> Llama3RopeScaling:
        if self.high_freq_factor < self.low_freq_factor:
            raise ValueError(
                f"high_freq_factor ({self.high_freq_factor}) must be at least low_freq_factor "
                f"({self.low_freq_factor}): they bound the band of interpolated frequencies"
            )
        return self


class LinearRopeScaling(Spec):
    """Position interpolation (Chen et al. 2023; transformers' ``rope_type: linear``): every rotary
    frequency divided by ``factor``, as if positions were ``p / factor``."""

    type: Literal["linear"] = "linear"
    factor: PositiveFloat = Field(description="Positions are divided by this (2.0 doubles the context).")


class LongRopeScaling(Spec):
    """LongRoPE (Ding et al. 2024; Phi-3's ``rope_type: longrope``, formerly ``su``): each rotary frequency
    i divided by its own factor, from ``short_factor`` while a forward's positions stay within
    ``original_max_positions`` and from ``long_factor`` once any position passes it; cos and sin are
    multiplied by ``attention_factor`` (both sets).

    The set is picked per forward from its largest position id, as transformers does. Keys cached by
    shorter forwards keep their short-factor rotation, so ``generate`` recomputes the cache at the step that
    switches, as transformers' Phi-3 generation does (docs/hf.md, LongRoPE and the KV cache).
    """

    type: Literal["longrope"] = "longrope"
    short_factor: list[PositiveFloat] = Field(
        min_length=1, description="One divisor per rotary frequency (rotary dims / 2) for short contexts."
    )
    long_factor: list[PositiveFloat] = Field(
        min_length=1, description="One divisor per rotary frequency for contexts past original_max_positions."
    )
    original_max_positions: PositiveInt = Field(
        description="The pretraining context: a forward whose positions reach past it uses long_factor."
    )
    attention_factor: PositiveFloat | None = Field(
        None,
        description="Scale of cos and sin; default: sqrt(1 + ln(s) / ln(original_max_positions)) with "
        "s = max_positions / original_max_positions, or 1 when s <= 1 (transformers' default).",
    )

    @model_validator(mode="after")
    def _same_lengths(self) -> LongRopeScaling:
        if len(self.short_factor) != len(self.long_factor):
            raise ValueError(
                f"short_factor ({len(self.short_factor)} values) and long_factor ({len(self.long_factor)}) "
                "must both hold one value per rotary frequency"
            )
        return self


class YarnRopeScaling(Spec):
    """YaRN (Peng et al. 2023; transformers' ``rope_type: yarn``): per rotary frequency, a blend of the plain
    rate (extrapolation) and the rate divided by ``factor`` (interpolation), ramped linearly over the dims
    whose number of turns within ``original_max_positions`` lies between ``beta_slow`` and ``beta_fast``
    (dims turning faster are kept, slower ones divided); cos and sin are multiplied by ``attention_factor``.

    The attention factor, unless given, is transformers': mscale(factor, mscale) / mscale(factor,
    mscale_all_dim) when both are set (DeepSeek), else mscale(factor) = 0.1 ln(factor) + 1 (1 for factor <= 1).
    The tables are fixed per position: unlike LongRoPE nothing switches with the sequence length.
    """

    type: Literal["yarn"] = "yarn"
    factor: PositiveFloat = Field(
        description="How much the slow frequencies are divided (context extension)."
    )
    original_max_positions: PositiveInt = Field(
        description="The pretraining context, which sets the ramp's dims (original_max_position_embeddings)."
    )
    beta_fast: PositiveFloat = Field(
        32.0, description="Turns within the original context above which a dim is kept."
    )
    beta_slow: PositiveFloat = Field(1.0, description="Turns below which a dim is divided by factor.")
    truncate: bool = Field(
        True,
        description="Round the ramp's bounds outward to whole dims (floor / ceil), as transformers' default.",
    )
    attention_factor: PositiveFloat | None = Field(
        None, description="Scale of cos and sin; default: derived from factor (and mscale, mscale_all_dim)."
    )
    mscale: PositiveFloat | None = Field(
        None, description="DeepSeek's numerator weight of ln(factor) in the derived attention factor."
    )
    mscale_all_dim: PositiveFloat | None = Field(
        None, description="DeepSeek's denominator weight; the derived factor uses both or neither."
    )

    def resolved_attention_factor(self) -> float:
        """The cos/sin scale, computed as transformers' ``_compute_yarn_parameters`` does."""
        if self.attention_factor is not None:
            return self.attention_factor

        def mscale(weight: float = 1.0) -> float:
            return 1.0 if self.factor <= 1 else 0.1 * weight * math.log(self.factor) + 1.0

        if self.mscale and self.mscale_all_dim:
            return float(mscale(self.mscale) / mscale(self.mscale_all_dim))
        return mscale()


class DynamicRopeScaling(Spec):
    """Dynamic NTK scaling (bloc97 and emozilla, 2023; transformers' ``rope_type: dynamic``): while a forward's
    positions stay within ``original_max_positions`` the rates are plain RoPE's; once its largest position
    p reaches past it, the base becomes theta * (factor * L / original - (factor - 1)) ** (R / (R - 2)),
    L = p + 1, for that forward (transformers' rule for a fresh model, per call, the batch's largest
    position counting).

    Keys a cache holds keep the rotation of the forward that computed them, as in transformers' generation:
    past the original context, cached decoding is not an uncached forward over the whole sequence
    (docs/hf.md, dynamic NTK and the KV cache).
    """

    type: Literal["dynamic"] = "dynamic"
    factor: PositiveFloat = Field(description="The NTK scaling factor.")
    original_max_positions: PositiveInt = Field(
        description="The context from which the base grows: transformers' max_position_embeddings."
    )


RopeScaling = Annotated[
    Llama3RopeScaling | LinearRopeScaling | LongRopeScaling | YarnRopeScaling | DynamicRopeScaling,
    Field(discriminator="type"),
]


class RotaryPositions(Spec):
    """Rotary embeddings applied to queries and keys (Su et al. 2021), rotate-half layout as in Llama."""

    kind: Literal["rotary"] = "rotary"
    theta: PositiveFloat = 10000.0
    scaling: RopeScaling | None = Field(
        None,
        description="Frequency scaling for long contexts (llama3, linear, longrope, yarn, dynamic); default: "
        "none, plain RoPE.",
    )
    fraction: Annotated[float, Field(gt=0.0, le=1.0)] = Field(
        1.0,
        description="Partial rotary (GPT-NeoX's rotary_pct, partial_rotary_factor): rotate the first "
        "int(head_dim * fraction) dims of each head, pass the rest through unrotated.",
    )

    def rotary_dims(self, head_dim: int) -> int:
        """How many leading dims of each head rotate (transformers' ``int(head_dim * factor)``)."""
        return int(head_dim * self.fraction)

    local_theta: PositiveFloat | None = Field(
        None,
        description="The base of layers whose self-attention pattern is sliding_window, plain RoPE without "
        "scaling (Gemma 3's rope_local_base_freq, ModernBERT's local_rope_theta); default: theta for all.",
    )
    nope_layers: list[NonNegativeInt] = Field(
        default_factory=list,
        description="Layers (from 0) whose attention rotates nothing: no position signal at all there (NoPE, "
        "Kazemnejad et al. 2023; SmolLM3's and Llama 4's no-rope layers); default: every layer rotates.",
    )


class RelativeBiasPositions(Spec):
    """T5's bucketed relative position bias, one table per stack, added to every layer's logits
    (``per_layer``: one table per layer, as umT5).

    Bidirectional in an encoder, unidirectional in a causal decoder: that follows from the stack.
    """

    kind: Literal["relative_bias"] = "relative_bias"
    num_buckets: PositiveInt = 32
    max_distance: PositiveInt = 128
    per_layer: bool = Field(
        False,
        description="umT5: every layer its own (num_buckets, heads) table, rather than one table per stack "
        "that every layer adds (T5).",
    )


class AlibiPositions(Spec):
    """Attention with linear biases (Press et al. 2022): a per-head linear penalty on distance."""

    kind: Literal["alibi"] = "alibi"


class NoPositions(Spec):
    """No position information at all (a bag-of-tokens ablation)."""

    kind: Literal["none"] = "none"


PositionSpec = Annotated[
    SinusoidalPositions
    | LearnedPositions
    | RotaryPositions
    | RelativeBiasPositions
    | AlibiPositions
    | NoPositions,
    Field(discriminator="kind"),
]
ABSOLUTE_POSITION_KINDS = ("sinusoidal", "learned")


class EmbeddingSpec(Spec):
    """Token embeddings and what happens to them before the first layer.

    The token member of the front-end union (`InputEmbeddingSpec`): ``kind: tokens`` may be written or left
    out, and is never dumped, so specs and checkpoints written before the union existed read the same.
    """

    kind: Literal["tokens"] = Field(
        "tokens", exclude=True, description="tokens (this) or patches (`PatchEmbeddingSpec`, images)."
    )
    scale: bool = Field(False, description="Multiply token embeddings by sqrt(d_model), as in the paper.")
    segment_vocab_size: NonNegativeInt = Field(0, description="Token-type (segment) embeddings; 0 = none.")
    norm: bool = Field(False, description="A norm over the summed embeddings (BERT, BART).")
    factorized_dim: PositiveInt | None = Field(
        None,
        description="ALBERT: embeddings of this width, projected up to d_model (with a bias) before the first "
        "layer, after positions and the embedding norm, which work at this width too. Not projection_dim.",
    )
    projection_dim: PositiveInt | None = Field(
        None,
        description="OPT's word_embed_proj_dim (decoders only): tokens are embedded, and a tied LM head reads, "
        "at this width; project_in (no bias) maps to d_model right after the lookup, before d_model-wide "
        "positions, and project_out (no bias) maps the last hidden state back. Not factorized_dim.",
    )

    def token_dim(self, d_model: int) -> int:
        """Width of the token table (and of a tied output head): factorized_dim or projection_dim, else d_model."""
        return self.factorized_dim or self.projection_dim or d_model

    def stack_dim(self, d_model: int) -> int:
        """Width at which a stack adds positions and applies the embedding norm: ALBERT's factorized_dim, else
        d_model (OPT's projection_dim is projected in before the stack)."""
        return self.factorized_dim or d_model


class PatchEmbeddingSpec(Spec):
    """An image front-end (ViT, Dosovitskiy et al. 2021, section 3.1): ``pixel_values`` (B, channels, H, W)
    cut into patch_size x patch_size patches, each projected to d_model by one strided convolution, an
    optional learned class token in front, and a learned table of 2-D positions over the patch grid (plus
    the class token), bicubically interpolated for another image size when asked (Hugging Face's
    ``interpolate_pos_encoding``). Encoder models only; the stack's own ``position`` adds to it (ViT: none).
    """

    model_config = ConfigDict(**Spec.model_config, json_schema_extra={"required": ["kind"]})

    kind: Literal["patches"] = "patches"
    image_size: PositiveInt = Field(
        224, description="Height and width of the (square) images it is trained on."
    )
    patch_size: PositiveInt = Field(16, description="Height and width of one patch; divides image_size.")
    channels: PositiveInt = Field(3, description="Colour channels of pixel_values (3: RGB).")
    class_token: bool = Field(
        True, description="A learned [CLS] vector before the patches (ViT's cls_token)."
    )
    positions: Literal["learned", "none"] = Field(
        "learned",
        description="learned: a (patches [+ 1], d_model) table added before the stack (ViT); none: no table "
        "here (the stack's position then says what there is).",
    )
    bias: bool = Field(True, description="A bias on the patch projection (CLIP has none).")
    norm: bool = Field(
        False, description="A norm over the embeddings before the first layer (CLIP's pre_layrnorm)."
    )

    @model_validator(mode="after")
    def _whole_patches(self) -> PatchEmbeddingSpec:
        if self.image_size % self.patch_size:
            raise ValueError(
                f"image_size ({self.image_size}) must be a multiple of patch_size ({self.patch_size})"
            )
        return self

    @property
    def grid(self) -> int:
        """Patches along each side of an image_size image."""
        return self.image_size // self.patch_size

    @property
    def num_tokens(self) -> int:
        """Positions the stack sees for an image_size image: the patches, and the class token if any."""
        return self.grid**2 + int(self.class_token)

    # What the readers of a token front-end ask of any front-end: an image front-end has no token table.
    @property
    def scale(self) -> bool:
        return False

    @property
    def segment_vocab_size(self) -> int:
        return 0

    @property
    def factorized_dim(self) -> int | None:
        return None

    @property
    def projection_dim(self) -> int | None:
        return None

    def token_dim(self, d_model: int) -> int:
        """Width of the patch embeddings: d_model."""
        return d_model

    def stack_dim(self, d_model: int) -> int:
        """Width at which the stack adds positions: d_model."""
        return d_model


def _embedding_kind(value: Any) -> str:
    """The union member of a front-end spec: its ``kind``, ``tokens`` when none is written (older specs)."""
    kind = value.get("kind", "tokens") if isinstance(value, dict) else getattr(value, "kind", "tokens")
    return kind if kind in ("tokens", "patches") else str(kind)


InputEmbeddingSpec = Annotated[
    Annotated[EmbeddingSpec, Tag("tokens")] | Annotated[PatchEmbeddingSpec, Tag("patches")],
    Discriminator(
        _embedding_kind,
        custom_error_type="embedding_kind",
        custom_error_message="kind must be 'tokens' or 'patches'",
    ),
]
"""A model's input front-end: token ids (`EmbeddingSpec`, the default when ``kind`` is left out) or image
patches (`PatchEmbeddingSpec`)."""
