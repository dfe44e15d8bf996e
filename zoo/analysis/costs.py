"""Cost estimates from a spec: FLOPs per token, training memory, KV-cache bytes. Arithmetic only, no torch.

FLOPs follow Kaplan et al. 2020 (table 1): a matmul with N weights costs 2N FLOPs per token, attention adds
the scores (Q Kᵀ) and the weighted sum (A V), 2 · keys · d_attn FLOPs each per query token and layer,
where d_attn = heads × head_dim. A causal stack sees T/2 keys on average, so a decoder-only model gets
Kaplan's ``2 N + 2 n_layers T d_attn`` exactly. A backward pass costs twice the forward: training = 3×.

Activation memory follows Korthikanti et al. 2022 ("Reducing Activation Recomputation", section 4.1):
the tensors autograd keeps for the backward pass, per token and layer. With 16-bit activations, MHA,
d_ff = 4C and dropout everywhere, one layer keeps ``34 C + 5 H T`` bytes per token, as in the paper.
Shapes: C d_model, H heads, K kv heads, D head dim, F d_ff, E embedding width, V vocab, T length.
"""

from __future__ import annotations

from dataclasses import dataclass

from zoo.spec import AttentionSpec, DecoderSpec, EncoderDecoderSpec, ModelSpec, ResolvedStack

MASK_BYTES = 1  # a dropout mask is one byte per element (torch stores it as bool)
LOSS_BYTES = 4  # the loss casts logits to float32 and keeps the log-probabilities
ADAM_STATE_BYTES = 8  # two float32 moments per trainable parameter
MASTER_BYTES = 4  # float32 master weights when the parameters themselves are 16-bit


def generates(spec: ModelSpec) -> bool:
    """Whether the model generates token by token, and so keeps a KV cache: a decoder or an encoder-decoder.
    An encoder, or a dual encoder (whose causal text tower, in CLIP, reads a whole text once), does not."""
    return isinstance(spec, DecoderSpec | EncoderDecoderSpec)


def assumptions(spec: ModelSpec) -> tuple[str, ...]:
    """What the estimates of ``spec`` assume, one sentence each; only what applies to its family and heads
    (no encoder-decoder note for a decoder, no KV cache for an encoder, no pooler without one)."""
    stacks = spec.stacks().values()
    causal = any(stack.causal for stack in stacks)
    cross = any(stack.cross_attention is not None for stack in stacks)
    heads = getattr(spec, "heads", None)
    per_sequence = getattr(heads, "pooler", False) or getattr(heads, "classifier", None) is not None
    lines = [
        "FLOPs: 2 per weight per token for every matmul (Kaplan et al. 2020); embedding lookups, norms, "
        "softmax and activations are not counted"
        + ("; causal self-attention sees T/2 keys on average" if causal else ""),
        "training FLOPs = 3 × forward (the backward pass costs twice the forward)",
    ]
    if cross:
        lines.append("encoder-decoder: per target token, with a source as long as the target (seq_len each)")
    if per_sequence:
        lines.append(
            "pooler and classifier run once per sequence: their FLOPs are spread over seq_len tokens"
        )
    lines += [
        "activations: what autograd keeps for backward (Korthikanti et al. 2022), in the given dtype, "
        "dropout masks 1 byte, loss log-probabilities float32; no recomputation, no framework overhead",
        "attention matrices (H × T × T per layer) are kept by eager attention; fused SDPA kernels "
        "(flash / memory-efficient) do not store them: subtract attention_matrices for those",
        "training states: weights and gradients in the given dtype, Adam's two moments in float32, "
        "plus float32 master weights when the dtype is 16-bit (Rajbhandari et al. 2020: 16 bytes/parameter)",
    ]
    if causal and getattr(spec, "lm_head", None) is not None:
        lines.append(
            "the loss's float32 log-probabilities are counted for every token, as model(labels=...) and "
            "zoo train's default (loss.chunk_tokens: null) keep them; loss.chunk_tokens: auto holds one chunk at a time "
            "(docs/large-models.md)"
        )
    if generates(spec):
        lines.append(
            "KV cache: keys and values of every decoder layer in the given dtype (GQA: kv heads only)"
            + ("; cross-attention caches its keys/values once per source token" if cross else "")
        )
    return tuple(lines)


@dataclass(frozen=True)
class Flops:
    """FLOPs per token: ``dense`` (2 × weights as run), ``attention`` (scores + weighted sum), ``head``."""

    dense: float
    attention: float
    head: float

    @property
    def forward(self) -> float:
        return self.dense + self.attention + self.head

    @property
    def training(self) -> float:
        return 3 * self.forward


def d_attn(attention: AttentionSpec, d_model: int) -> int:
    """Width of all query heads together, H × D (d_model for plain MHA)."""
    return attention.num_heads * attention.resolved_head_dim(d_model)


def attention_flops(stacks: dict[str, ResolvedStack], *, d_model: int, seq_len: int) -> float:
    """Scores + weighted sum per token: 4 · d_attn · keys per layer (keys = T, or T/2 when causal)."""
    total = 0.0
    for stack in stacks.values():
        keys = seq_len / 2 if stack.causal else seq_len
        total += stack.num_layers * 4 * d_attn(stack.attention, d_model) * keys
        if stack.cross_attention is not None:  # every target token sees the whole source
            total += stack.num_layers * 4 * d_attn(stack.cross_attention, d_model) * seq_len
    return total


