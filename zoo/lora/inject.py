"""Putting adapters into a model from outside, and taking them out: `apply`, `merge`, `unmerge`,
`merge_and_unload`, `disabled` (the base alone, for a while), `trainable_parameters`.

Nothing in `zoo.blocks` knows about LoRA. `apply` finds the projections a `LoraSpec` targets by walking the
model's `Attention` and `FeedForward` blocks and replaces each ``nn.Linear`` attribute on its block by a
`LoraLinear` that takes over its parameters:

    target       block (in each layer of each stack)      attribute(s) replaced
    qkv          self_attn / cross_attn                    qkv_proj (self) | q_proj + kv_proj (cross); latent
                                                           attention: q_proj or q_a_proj + q_b_proj, kv_a_proj,
                                                           kv_b_proj
    out          self_attn / cross_attn                    out_proj
    ffn_in       ffn                                       up_proj (gate and up rows, when gated)
    ffn_out      ffn                                       down_proj

In a Mixture-of-Experts FFN the ``ffn`` targets reach the experts (``ffn.experts.up_proj`` / ``down_proj``,
stacked `StackedLinear` weights: a `LoraStackedLinear` gives each expert its own adapter, see
`zoo.lora.experts`), its shared expert and the stack's dense layers alike.

Every target is resolved (and a target that matches nothing refused) before any module is replaced, so a
refused call leaves the model as it was.

QLoRA (``quantize_base="nf4"``): every frozen projection of the attention and FFN blocks is stored NF4
(`zoo.lora.nf4`), the adapted ones inside their `LoraLinear`, the others as `Nf4Linear` — as
bitsandbytes' 4-bit loading quantises every linear layer before PEFT wraps its targets. Embeddings, norms
and the head keep the compute dtype. Each projection is quantised and its dense weight released before the
next, so the model never holds both copies of more than one matrix.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from zoo.blocks import Attention, FeedForward, LatentAttention
from zoo.blocks.moe import Experts, StackedLinear
from zoo.lora.checks import check_rank, spec_from_arguments
from zoo.lora.errors import LoraError
from zoo.lora.experts import LoraStackedLinear
from zoo.lora.fingerprint import WeightSample
from zoo.lora.layer import LoraLinear
from zoo.lora.nf4 import BLOCK, Nf4Linear
from zoo.spec import LoraSpec
from zoo.spec.lora import TARGET_KINDS, LoraTarget

# target kind -> (projection attributes on a self-attention block, ... on a cross-attention block)
_ATTENTION_PROJECTIONS = {
    # self: the fused qkv_proj, or latent attention's (`zoo.blocks.mla`) q and kv projections
    "qkv": (("qkv_proj", "q_proj", "q_a_proj", "q_b_proj", "kv_a_proj", "kv_b_proj"), ("q_proj", "kv_proj")),
    "out": (("out_proj",), ("out_proj",)),
}
_FFN_PROJECTIONS = {"ffn_in": "up_proj", "ffn_out": "down_proj"}
_FLAGS_ATTR = "_lora_base_requires_grad"  # on the model: each base parameter's requires_grad before `apply`
Adapter = LoraLinear | LoraStackedLinear
Projection = nn.Linear | Nf4Linear | StackedLinear


def adapter_modules(model: nn.Module) -> dict[str, Adapter]:
    """Every adapter (`LoraLinear`, `LoraStackedLinear`) of ``model`` by module path
    (``decoder.layers.0.self_attn.qkv_proj``), in order."""
    return {name: module for name, module in model.named_modules() if isinstance(module, Adapter)}


def resolve_targets(model: nn.Module, spec: LoraSpec) -> dict[str, Projection]:
    """The linear projections ``spec.targets`` name in ``model``, by module path, in model order.

    Refuses (LoraError) a target that matches nothing, naming what the model has, and a rank ``spec.r``
    above ``min(in_features, out_features)`` of a targeted layer (`zoo.lora.checks.check_rank`).
    """
    blocks = _blocks(model)
    found: dict[str, Projection] = {}
    for target in spec.parsed_targets():
        matched = [
            (f"{path}.{attr}", linear)
            for path, stack, role, block in blocks
            if _matches(target, stack, role)
            for attr in _projections(target, role)
            if isinstance(linear := getattr(block, attr, None), Projection)
        ]
        if not matched:
            raise LoraError(
                f"lora target '{target}' matches nothing in this {type(model).__name__}: it has "
                f"{_describe(blocks)}",
                field="targets",
            )
        found |= dict(matched)
    check_rank(found, spec.r)  # before anything is allocated: a rank no layer can use is refused
    order = {name: i for i, (name, _) in enumerate(model.named_modules())}
    return dict(sorted(found.items(), key=lambda item: order[item[0]]))


def apply(
    model: nn.Module,
    spec: LoraSpec | Mapping[str, Any] | None = None,
    *,
    r: int = 8,
    alpha: float = 16.0,
    targets: Sequence[str] = ("qkv", "out"),
    dropout: float = 0.0,
    dora: bool = False,
    quantize_base: str | None = None,
) -> nn.Module:
    """Add adapters to ``model`` in place and return it: every targeted projection becomes a `LoraLinear`
    (B = 0, so the outputs are unchanged until B is trained), every other parameter is frozen.

    ``quantize_base="nf4"`` (QLoRA): every attention and FFN projection of the frozen base is stored NF4
    (torchao, the ``quant`` extra) and dequantised per matmul, one matrix at a time; the outputs then
    differ from the dense base's by NF4's rounding. A model from `zoo.lora.load_base` is NF4 already.

    ``spec`` (a `LoraSpec`) or the keyword arguments (validated into one) say which projections and how;
    ``model.lora_spec`` holds it afterwards. Refuses a model that already has adapters and a target that
    matches nothing in it (e.g. ``cross.qkv`` on a decoder-only model).

    >>> model = zoo.lora.apply(zoo.build("gpt2-tiny"), r=8, alpha=16, targets=["qkv", "ffn_in"])
    """
    if not isinstance(spec, LoraSpec):  # the keyword arguments, or a mapping of them, each checked by name
        arguments = dict(r=r, alpha=alpha, targets=targets, dropout=dropout, dora=dora)
        arguments |= {"quantize_base": quantize_base} if quantize_base is not None else {}
        if spec is not None and not isinstance(spec, Mapping):
            raise LoraError(
                f"zoo.lora.apply: spec must be a LoraSpec, a dict or None, got {type(spec).__name__}"
            )
        where, model_has = "zoo.lora.apply", _describe(_blocks(model))
        spec = spec_from_arguments({**arguments, **(spec or {})}, where=where, model_has=model_has)
    existing = adapter_modules(model)
    if existing:
        raise LoraError(
            f"the model already has LoRA adapters ({len(existing)}, e.g. {next(iter(existing))}); fold them in "
            "with zoo.lora.merge_and_unload first, or start from the base model"
        )
    targeted = resolve_targets(model, spec)  # everything checked before the first module is replaced
    experts = [path for path, linear in targeted.items() if isinstance(linear, StackedLinear)]
    if experts and (spec.dora or spec.dropout > 0):
        raise LoraError(
            f"lora {'dora' if spec.dora else 'dropout'} is not supported on Mixture-of-Experts experts "
            f"({experts[0]}): their adapters are a per-expert weight update (zoo.lora.experts); target only "
            "attention there, or use dora: false and dropout: 0",
            field="dora" if spec.dora else "dropout",
        )
    quantized = quantized_projections(model, spec)  # checked before anything is replaced
    flags = {name: p.requires_grad for name, p in model.named_parameters()}
    paths = list(targeted)
    del targeted  # no reference to a dense weight outlives its quantisation
    quantize_projections(model, quantized)
    for path in paths:
        linear = model.get_submodule(path)  # the projection, or the Nf4Linear that replaced it
        assert isinstance(linear, Projection)
        parent, attr = _parent(model, path)
        adapter: Adapter = (
            LoraStackedLinear(linear, r=spec.r, alpha=spec.alpha)
            if isinstance(linear, StackedLinear)
            else LoraLinear(linear, r=spec.r, alpha=spec.alpha, dropout=spec.dropout, dora=spec.dora)
        )
        setattr(parent, attr, adapter)
    adapter_params = {
        id(p) for module in adapter_modules(model).values() for p in _adapter_parameters(module)
    }
    for p in model.parameters():
        p.requires_grad_(id(p) in adapter_params)
    setattr(model, _FLAGS_ATTR, flags)
    setattr(model, "lora_spec", spec)  # noqa: B010 (a plain attribute on an nn.Module)
    return model


def merge(model: nn.Module, *, keep_original: bool = True) -> nn.Module:
    """Fold every adapter into its base weight in place; forward then runs the plain linears.

    Merged logits equal the adapters' to float rounding (tested to 1e-5 in float32). ``keep_original``: each
    wrapper keeps a copy of its base weight so `unmerge` restores it bit for bit ("exact" = equal bits);
    without, unmerge subtracts the update again, equal up to rounding (about one ulp of the larger term).
    """
    for module in _require_adapters(model, "merge").values():
        module.merge_(keep_original=keep_original)
    return model


def unmerge(model: nn.Module) -> nn.Module:
    """Take merged adapters out of the base weights again (see `merge` for how exactly)."""
    for module in _require_adapters(model, "unmerge").values():
        module.unmerge_()
    return model


def merge_and_unload(model: nn.Module) -> nn.Module:
    """Merge every adapter and put plain ``nn.Linear`` projections back: an ordinary zoo model again, with
    each parameter's ``requires_grad`` as it was before `apply`. `zoo.save` saves it, `zoo.to_hf` exports it."""
    modules = _require_adapters(model, "merge_and_unload")
    for path, module in modules.items():
        module.merge_(keep_original=False)
        parent, attr = _parent(model, path)
        setattr(parent, attr, module.to_linear())
    for path, frozen in nf4_modules(model).items():  # QLoRA's unadapted projections: dequantised
        parent, attr = _parent(model, path)
        setattr(parent, attr, frozen.to_linear())
    flags: dict[str, bool] = getattr(model, _FLAGS_ATTR, {})
    for name, p in model.named_parameters():
        p.requires_grad_(flags.get(name, True))
    for attr in (_FLAGS_ATTR, "lora_spec"):
        if attr in model.__dict__:
            delattr(model, attr)
    return model


