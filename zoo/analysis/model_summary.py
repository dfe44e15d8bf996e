"""`summary`: a model's parameter counts, FLOPs, training memory and KV cache, as a `ModelSummary`.

A spec, preset name, spec file or saved checkpoint directory is built on the meta device (no memory, no
initialisation) by `load_target_spec`; a built model is read as it is. The counting is in
`zoo.analysis.counts`, the formulas in `zoo.analysis.costs`, the module tree in `zoo.analysis.tree`.
Imports no torch until `summary` runs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from zoo.analysis.costs import generates
from zoo.io.names import SPEC_NAME
from zoo.spec import DualEncoderSpec, ModelSpec, SpecError, load_spec, parse_spec, preset

DTYPES = {
    "float32": ("float32", 4),
    "fp32": ("float32", 4),
    "float": ("float32", 4),
    "bfloat16": ("bfloat16", 2),
    "bf16": ("bfloat16", 2),
    "float16": ("float16", 2),
    "fp16": ("float16", 2),
    "half": ("float16", 2),
    "float64": ("float64", 8),
    "double": ("float64", 8),
}

if TYPE_CHECKING:  # these import torch; this module loads without it until summary() runs
    from zoo.analysis.costs import Flops, TrainingStates
    from zoo.analysis.counts import ParameterCounts
    from zoo.analysis.towers import Part
    from zoo.analysis.tree import SummaryNode


def load_target_spec(target: Any) -> ModelSpec:
    """The spec of a preset name, a YAML/JSON spec file, a saved checkpoint directory, a mapping or a spec.

    A directory is read for the spec in its safetensors metadata (authoritative), or its ``spec.json`` when
    it holds no weights; so is a ``.safetensors`` file. No weights are read.
    """
    if isinstance(target, dict):
        return parse_spec(target)
    if not isinstance(target, str | Path):
        return target  # already a spec
    path = Path(target).expanduser()
    # The spec inside the weights is authoritative: after a crashed save, spec.json may lag one save behind.
    has_weights = path.is_dir() and any(path.glob("*.safetensors*"))
    if path.is_dir() and (path / SPEC_NAME).is_file() and not has_weights:
        return load_spec(path / SPEC_NAME)
    if path.is_dir() or path.suffix == ".safetensors":
        if path.is_dir() and not any(path.glob("*.safetensors*")):
            raise SpecError(f"{path}: not a zoo checkpoint directory (no spec.json, no model.safetensors)")
        from zoo.io.checkpoint import read_spec

        return read_spec(path)
    if path.is_file() or path.suffix in (".yaml", ".yml", ".json"):
        return load_spec(path)
    return preset(str(target))


def dtype_info(dtype: Any) -> tuple[str, int]:
    """(canonical name, bytes per element) of a dtype name ("bf16", "float32", ...) or a torch.dtype."""
    key = str(dtype).removeprefix("torch.").lower()
    if key not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not known; use one of {', '.join(DTYPES)}")
    return DTYPES[key]


@dataclass(frozen=True)
class ModelSummary:
    """What `summary` returns; every size in bytes, every FLOP count per token unless named per step."""

    name: str | None
    family: str
    source: str | None
    seq_len: int
    batch: int
    dtype: str
    dtype_bytes: int
    parameters: ParameterCounts
    flops: Flops  # per token: .dense, .attention, .head, .forward, .training
    training_states: TrainingStates  # weights, gradients, Adam moments, float32 master copy
    activations: float  # bytes kept for backward in one training step of batch × seq_len tokens
    attention_matrices: float  # of which the H × T × T attention matrices (none with fused kernels)
    kv_cache_per_token: int  # decoder self-attention, bytes per generated token (0 when it cannot generate)
    cross_kv_cache_per_source_token: int  # encoder-decoder: cross-attention keys/values per source token
    tree: SummaryNode
    notes: tuple[str, ...]
    assumptions: tuple[str, ...]
    parts: tuple[Part, ...] = ()  # a dual encoder: vision tower, text tower, heads (they sum to the total)

    @property
    def training_flops_per_step(self) -> float:
        return self.flops.training * self.batch * self.seq_len

    @property
    def training_step_bytes(self) -> float:
        """Weights, gradients, optimizer states and activations of one training step."""
        return self.training_states.total + self.activations

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (what `zoo show --json` prints)."""
        states = self.training_states
        return {
            "name": self.name,
            "family": self.family,
            "source": self.source,
            "settings": {
                "seq_len": self.seq_len,
                "batch": self.batch,
                "dtype": self.dtype,
                "dtype_bytes": self.dtype_bytes,
            },
            "parameters": asdict(self.parameters),
            "parts": [asdict(part) for part in self.parts],
            "flops": {
                "forward_per_token": self.flops.forward,
                "training_per_token": self.flops.training,
                "training_per_step": self.training_flops_per_step,
                "breakdown_per_token": asdict(self.flops),
            },
            "memory_bytes": {
                **asdict(states),
                "training_states": states.total,
                "activations": self.activations,
                "attention_matrices": self.attention_matrices,
                "training_step": self.training_step_bytes,
                "kv_cache_per_token": self.kv_cache_per_token,
                "cross_kv_cache_per_source_token": self.cross_kv_cache_per_source_token,
            },
            "notes": list(self.notes),
            "assumptions": list(self.assumptions),
            "tree": asdict(self.tree),
        }


