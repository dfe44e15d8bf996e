"""Mixture-of-Experts feed-forward, built from a `MoESpec` (Shazeer et al. 2017; Switch, Mixtral, Qwen-MoE).

    x (N, C) ──router──> softmax (N, E) ──top-k──> weights w (N, k), experts e (N, k)
      │                                                  │
      └──> sort the N·k (token, expert) pairs by expert ──> each expert's SwiGLU over its contiguous
           slice ──> × w ──> index_add back to the tokens ──(+ sigmoid(gate(x)) · shared(x))──> (N, C)

Shapes: ``N`` tokens (B·T flattened), ``C`` d_model, ``E`` experts, ``k`` top_k, ``F`` an expert's width,
``A = N·k`` routed (token, expert) pairs.

Dispatch is vectorised: one argsort and one bincount place every pair; the experts then run over their
slices of the sorted rows, as transformers' ``grouped_mm`` experts do: on the CPU one ``torch._grouped_mm``
per projection (offsets stay on the device, no host sync; float32/16 and bfloat16 with widths that are
multiples of 16 bytes, its kernel's rule), else one matmul per expert (a loop over experts, never over
tokens). The slice lengths of that loop are data: reading them is one host sync, and under
``torch.compile`` a graph break. So under ``torch.export``, and under ``torch.compile`` when there are few
pairs (``A <= num_experts``: a decode step), each pair gathers its expert's weights instead, one batched
matmul over ``A`` rows with no host sync: exact, and its (A, 2F, C) gathered weights cost no more memory
than the experts' own. A compiled training step (many pairs) keeps the grouped path and its graph break;
an exported program gathers at every size (it has one graph for all shapes), so it suits inference
batches, not long training ones.

The expert weights are stacked: ``up_proj`` ``(E, 2F, C)`` (gate rows first, then up, as transformers'
``gate_up_proj``) and ``down_proj`` ``(E, C, F)``, each a `StackedLinear` read through ``stacked_weight()``.
That one method is where `zoo.lora` adds an adapter's per-expert update (`zoo.lora.experts`), so the
dispatch stays the same, vectorised, with or without adapters.

gpt-oss's options (`MoESpec.router_bias`, ``expert_bias``, ``clamped_glu``): a biased router, biased experts
(``experts.up_bias`` (E, 2F), ``experts.down_bias`` (E, C), each pair adding its expert's row), and the
clamped SwiGLU ``(clamp(up) + 1) * g * sigmoid(alpha * g)``, ``g = min(gate, limit)``, in place of
``act(gate) * up``. gpt-oss's softmax over the top-k logits is Mixtral's renormalised top-k of the softmax.

Router statistics (softmax probabilities and the chosen experts) come back with the output; the model turns
them into the load-balancing loss (`zoo.losses.load_balancing_loss`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from zoo.blocks.ffn import ACTIVATIONS, FeedForward
from zoo.spec import ClampedGLU, FFNSpec, MoESpec


@dataclass
class RouterOutput:
    """One sparse layer's routing, for the load-balancing loss: tokens flattened in (B, T) order."""

    probs: torch.Tensor  # (N, E) float32 softmax over every expert
    experts: torch.Tensor  # (N, k) the chosen experts, best first


class StackedLinear(nn.Module):
    """``num`` bias-free linear maps of one shape, one parameter: ``weight`` (E, O, I)."""

    def __init__(self, num: int, in_features: int, out_features: int) -> None:
        super().__init__()
        self.num, self.in_features, self.out_features = num, in_features, out_features
        self.weight = nn.Parameter(torch.empty(num, out_features, in_features))  # (E, O, I)

    def extra_repr(self) -> str:
        return f"num={self.num}, in_features={self.in_features}, out_features={self.out_features}"

    def stacked_weight(self) -> torch.Tensor:
        """(E, O, I): the weights the experts multiply by (a LoRA wrapper adds its update here)."""
        return self.weight


