"""The export guard: a Hugging Face config must describe the model it is written for, or `to_hf` refuses.

Every export is read back: the config a family writes goes through the same family's ``config_to_spec``
(with the tensor names the export writes), and the spec that comes back is compared with the one that went
in, whole and resolved (`resolved`): every stack's norm, attention, cross-attention, feed-forward, positions
and per-layer attention pattern as the stack runs them, then every top-level field (embedding, heads,
lm_head, vocabularies, token ids). What the config cannot say comes back as the family's fixed value, and
the export is refused naming it: ``gpt2 cannot express norm.kind='rmsnorm' (read back as 'layernorm')``.
Nothing here lists the spec's options, so an option added to the spec is guarded the day it exists. A
family writes what it holds and leaves the rest to this read-back; its own `common.require` rows (and a few
explicit refusals) are for what it cannot write at all (another model family, Marian's one sinusoid layout
for both stacks) or what reads back the same but computes otherwise (MPNet's hard-coded padding id).

Resolved: one function, one value, however the spec spells it (``num_kv_heads: null`` is ``num_heads``,
``out_bias: null`` is ``bias``, ``final: null`` follows the placement, the logit scale is a number, a
pattern the same in every layer is that pattern), and an option that cannot act is left out (an RMSNorm's
``bias``, ``qk_norm_eps`` or ``qk_norm_scope`` without ``qk_norm``, the logit scale of unscaled attention, a shared-expert gate
without a shared expert, the dense width where every layer is sparse).

`IGNORED` names the fields left out because they do not change the function a model computes. A family
that re-expresses an option through its weights says what its files describe with
`FamilyMapping.exported_as` (Marian writes the paper's interleaved sinusoids in its half layout, reordering
the residual stream).
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

from zoo.io.hf.common import FamilyMapping, NamesOnly, check_embedding_kind, check_ffn_kinds, refusal
from zoo.models import build_model
from zoo.spec import AttentionSpec, ModelSpec, MoESpec, ResolvedStack

# Dotted fields (stack-level ones under the stack's name: ``decoder.attention.dropout``) the comparison
# skips, each with why it does not change the function.
IGNORED: dict[str, str] = {
    "name": "a label",
    "source": "a note on where the numbers come from",
    "init": "how weights start: the export carries the weights",
    "dropout": "training only: embeddings and residual branches",
    "*.dropout": "training only: attention weights, the FFN's activations, a classifier's input",
    "*.ffn.jitter": "training only: a Mixture-of-Experts router's input noise",
    "*.pattern.seed": "BigBird's random blocks: transformers draws its own and has no field for a seed",
}
# a union's tag: where it differs, the other fields mean other things
_TAGS = ("family", "kind", "type", "task")
_WHOLE = "*.pattern"  # a layer's attention pattern (or the list of them) is one value
_STACK_BLOCKS = ("norm", "attention", "cross_attention", "ffn", "position")
_RESOLVED_ELSEWHERE = {"num_layers", *_STACK_BLOCKS, "encoder", "decoder"}  # what the stacks resolve


def faithful_config(mapping: FamilyMapping, spec: ModelSpec) -> dict[str, Any]:
    """``mapping``'s config.json for ``spec``; HFError naming every field reading it back would lose."""
    check_embedding_kind(mapping, spec)
    check_ffn_kinds(mapping, spec)
    config = mapping.spec_to_config(spec)
    meta = build_model(spec, device="meta", init=False).state_dict()
    names = set(mapping.zoo_to_hf(NamesOnly(meta), spec))
    written = mapping.exported_as(spec) if mapping.exported_as is not None else spec
    lost = lost_fields(written, mapping.config_to_spec(config, names))
    if lost:
        failed = {field: (value, f" (read back as {back!r})") for field, value, back in lost}
        raise refusal("/".join(mapping.model_types), failed, complete=True)
    return config


def lost_fields(spec: ModelSpec, reread: ModelSpec) -> list[tuple[str, Any, Any]]:
    """``(field, value, read back as)`` for every field of ``spec`` that ``reread`` does not keep, fields
    named as the spec writes them (``attention.bias`` for a model-level block), each once: another kind of
    block first (``norm.kind``, ``position.kind``), the biggest difference, then the others in spec order."""
    before, names = resolved(spec)
    after, _ = resolved(reread)
    lost: dict[str, tuple[str, Any, Any]] = {}
    for path, value, back in _differences(before, after, ""):
        field = _display(path, names)
        lost.setdefault(field, (field, value, back))
    return sorted(lost.values(), key=lambda item: item[0].rsplit(".", 1)[-1] not in _TAGS)