def layer_activation_bytes(
    stack: ResolvedStack, *, d_model: int, seq_len: int, dtype_bytes: int, dropout: float
) -> tuple[float, float]:
    """Bytes one layer keeps for backward, per token: (total, of which attention matrices).

    Self-attention keeps its input, q, k, v, the softmax output (H × T per query, the full square even
    when causal), the out-projection input, a residual-dropout mask and the norm input. The FFN keeps
    its input, the activation input and output (gated: gate|up, act(gate) and the product too).
    """
    p, C = dtype_bytes, d_model
    mask = MASK_BYTES if dropout > 0 else 0

    def attention(spec: AttentionSpec, *, keys: int, self_attention: bool) -> tuple[float, float]:
        D = spec.resolved_head_dim(d_model)
        H, K = spec.num_heads, spec.kv_heads
        kv = 2 * K * D if self_attention else 0  # cross k, v are per source token: counted by the caller
        linear = p * (C + H * D + kv + H * D) + mask * C + p * C  # input, q, k, v, out_proj input, mask, norm
        matrices = p * H * keys + ((MASK_BYTES + p) * H * keys if spec.dropout > 0 else 0)
        return linear + matrices, matrices

    total, matrices = attention(stack.attention, keys=seq_len, self_attention=True)
    if stack.cross_attention is not None:
        cross_total, cross_matrices = attention(stack.cross_attention, keys=seq_len, self_attention=False)
        cross_kv = p * 2 * stack.cross_attention.kv_heads * stack.cross_attention.resolved_head_dim(C)
        total, matrices = total + cross_total + cross_kv, matrices + cross_matrices
    F = stack.ffn.d_ff
    hidden = 4 * F if stack.ffn.gated else 2 * F
    ffn_dropout = (MASK_BYTES + p) * F if stack.ffn.dropout > 0 else 0
    total += p * (C + hidden) + ffn_dropout + mask * C + p * C  # input, hidden, dropout, residual mask, norm
    return total, matrices


def activation_bytes(spec: ModelSpec, *, batch: int, seq_len: int, dtype_bytes: int) -> tuple[float, float]:
    """Bytes a training step keeps for backward: (total, of which attention matrices)."""
    p, C, E = dtype_bytes, spec.d_model, spec.embedding_dim
    mask = MASK_BYTES if spec.dropout > 0 else 0
    per_token, matrices = 0.0, 0.0
    for stack in spec.stacks().values():
        layer, layer_matrices = layer_activation_bytes(
            stack, d_model=C, seq_len=seq_len, dtype_bytes=p, dropout=spec.dropout
        )
        per_token += stack.num_layers * layer
        matrices += stack.num_layers * layer_matrices
        # the embeddings (+ positions), the embedding norm's input, ALBERT's projection input
        embed_tensors = 1 + int(spec.embedding.norm) + int(spec.embedding.factorized_dim is not None)
        per_token += p * E * embed_tensors + mask * E + (p * C if stack.norm.has_final else 0)
        if stack.cross_attention is not None:
            per_token += p * C  # the encoder output every layer's kv_proj reads (one tensor)
    per_token += _head_bytes(spec, dtype_bytes=p)
    tokens = batch * seq_len
    return per_token * tokens, matrices * tokens


def _head_bytes(spec: ModelSpec, *, dtype_bytes: int) -> float:
    lm_head = getattr(spec, "lm_head", None)
    heads = getattr(spec, "heads", None)
    if lm_head is not None:
        return dtype_bytes * spec.d_model + LOSS_BYTES * spec.vocab_size
    if getattr(heads, "mlm", None) is not None:  # dense input, act input, norm input, decoder input
        return dtype_bytes * (spec.d_model + 3 * spec.embedding_dim) + LOSS_BYTES * spec.vocab_size
    return 0.0


def kv_cache_bytes(spec: ModelSpec, *, dtype_bytes: int) -> tuple[int, int]:
    """(self-attention bytes per generated token, cross-attention bytes per source token).

    2 (k and v) × layers × kv heads × head dim × bytes, or layers × (kv_lora_rank + rope dims) × bytes for
    latent attention (its latent and shared rope key); a model that does not generate caches nothing.
    """
    self_bytes = cross_bytes = 0
    for stack in spec.stacks().values():
        if not stack.causal or not generates(spec):
            continue
        att = stack.attention
        self_bytes += stack.num_layers * att.cache_width(spec.d_model) * dtype_bytes
        if stack.cross_attention is not None:
            cross = stack.cross_attention
            cross_bytes += (
                2 * stack.num_layers * cross.kv_heads * cross.resolved_head_dim(spec.d_model) * dtype_bytes
            )
    return self_bytes, cross_bytes


def mha_kv_cache_bytes(spec: ModelSpec, *, dtype_bytes: int) -> int:
    """Bytes per generated token that multi-head attention with the same heads and widths would cache: for
    latent attention, every head's key (head_dim + rope dims) and value (v_head_dim), as transformers'
    DynamicCache holds them expanded; for (grouped-query) attention, every head's key and value."""
    total = 0
    for stack in spec.stacks().values():
        if not stack.causal or not generates(spec):
            continue
        att, C = stack.attention, spec.d_model
        value = (att.latent.v_head_dim if att.latent is not None else None) or att.resolved_head_dim(C)
        total += stack.num_layers * att.num_heads * (att.qk_head_dim(C) + value) * dtype_bytes
    return total


@dataclass(frozen=True)
class TrainingStates:
    """Bytes of what lives through a whole training run: weights, gradients, Adam moments, master copy."""

    weights: int
    gradients: int
    optimizer: int
    master_weights: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.master_weights


def training_states(*, total: int, trainable: int, dtype_bytes: int) -> TrainingStates:
    """Adam with float32 moments; a float32 master copy of the trainable weights when training in 16 bits."""
    return TrainingStates(
        weights=total * dtype_bytes,
        gradients=trainable * dtype_bytes,
        optimizer=trainable * ADAM_STATE_BYTES,
        master_weights=trainable * MASTER_BYTES if dtype_bytes < 4 else 0,
    )