class Experts(nn.Module):
    """``E`` gated experts with stacked weights: expert ``e`` maps x -> down[e] @ (act(gate) * up)."""

    def __init__(
        self,
        *,
        num_experts: int,
        d_model: int,
        d_ff: int,
        activation: str,
        bias: bool = False,
        clamped_glu: ClampedGLU | None = None,
        weighted_input: bool = False,
    ) -> None:
        super().__init__()
        self.d_ff = d_ff
        self.up_proj = StackedLinear(num_experts, d_model, 2 * d_ff)  # (E, 2F, C): gate rows, then up
        self.down_proj = StackedLinear(num_experts, d_ff, d_model)  # (E, C, F)
        self.act = ACTIVATIONS[activation]
        self.clamped_glu = clamped_glu
        self.weighted_input = weighted_input  # Llama 4: expert(w · x), not w · expert(x)
        # Biases beside the stacked weights, not in them: a LoRA wrapper replaces the StackedLinear alone.
        self.up_bias = nn.Parameter(torch.zeros(num_experts, 2 * d_ff)) if bias else None  # (E, 2F)
        self.down_bias = nn.Parameter(torch.zeros(num_experts, d_model)) if bias else None  # (E, C)

    def weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(up (E, 2F, C), down (E, C, F)) as the experts use them."""
        return self.up_proj.stacked_weight(), self.down_proj.stacked_weight()

    def _swiglu(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = h.split(self.d_ff, dim=-1)  # (..., F) each
        if self.clamped_glu is not None:  # gpt-oss: clamped, and the up half offset by one
            limit, alpha = self.clamped_glu.limit, self.clamped_glu.alpha
            gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
            return (up + 1) * gate * torch.sigmoid(gate * alpha)
        return self.act(gate) * up

    def _weighed(self, x: torch.Tensor, y: torch.Tensor | None, weight: torch.Tensor) -> torch.Tensor:
        """A pair's router weight (A,) on its expert's input x (A, C) (``y`` None, `weighted_input`) or on
        its output y (A, C)."""
        if y is None:
            return x * weight.unsqueeze(-1) if self.weighted_input else x
        return y if self.weighted_input else y * weight.unsqueeze(-1)

    def _biased(
        self, h: torch.Tensor, bias: torch.Tensor | None, experts: torch.Tensor | int
    ) -> torch.Tensor:
        """h (A, O) plus each row's expert's bias row (bias (E, O); ``experts`` (A,) or one expert)."""
        return h if bias is None else h + bias[experts]

    def grouped(
        self,
        x: torch.Tensor,
        token: torch.Tensor,
        weight: torch.Tensor,
        counts: torch.Tensor,
        experts: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x (N, C); the A pairs sorted by expert, ``counts[e]`` (E,) of expert e: their token (A,) and
        router weight (A,) -> (N, C), each token's weighted sum over its experts. ``experts`` (A,): each
        pair's expert, for the expert biases (needed only with them)."""
        up, down = self.weights()
        if _grouped_mm_fits(x, up, down):
            offsets = counts.cumsum(0, dtype=torch.int32)  # (E,) where each expert's rows end
            rows = self._weighed(x[token], None, weight)  # (A, C)
            h = torch._grouped_mm(rows, up.transpose(1, 2), offs=offsets)  # (A, C) @ (E, C, 2F): (A, 2F)
            if self.up_bias is not None:
                assert experts is not None, "biased experts need each pair's expert"
                h = self._biased(h, self.up_bias, experts)
            y = torch._grouped_mm(self._swiglu(h), down.transpose(1, 2), offs=offsets)  # (A, C)
            if self.down_bias is not None:
                assert experts is not None
                y = self._biased(y, self.down_bias, experts)
            return x.new_zeros(x.shape).index_add_(0, token, self._weighed(x, y, weight))
        out = x.new_zeros(x.shape)
        sizes = counts.tolist()  # the one host sync
        for e, (rows, w) in enumerate(zip(token.split(sizes), weight.split(sizes))):  # experts, not tokens
            if rows.shape[0]:
                h = self._biased(
                    F.linear(self._weighed(x[rows], None, w), up[e]), self.up_bias, e
                )  # (n_e, 2F)
                y = self._biased(F.linear(self._swiglu(h), down[e]), self.down_bias, e)  # (n_e, C)
                out.index_add_(0, rows, self._weighed(x, y, w))
        return out

    def gathered(
        self, x: torch.Tensor, token: torch.Tensor, weight: torch.Tensor, experts: torch.Tensor
    ) -> torch.Tensor:
        """As `grouped` for pairs in any order, ``experts`` (A,) naming each pair's expert, with no host sync:
        each pair gathers its expert's weights (A, 2F, C) and (A, C, F) for one batched matmul each."""
        up, down = self.weights()
        rows = self._weighed(x[token], None, weight)  # (A, C)
        h = torch.bmm(up[experts], rows.unsqueeze(-1)).squeeze(-1)  # (A, 2F, C) @ (A, C, 1) -> (A, 2F)
        h = self._biased(h, self.up_bias, experts)
        y = torch.bmm(down[experts], self._swiglu(h).unsqueeze(-1)).squeeze(-1)  # (A, C)
        y = self._biased(y, self.down_bias, experts)
        return x.new_zeros(x.shape).index_add_(0, token, self._weighed(x, y, weight))