@contextmanager
def disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Inside the block ``model`` computes what its base does: every adapter's update is bypassed (its
    projection runs the frozen base weight alone), with no copy of any weight. DPO's reference model under
    LoRA is the trained model run this way, as PEFT's ``disable_adapter()``. Refuses merged adapters (the
    base weights then hold the update: `unmerge` first).

    >>> with zoo.lora.disabled(model):
    ...     base_logits = model(input_ids).logits
    """
    modules = _require_adapters(model, "disabled")
    merged = [path for path, module in modules.items() if module.merged]
    if merged:
        raise LoraError(
            f"zoo.lora.disabled: {len(merged)} adapters are merged into the base weights (e.g. {merged[0]}); "
            "zoo.lora.unmerge them first"
        )
    previous = [module.disabled for module in modules.values()]
    for module in modules.values():
        module.disabled = True
    try:
        yield model
    finally:
        for module, was in zip(modules.values(), previous):
            module.disabled = was


def nf4_modules(model: nn.Module) -> dict[str, Nf4Linear]:
    """Every frozen NF4 projection the adapters do not wrap (`Nf4Linear`), by module path."""
    return {name: module for name, module in model.named_modules() if isinstance(module, Nf4Linear)}


def base_weights(modules: Mapping[str, Adapter | Projection]) -> dict[str, torch.Tensor | WeightSample]:
    """What `zoo.lora.base_fingerprint` reads for each base weight (module path -> its weight, or the sample
    an NF4 base kept of its dense weight)."""
    return {
        name: sample if (sample := getattr(module, "base_sample", None)) is not None else module.weight
        for name, module in modules.items()
    }


def trainable_parameters(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter elements, each distinct tensor counted once (tied ones too)."""
    params = list(model.parameters())  # distinct tensors
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter tensors only, by readable name: ``<module path>.lora_A`` / ``.lora_B`` / ``.lora_magnitude``."""
    return {
        f"{path}.{name}": tensor
        for path, module in adapter_modules(model).items()
        for name, tensor in _named_adapter_tensors(module)
    }


def adapter_shapes(targeted: dict[str, Projection], spec: LoraSpec) -> dict[str, tuple[int, ...]]:
    """The names and shapes `adapter_state` will have once ``spec`` is applied to ``targeted``."""
    shapes: dict[str, tuple[int, ...]] = {}
    for path, linear in targeted.items():
        if isinstance(linear, StackedLinear):  # one adapter per expert
            shapes[f"{path}.lora_A"] = (linear.num, spec.r, linear.in_features)
            shapes[f"{path}.lora_B"] = (linear.num, linear.out_features, spec.r)
            continue
        shapes[f"{path}.lora_A"] = (spec.r, linear.in_features)
        shapes[f"{path}.lora_B"] = (linear.out_features, spec.r)
        if spec.dora:
            shapes[f"{path}.lora_magnitude"] = (linear.out_features,)
    return shapes


# -- helpers -------------------------------------------------------------------------------------------------


def quantize_projections(model: nn.Module, projections: dict[str, Projection]) -> None:
    """Replace each ``nn.Linear`` of ``projections`` (emptied as it goes) by its `Nf4Linear`, one at a time:
    the dense weight is released (when nothing else holds it) before the next matrix is quantised."""
    for path in list(projections):
        linear = projections.pop(path)
        if isinstance(linear, nn.Linear):
            replacement = Nf4Linear.from_linear(linear, name=f"{path}.weight")
            del linear
            parent, attr = _parent(model, path)
            setattr(parent, attr, replacement)


def quantized_projections(model: nn.Module, spec: LoraSpec) -> dict[str, Projection]:
    """The projections ``spec.quantize_base`` stores NF4 (every attention and FFN one, in model order; none
    without it), each checked first; refuses an NF4 base without ``quantize_base``, Mixture-of-Experts
    experts and a matrix NF4 cannot block."""
    held = nf4_modules(model)
    if spec.quantize_base is None:
        if held:
            raise LoraError(
                f"the base is stored NF4 ({next(iter(held))}, zoo.lora.load_base): pass quantize_base='nf4'",
                field="quantize_base",
            )
        return {}
    found: dict[str, Projection] = {}
    for kind in TARGET_KINDS:
        try:
            found |= resolve_targets(model, LoraSpec(r=1, targets=[kind]))
        except LoraError:
            continue  # a kind this model does not have
    experts = [path for path, linear in found.items() if isinstance(linear, StackedLinear)]
    if experts:
        raise LoraError(
            f"lora quantize_base nf4 does not reach Mixture-of-Experts experts ({experts[0]}: a stacked weight "
            "per expert); fine-tune this model with a dense base (quantize_base: null)",
            field="quantize_base",
        )
    for path, linear in found.items():
        if linear.in_features * linear.out_features % BLOCK:
            raise LoraError(
                f"lora quantize_base nf4: {path}.weight ({linear.out_features} x {linear.in_features}) cannot "
                f"be stored NF4: its element count is not a multiple of {BLOCK}",
                field="quantize_base",
            )
    order = {name: i for i, (name, _) in enumerate(model.named_modules())}
    return dict(sorted(found.items(), key=lambda item: order[item[0]]))


def _named_adapter_tensors(module: Adapter) -> Iterable[tuple[str, nn.Parameter]]:
    yield "lora_A", module.lora_A
    yield "lora_B", module.lora_B
    if module.lora_magnitude is not None:
        yield "lora_magnitude", module.lora_magnitude


def _adapter_parameters(module: Adapter) -> list[nn.Parameter]:
    return [p for _, p in _named_adapter_tensors(module)]


def _require_adapters(model: nn.Module, what: str) -> dict[str, Adapter]:
    modules = adapter_modules(model)
    if not modules:
        raise LoraError(f"zoo.lora.{what}: the model has no LoRA adapters (add them with zoo.lora.apply)")
    return modules


def _blocks(model: nn.Module) -> list[tuple[str, str | None, str, nn.Module]]:
    """(path, stack, role, block) for every attention and FFN block: role "self", "cross" or "ffn"."""
    blocks: list[tuple[str, str | None, str, nn.Module]] = []
    for path, module in model.named_modules():
        stack = path.split(".")[0] or None
        if isinstance(module, Attention | LatentAttention):
            blocks.append((path, stack, "cross" if module.cross else "self", module))
        elif isinstance(module, FeedForward | Experts):
            blocks.append((path, stack, "ffn", module))
    return blocks


def _matches(target: LoraTarget, stack: str | None, role: str) -> bool:
    if target.stack is not None and target.stack != stack:
        return False
    if target.kind in _FFN_PROJECTIONS:
        return role == "ffn"
    return role != "ffn" and (target.attention is None or target.attention == role)


def _projections(target: LoraTarget, role: str) -> tuple[str, ...]:
    if target.kind in _FFN_PROJECTIONS:
        return (_FFN_PROJECTIONS[target.kind],)
    own, cross = _ATTENTION_PROJECTIONS[target.kind]
    return cross if role == "cross" else own


def _describe(blocks: list[tuple[str, str | None, str, nn.Module]]) -> str:
    """``encoder (self-attention, ffn); decoder (self-attention, cross-attention, ffn)``."""
    names = {"self": "self-attention", "cross": "cross-attention", "ffn": "ffn"}
    roles: dict[str, list[str]] = {}
    for _, stack, role, _ in blocks:
        kinds = roles.setdefault(str(stack), [])
        if names[role] not in kinds:
            kinds.append(names[role])
    return (
        "; ".join(f"{stack} ({', '.join(kinds)})" for stack, kinds in roles.items()) or "no attention or FFN"
    )


def _parent(model: nn.Module, path: str) -> tuple[nn.Module, str]:
    parent, _, attr = path.rpartition(".")
    return model.get_submodule(parent), attr
