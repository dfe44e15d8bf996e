"""The export guard: a Hugging Face config must describe the model it is written for, or `to_hf` refuses.

Each family's ``spec_to_config`` lists the spec fields its format cannot express (`common.require`). Such
lists fall behind whenever the spec grows a field: a new option (a learned head bias, a sliding window) that
a family never heard of would be dropped silently, and the export would load in transformers and compute
something else. So every export is also read back: the config goes through the family's own
``config_to_spec``, and the fields below — every option that changes the function a model computes beyond
its tensor shapes — must come back with the values they went in with.

Layout choices a family makes on purpose are not features: Marian's sinusoid layout (the canonical export
reorders the residual stream, `zoo.io.hf.bart`), names, dropout and initialisation.
"""

from __future__ import annotations

from typing import Any

from zoo.spec import ModelSpec, ResolvedStack


def features(spec: ModelSpec) -> dict[str, Any]:
    """The options of ``spec`` an export must keep, by dotted field (stack-level values resolved)."""
    found: dict[str, Any] = {}
    for name, stack in spec.stacks().items():
        found |= _stack_features(name, stack, d_model=spec.d_model)
    found["embedding.projection_dim"] = spec.embedding.projection_dim
    head = getattr(spec, "lm_head", None)
    found["lm_head.bias"] = head.bias if head is not None else None
    found["lm_head.softcap"] = head.softcap if head is not None else None
    heads = getattr(spec, "heads", None)
    classifier = getattr(heads, "classifier", None)
    found["heads.classifier"] = classifier.model_dump(exclude={"dropout"}) if classifier else None
    replaced = getattr(heads, "replaced_token", None)
    found["heads.replaced_token"] = replaced.model_dump() if replaced else None
    mlm = getattr(heads, "mlm", None)
    found["heads.mlm.dense_bias"] = mlm.dense_bias if mlm is not None else None
    found["heads.mlm.bias"] = mlm.bias if mlm is not None else None
    return found


def _stack_features(name: str, stack: ResolvedStack, *, d_model: int) -> dict[str, Any]:
    attention, position, norm = stack.attention, stack.position, stack.norm
    # A block-sparse seed has no field anywhere in transformers (BigBird draws its random blocks itself).
    patterns = [stack.layer_pattern(i).model_dump(exclude={"seed"}) for i in range(stack.num_layers)]
    return {
        f"{name}.pattern": patterns[0] if len({repr(p) for p in patterns}) == 1 else patterns,
        f"{name}.attention.out_bias": attention.has_out_bias,
        f"{name}.attention.qk_norm": attention.qk_norm,
        f"{name}.attention.head_dim": attention.resolved_head_dim(d_model),
        f"{name}.attention.scale": attention.resolved_scale(d_model),
        f"{name}.attention.softcap": attention.softcap,
        f"{name}.norm.placement": norm.placement,
        f"{name}.norm.unit_offset": norm.unit_offset,
        f"{name}.norm.first_attention_norm": norm.first_attention_norm,
        f"{name}.position.local_theta": getattr(position, "local_theta", None),
        f"{name}.position.kind": position.kind,
        f"{name}.position.scaling": _dump(getattr(position, "scaling", None)),
        f"{name}.position.offset": getattr(position, "offset", None),
        f"{name}.position.frequencies": getattr(position, "frequencies", None),
        f"{name}.position.relative_bias": _dump(getattr(position, "relative_bias", None)),
        f"{name}.position.per_layer": getattr(position, "per_layer", None),
        f"{name}.position.fraction": getattr(position, "fraction", None),
        f"{name}.norm.residual": stack.norm.residual,
        f"{name}.ffn": _ffn_features(stack),
    }


def _ffn_features(stack: ResolvedStack) -> Any:
    """A Mixture-of-Experts FFN's routing and layout, layer by layer (the dense width only where used); a
    dense FFN's kind. Router jitter is training noise, like dropout: not a feature."""
    ffn = stack.ffn
    if ffn.kind != "moe":
        return ffn.kind
    sparse = [ffn.is_sparse(i) for i in range(stack.num_layers)]
    return ffn.model_dump(exclude={"jitter", "sparse_step", "dense_layers", "dense_d_ff"}) | {
        "sparse": sparse,
        "dense_d_ff": ffn.dense_d_ff if not all(sparse) else None,
    }


def _dump(value: Any) -> Any:
    return value.model_dump() if hasattr(value, "model_dump") else value


def lost_features(spec: ModelSpec, reread: ModelSpec) -> list[str]:
    """``field=value (read back as other)`` for every feature of ``spec`` that ``reread`` does not keep."""
    before, after = features(spec), features(reread)
    return [
        f"{field}={value!r} (read back as {after.get(field)!r})"
        for field, value in before.items()
        if after.get(field) != value
    ]