class MoEFeedForward(nn.Module):
    """Shapes: x (B, T, C) -> ((B, T, C), `RouterOutput`)."""

    def __init__(self, spec: MoESpec, *, d_model: int) -> None:
        super().__init__()
        self.num_experts, self.top_k = spec.num_experts, spec.top_k
        self.normalize_top_k = spec.normalize_top_k
        self.jitter = spec.jitter
        self.sigmoid, self.routed_scale = spec.scoring == "sigmoid", spec.routed_scale
        self.num_groups, self.top_groups = spec.num_groups, spec.active_groups
        self.group_max = spec.group_score == "max"
        self.bias_update_rate = spec.bias_update_rate
        self.router = nn.Linear(d_model, spec.num_experts, bias=spec.router_bias)
        self.score_bias: torch.Tensor | None
        if spec.score_bias:  # a buffer: set by its update rule (or the checkpoint), never by gradients
            self.register_buffer("score_bias", torch.zeros(spec.num_experts))
        else:
            self.score_bias = None
        self.experts = Experts(
            num_experts=spec.num_experts,
            d_model=d_model,
            d_ff=spec.d_ff,
            activation=spec.activation,
            bias=spec.expert_bias,
            clamped_glu=spec.clamped_glu,
            weighted_input=spec.weighted_input,
        )
        self.shared: FeedForward | None = None
        self.shared_gate: nn.Linear | None = None
        if spec.shared_d_ff is not None:
            shared = FFNSpec(d_ff=spec.shared_d_ff, activation=spec.activation, gated=True, bias=False)
            self.shared = FeedForward(shared, d_model=d_model)
            self.shared_gate = nn.Linear(d_model, 1, bias=False) if spec.shared_gate else None

    @torch.no_grad()
    def init_weights(self, *, std: float, residual_std: float | None = None) -> None:
        """The stacked expert weights from N(0, std), ``down_proj`` from N(0, residual_std) when given
        (`zoo.models.init`: nn.Linear layers are drawn there, these parameters are not Linear)."""
        self.experts.up_proj.weight.normal_(0.0, std)
        self.experts.down_proj.weight.normal_(0.0, residual_std if residual_std is not None else std)
        for bias in (self.experts.up_bias, self.experts.down_bias):
            if bias is not None:
                bias.zero_()
        if self.shared is not None:
            self.shared.init_weights(residual_std=residual_std)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (N, C) -> (probs (N, E) float32, top-k weights (N, k) in x's dtype, experts (N, k)).

        ``probs`` are the softmax, or the sigmoid scores each token's sum divides (what a balancing loss
        reads); the weights are the chosen experts' softmax probabilities or sigmoid scores."""
        logits = self.router(x).float()  # (N, E), float32 as in transformers' routers
        if not self.sigmoid and self.score_bias is None and self.num_groups == 1:
            probs = F.softmax(logits, dim=-1)
            weights, experts = probs.topk(self.top_k, dim=-1)  # (N, k) each
        else:
            scores = torch.sigmoid(logits) if self.sigmoid else F.softmax(logits, dim=-1)  # (N, E)
            experts = self._choose(scores)  # (N, k)
            weights = scores.gather(1, experts)  # (N, k)
            probs = scores / scores.sum(dim=-1, keepdim=True) if self.sigmoid else scores
        if self.normalize_top_k:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + (1e-20 if self.sigmoid else 0.0))
        if self.routed_scale != 1.0:
            weights = weights * self.routed_scale
        return probs, weights.to(x.dtype), experts

    def _choose(self, scores: torch.Tensor) -> torch.Tensor:
        """(N, E) scores -> (N, k) experts: the best biased scores within each token's ``top_groups`` groups,
        a group ranked by the sum of its two best (DeepSeek-V3's ``noaux_tc``) or by its best (``group_score:
        max``, DeepSeek-V2's ``group_limited_greedy``)."""
        choice = scores + self.score_bias if self.score_bias is not None else scores  # (N, E)
        if self.top_groups < self.num_groups:
            N, G = choice.shape[0], self.num_groups
            grouped = choice.view(N, G, -1)  # (N, G, E / G)
            if self.group_max:
                group_scores = grouped.amax(dim=-1)  # (N, G)
            else:
                group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)  # (N, G)
            groups = group_scores.topk(self.top_groups, dim=-1).indices  # (N, top_groups)
            keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, groups, True)  # (N, G)
            choice = grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).view(N, -1)  # (N, E)
        return choice.topk(self.top_k, dim=-1).indices

    @torch.no_grad()
    def _update_bias(self, experts: torch.Tensor) -> None:
        """Aux-loss-free balancing (DeepSeek-V3, section 2.1.2): each expert's bias moves by the rate toward
        balance, up when it took fewer (token, expert) pairs than the mean, down when more."""
        assert self.score_bias is not None
        load = torch.bincount(experts.reshape(-1), minlength=self.num_experts).float()  # (E,)
        self.score_bias.add_(self.bias_update_rate * torch.sign(load.mean() - load))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, RouterOutput]:
        B, T, C = x.shape
        flat = x.reshape(B * T, C)  # (N, C)
        if self.training and self.jitter > 0:  # Mixtral's router_jitter_noise: routing and experts see it
            flat = flat * torch.empty_like(flat).uniform_(1.0 - self.jitter, 1.0 + self.jitter)
        probs, weights, experts = self.route(flat)
        if self.training and self.bias_update_rate > 0:
            self._update_bias(experts)
        out = self._dispatch(flat, weights, experts)  # (N, C)
        if self.shared is not None:
            shared = self.shared(flat)  # (N, C)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(flat)) * shared
            out = out + shared
        return out.view(B, T, C), RouterOutput(probs=probs, experts=experts)

    def _dispatch(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """x (N, C), weights and experts (N, k) -> sum over k of weight · expert(x), (N, C)."""
        pairs = experts.reshape(-1)  # (A,) pair p = (token p // k, its (p % k)-th expert)
        if torch.compiler.is_exporting() or (
            torch.compiler.is_compiling() and pairs.shape[0] <= self.num_experts
        ):  # no data-dependent slice lengths: one graph, no host sync
            token = torch.arange(pairs.shape[0], device=x.device) // self.top_k  # (A,)
            return self.experts.gathered(x, token, weights.reshape(-1), pairs)
        order = pairs.argsort(stable=True)  # (A,) pairs grouped by expert, in token order within one
        counts = torch.bincount(pairs, minlength=self.num_experts)  # (E,)
        return self.experts.grouped(x, order // self.top_k, weights.reshape(-1)[order], counts, pairs[order])


_GROUPED_MM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _grouped_mm_fits(x: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> bool:
    """Whether torch's grouped GEMM can run these experts eagerly: on the CPU (its CUDA kernel wants
    bfloat16 on recent GPUs only), in a dtype it has, with rows a multiple of 16 bytes long."""
    if not hasattr(torch, "_grouped_mm") or x.device.type != "cpu" or torch.compiler.is_compiling():
        return False
    if x.dtype not in _GROUPED_MM_DTYPES or not x.dtype == up.dtype == down.dtype:
        return False
    return all(width * x.element_size() % 16 == 0 for width in (up.shape[1], up.shape[2], down.shape[2]))


def layer_ffn(spec: FFNSpec | MoESpec, layer_idx: int) -> FFNSpec | MoESpec:
    """The FFN layer ``layer_idx`` of a stack runs: dense, sparse, or the dense FFN of an MoE stack's dense
    layers (`MoESpec.is_sparse`)."""
    if isinstance(spec, MoESpec) and not spec.is_sparse(layer_idx):
        return spec.dense_spec()
    return spec


def build_ffn(spec: FFNSpec | MoESpec, *, d_model: int) -> FeedForward | MoEFeedForward:
    """A dense FFN, or a Mixture-of-Experts layer (`layer_ffn` says which one a layer of an MoE stack runs)."""
    if isinstance(spec, MoESpec):
        return MoEFeedForward(spec, d_model=d_model)
    return FeedForward(spec, d_model=d_model)
