"""`LoraSpec`: which projections get low-rank adapters, their rank, scale, dropout, and DoRA.

LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", arXiv:2106.09685) adds
``(alpha / r) * B @ A`` to a frozen weight; DoRA (Liu et al. 2024, arXiv:2402.09353) also learns a magnitude
per output row. `zoo.lora` builds the adapters from this spec; it is also the ``lora:`` section of a
training config. Imports no torch.

A target names projections, optionally narrowed to one stack and to self- or cross-attention:

    [encoder.|decoder.][self.|cross.]KIND        KIND: qkv | out | ffn_in | ffn_out

    qkv             every attention's input projection (self: the fused qkv_proj; cross: q_proj and kv_proj)
    decoder.out     the output projections of the decoder's self- and cross-attention
    cross.qkv       only the cross-attention's q_proj and kv_proj (encoder-decoder models)
    encoder.ffn_in  the encoder's FFN up_proj (gate and up rows, when gated)

``self.`` and ``cross.`` go only before ``qkv`` and ``out``; without a stack prefix a target means every stack.

``quantize_base: nf4`` is QLoRA (Dettmers et al. 2023, arXiv:2305.14314): the frozen base projections are
stored 4-bit NF4 (`zoo.lora.nf4`). It says how the base is held, not what the adapters are, so it is left
out of the serialised spec while unset (files written before it existed read the same).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, PositiveInt, SerializerFunctionWrapHandler, field_validator, model_serializer

from zoo.spec.blocks import Spec

TargetKind = Literal["qkv", "out", "ffn_in", "ffn_out"]
TARGET_KINDS: tuple[str, ...] = ("qkv", "out", "ffn_in", "ffn_out")
STACK_NAMES: tuple[str, ...] = ("encoder", "decoder")
ATTENTION_KINDS: tuple[str, ...] = ("self", "cross")
TARGET_GRAMMAR = "[encoder.|decoder.][self.|cross.]KIND with KIND in qkv|out|ffn_in|ffn_out"
QUANTIZE_KINDS: tuple[str, ...] = ("nf4",)


@dataclass(frozen=True)
class LoraTarget:
    """One parsed target: ``stack`` and ``attention`` are None where the target names every one."""

    stack: str | None
    attention: str | None  # "self" | "cross" | None (only for qkv and out)
    kind: str

    def __str__(self) -> str:
        return ".".join(part for part in (self.stack, self.attention, self.kind) if part)


def parse_target(text: str) -> LoraTarget:
    """``"decoder.cross.qkv"`` -> LoraTarget("decoder", "cross", "qkv"); ValueError naming the grammar."""
    parts = text.split(".") if isinstance(text, str) else []
    stack = parts.pop(0) if len(parts) > 1 and parts[0] in STACK_NAMES else None
    attention = parts.pop(0) if len(parts) > 1 and parts[0] in ATTENTION_KINDS else None
    if len(parts) != 1 or parts[0] not in TARGET_KINDS:
        raise ValueError(f"expected {TARGET_GRAMMAR}")
    if attention is not None and parts[0] not in ("qkv", "out"):
        raise ValueError(f"'{attention}.' goes only before qkv or out (attention projections)")
    return LoraTarget(stack, attention, parts[0])


class LoraSpec(Spec):
    """Low-rank adapters on chosen projections: ``W x + (alpha / r) * B A dropout(x)``, W frozen."""

    r: PositiveInt = Field(8, description="Rank of each adapter: A is (r, in), B is (out, r).")
    alpha: Annotated[float, Field(gt=0.0, allow_inf_nan=False)] = Field(
        16.0, description="Scale numerator: the update is (alpha / r) * B @ A; finite."
    )
    dropout: Annotated[float, Field(ge=0.0, lt=1.0, allow_inf_nan=False)] = Field(
        0.0, description="Dropout on the adapter's input only (training); the frozen path never drops."
    )
    targets: list[str] = Field(
        default_factory=lambda: ["qkv", "out"],
        min_length=1,
        description=f"Projections to adapt: {TARGET_GRAMMAR}; no stack prefix = every stack.",
    )
    dora: bool = Field(
        False, description="DoRA: also learn a magnitude per output row (Liu et al. 2024), PEFT's formula."
    )
    quantize_base: Literal["nf4"] | None = Field(
        None,
        description="QLoRA: store every frozen attention and FFN projection of the base as NF4 (4-bit, "
        "torchao), dequantised per matmul; null: the base keeps its dtype.",
    )

    @model_serializer(mode="wrap")
    def _drop_unset_quantize_base(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("quantize_base", "") is None:  # unset: the spec serialises as before the field existed
            del data["quantize_base"]
        return data

    @field_validator("targets")
    @classmethod
    def _check_targets(cls, targets: list[str]) -> list[str]:
        for i, target in enumerate(targets):
            try:
                parse_target(target)
            except ValueError as error:
                raise ValueError(f"targets[{i}] {target!r} is not a target: {error}") from None
        repeated = sorted({t for t in targets if targets.count(t) > 1})
        if repeated:
            raise ValueError(f"targets lists {', '.join(map(repr, repeated))} more than once")
        return targets

    @property
    def scaling(self) -> float:
        """alpha / r, the factor on B @ A."""
        return self.alpha / self.r

    def parsed_targets(self) -> list[LoraTarget]:
        return [parse_target(target) for target in self.targets]