def resolved(spec: ModelSpec) -> tuple[dict[str, Any], dict[str, str]]:
    """The spec as a tree of plain values, stacks first (resolved), then the top-level fields, without
    `IGNORED`; and, for messages, the field each stack-level path came from (``decoder.attention`` ->
    ``attention`` when the model-level block applies)."""
    tree: dict[str, Any] = {}
    names: dict[str, str] = {}
    for name, stack in spec.stacks().items():
        tree[name] = _stack(stack, spec.d_model)
        names |= {f"{name}.{block}": stack.sources[block] for block in (*_STACK_BLOCKS, "num_layers")}
        names[f"{name}.pattern"] = (
            f"{name}.layer_patterns" if stack.layer_patterns is not None else stack.pattern_path()
        )
    tree |= spec.model_dump(exclude=_RESOLVED_ELSEWHERE)
    if "decoder_start_token_id" in tree:  # where generation starts: unset is bos, else pad
        tree["decoder_start_token_id"] = spec.start_token_id  # type: ignore[union-attr]
    return _prune(tree, ""), names


def _stack(stack: ResolvedStack, d_model: int) -> dict[str, Any]:
    patterns = [stack.layer_pattern(i).model_dump() for i in range(stack.num_layers)]
    return {
        "norm": _norm(stack),
        "attention": _attention(stack.attention, d_model),
        "cross_attention": _attention(stack.cross_attention, d_model),
        "ffn": _ffn(stack),
        "position": stack.position.model_dump(),
        # one pattern for every layer reads as that pattern, however the spec says it
        "pattern": patterns[0] if all(p == patterns[0] for p in patterns) else patterns,
        "num_layers": stack.num_layers,
        "share_layers": stack.share_layers,
        "causal": stack.causal,
        "embedding": stack.embedding.model_dump() if stack.embedding is not None else None,
    }


def _norm(stack: ResolvedStack) -> dict[str, Any]:
    norm = stack.norm
    found = norm.model_dump() | {"final": norm.has_final}
    if norm.kind == "rmsnorm":
        del found["bias"]  # RMSNorm has none
    return found


def _attention(attention: AttentionSpec | None, d_model: int) -> dict[str, Any] | None:
    if attention is None:
        return None
    found = attention.model_dump() | {
        "num_kv_heads": attention.kv_heads,
        "head_dim": attention.resolved_head_dim(d_model),
        "out_bias": attention.has_out_bias,
        "key_bias": attention.has_key_bias,
        "scale": attention.resolved_scale(d_model),
    }
    if not attention.qk_norm:
        del found["qk_norm_eps"], found["qk_norm_scope"]
    if not attention.scaled:
        del found["scale"]  # 1: ``scaled`` says it
    return found


def _ffn(stack: ResolvedStack) -> dict[str, Any]:
    ffn = stack.ffn
    if not isinstance(ffn, MoESpec):
        return {"kind": ffn.kind, **ffn.model_dump()}  # a dense FFN never dumps its kind
    dense = any(not ffn.is_sparse(i) for i in range(stack.num_layers))
    found = ffn.model_dump() | {
        "dense_layers": sorted(set(ffn.dense_layers)),
        "dense_d_ff": ffn.dense_d_ff if dense else None,  # the dense layers' width, where there are some
    }
    if ffn.shared_d_ff is None:
        del found["shared_gate"]
    return found


def _prune(value: Any, path: str) -> Any:
    """``value`` without the `IGNORED` fields (a list's items share its path)."""
    if isinstance(value, dict):
        return {
            key: _prune(item, _join(path, key))
            for key, item in value.items()
            if not any(fnmatchcase(_join(path, key), pattern) for pattern in IGNORED)
        }
    if isinstance(value, list):
        return [_prune(item, path) for item in value]
    return value


def _differences(before: Any, after: Any, path: str) -> list[tuple[str, Any, Any]]:
    """Every ``(path, value, read back as)`` where the two trees differ: within a mapping field by field,
    except that another union member, or none, is one difference named by the tag (``position.kind``,
    ``position.scaling.type``), and a layer's pattern of another kind is named whole (a window without its
    kind says nothing)."""
    if before == after:
        return []
    tag = next((t for t in _TAGS if isinstance(before, dict) and t in before), None)
    other = not isinstance(after, dict) or (tag is not None and before[tag] != after.get(tag))
    if fnmatchcase(path, _WHOLE) and (not isinstance(before, dict) or other):
        return [(path, before, after)]  # a pattern of another kind (or per layer): with its parameters
    if tag is not None and other:  # another kind, or none (a rope scaling read back as none): its tag
        return [(_join(path, tag), before[tag], after.get(tag) if isinstance(after, dict) else after)]
    if not (isinstance(before, dict) and isinstance(after, dict)):
        return [(path, before, after)]
    found: list[tuple[str, Any, Any]] = []
    for key in [k for k in before if k in after]:  # one side only: an option off there (qk_norm_eps)
        found += _differences(before[key], after[key], _join(path, key))
    return found


def _display(path: str, names: dict[str, str]) -> str:
    """``path`` as the spec writes it: a stack block's path replaced by the field it came from."""
    parts = path.split(".")
    for cut in (2, 1):
        prefix = ".".join(parts[:cut])
        if prefix in names:
            return ".".join([names[prefix], *parts[cut:]])
    return path


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
