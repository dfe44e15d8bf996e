"""What two specs differ in, field by field, as dotted paths: the fields as written, and each stack resolved.

A stack's own fields (``encoder.num_layers``, ``decoder.attention.num_heads``, ...) are compared as the
builder sees them, with the model-level defaults filled in: two specs that say the same thing in
different places build the same model and compare equal. Imports no torch.
"""

from __future__ import annotations

from typing import Any

from zoo.spec import ModelSpec

METADATA_FIELDS = ("name", "source")
"""Fields that label a model and never change its math (a Hugging Face round trip names the folder): a
difference in them is a note, not a difference (`is_metadata`)."""

MISSING: Any = type("Missing", (), {"__repr__": lambda self: "—"})()
"""Stands for a field one spec does not have (another family, another position kind)."""


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict) and value:
        for key, item in value.items():
            _flatten(item, f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out[prefix] = value


def spec_fields(spec: ModelSpec) -> dict[str, Any]:
    """Every field of ``spec`` by dotted path, each stack's fields resolved (JSON values)."""
    fields: dict[str, Any] = {}
    _flatten(spec.model_dump(mode="json"), "", fields)
    for name, stack in spec.stacks().items():
        for key in [k for k in fields if k.startswith(f"{name}.")]:
            del fields[key]  # the overrides as written; replaced by the resolved values below
        resolved = stack.model_dump(mode="json", exclude={"name", "sources"})
        for field in ("attention", "cross_attention"):  # derived defaults, as the blocks use them
            if (block := getattr(stack, field)) is not None:
                resolved[field] |= {
                    "num_kv_heads": block.kv_heads,
                    "head_dim": block.resolved_head_dim(spec.d_model),
                }
        resolved["norm"]["final"] = stack.norm.has_final
        _flatten(resolved, name, fields)
    return fields


def diff_specs(a: ModelSpec, b: ModelSpec) -> list[tuple[str, Any, Any]]:
    """``(dotted path, value in a, value in b)`` for every field that differs, in spec order.

    A field only one spec has shows `MISSING` on the other side.
    """
    fields_a, fields_b = spec_fields(a), spec_fields(b)
    paths, order_b = list(fields_a), list(fields_b)
    for i, path in enumerate(order_b):  # b's extra fields go right after their predecessor in b
        if path not in fields_a:
            paths.insert(paths.index(order_b[i - 1]) + 1 if i else 0, path)
    rows = []
    for path in paths:
        value_a, value_b = fields_a.get(path, MISSING), fields_b.get(path, MISSING)
        if value_a is MISSING or value_b is MISSING or value_a != value_b:
            rows.append((path, value_a, value_b))
    return rows


def is_metadata(path: str) -> bool:
    """Whether the field at dotted ``path`` only labels the model (`METADATA_FIELDS`)."""
    return path in METADATA_FIELDS