def summary(
    model_or_spec: Any, *, seq_len: int | None = None, batch: int = 1, dtype: Any = None
) -> ModelSummary:
    """Parameter counts, FLOPs, training memory and KV-cache size of a model or spec.

    ``model_or_spec``: a built zoo model, a spec, a preset name, a spec file or a checkpoint directory.
    ``seq_len`` defaults to the spec's ``max_positions`` (an image front-end's: the tokens of one
    ``image_size`` image); ``dtype`` (e.g. "bf16") to the model's
    parameter dtype, float32 for a spec.

    >>> zoo.summary("gpt2", seq_len=1024).flops.forward   # FLOPs per token
    """
    from torch import nn

    from zoo.analysis import costs
    from zoo.analysis.counts import count_parameters, head_flops
    from zoo.analysis.towers import dual_encoder_parts
    from zoo.analysis.tree import build_tree
    from zoo.models.build import build_model

    model: nn.Module
    spec: ModelSpec
    if isinstance(model_or_spec, nn.Module):
        # nn.Module types attributes it does not declare as Tensor | Module; a zoo model's spec is a ModelSpec.
        model, spec = model_or_spec, cast(ModelSpec, model_or_spec.spec)
        if dtype is None:
            dtype = next(model.parameters()).dtype
    else:
        spec = load_target_spec(model_or_spec)
        model = build_model(spec, device="meta", init=False)
    if seq_len is None:  # an image front-end: the tokens of one image at its trained size
        seq_len = getattr(spec.embedding, "num_tokens", spec.max_positions)
    if seq_len < 1 or batch < 1:
        raise ValueError(f"seq_len ({seq_len}) and batch ({batch}) must be positive")
    dtype_name, p = dtype_info(dtype or "float32")

    counts = count_parameters(model)
    stacks = spec.stacks()
    flops = costs.Flops(
        dense=2.0 * (counts.body_as_run - (counts.total - counts.active)),  # MoE: the routed experts only
        attention=costs.attention_flops(stacks, d_model=spec.d_model, seq_len=seq_len),
        head=head_flops(model, seq_len=seq_len),
    )
    activations, matrices = costs.activation_bytes(spec, batch=batch, seq_len=seq_len, dtype_bytes=p)
    kv_self, kv_cross = costs.kv_cache_bytes(spec, dtype_bytes=p)
    return ModelSummary(
        name=spec.name,
        family=spec.family,
        source=spec.source,
        seq_len=seq_len,
        batch=batch,
        dtype=dtype_name,
        dtype_bytes=p,
        parameters=counts,
        flops=flops,
        training_states=costs.training_states(total=counts.total, trainable=counts.trainable, dtype_bytes=p),
        activations=activations,
        attention_matrices=matrices,
        kv_cache_per_token=kv_self,
        cross_kv_cache_per_source_token=kv_cross,
        tree=build_tree(model),
        notes=tuple(
            _notes(
                spec,
                counts,
                seq_len=seq_len,
                kv_bytes=(kv_self, costs.mha_kv_cache_bytes(spec, dtype_bytes=p)),
            )
        ),
        assumptions=costs.assumptions(spec),
        parts=dual_encoder_parts(model),
    )


def _notes(spec: ModelSpec, counts: ParameterCounts, *, seq_len: int, kv_bytes: tuple[int, int]) -> list[str]:
    """``kv_bytes``: (the KV cache per token, what multi-head attention with the same heads would cache)."""
    notes = []
    if counts.tied:
        notes.append(
            f"tied: the token embedding ({counts.tied:,} parameters) is also the output matrix; "
            "stored and counted once"
        )
    if counts.trainable != counts.total:
        notes.append(
            f"frozen: {counts.total - counts.trainable:,} parameters are stored but not trained (requires_grad "
            "off, as Whisper's fixed sinusoidal encoder positions): no gradients or Adam moments for them"
        )
    for name, stack in spec.stacks().items():
        if stack.share_layers and stack.num_layers > 1:
            notes.append(
                f"{name}: one layer's weights run {stack.num_layers} times (cross-layer sharing); "
                f"the counts store it once, FLOPs count every run ({counts.body_as_run:,} body parameters as run)"
            )
    if counts.active != counts.total:
        notes.append(
            f"experts: each token runs top_k of each Mixture-of-Experts layer's experts, {counts.active:,} of "
            f"the {counts.total:,} parameters; FLOPs count the active ones, memory all"
        )
    latent = [
        s.attention.latent for s in spec.stacks().values() if s.causal and s.attention.latent is not None
    ]
    if latent and generates(spec):
        kv, mha = kv_bytes
        notes.append(
            f"latent attention: the KV cache holds kv_lora_rank {latent[0].kv_lora_rank} + rope "
            f"{latent[0].rope_head_dim} numbers per token and layer, {kv:,} bytes per token against {mha:,} for "
            f"multi-head attention with the same heads ({mha / kv:.1f}x)"
        )
    if isinstance(spec, DualEncoderSpec):
        notes.append(
            "a dual encoder generates nothing (it scores whole texts against whole images), so it keeps no KV "
            "cache; FLOPs and activations are the text tower's per text token, with the vision tower's weights "
            "counted in the dense FLOPs"
        )
    elif not generates(spec):
        notes.append("an encoder generates nothing, so it keeps no KV cache")
    if seq_len > spec.max_positions:
        notes.append(
            f"seq_len {seq_len} exceeds max_positions {spec.max_positions}: the model cannot run it as "
            "built; the estimates are arithmetic only"
        )
    return notes
