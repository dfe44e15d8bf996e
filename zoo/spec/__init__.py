"""The pydantic model spec. Imports no torch, so specs, presets and the JSON Schema load instantly."""

from zoo.spec.blocks import (
    AlibiPositions,
    AttentionSpec,
    EmbeddingSpec,
    FFNSpec,
    LearnedPositions,
    NoPositions,
    NormSpec,
    PositionSpec,
    RelativeBiasPositions,
    RotaryPositions,
    SinusoidalPositions,
)
from zoo.spec.errors import SpecError, SpecValidationError
from zoo.spec.model import (
    DecoderSpec,
    EncoderDecoderSpec,
    EncoderHeadsSpec,
    EncoderSpec,
    InitSpec,
    LMHeadSpec,
    MLMHeadSpec,
    ModelSpec,
    json_schema,
    parse_spec,
)
from zoo.spec.presets import list_presets, load_spec, preset, presets_dir
from zoo.spec.sizes import buffer_count, parameter_count
from zoo.spec.stacks import ResolvedStack, StackSpec

__all__ = [
    "AlibiPositions",
    "AttentionSpec",
    "DecoderSpec",
    "EmbeddingSpec",
    "EncoderDecoderSpec",
    "EncoderHeadsSpec",
    "EncoderSpec",
    "FFNSpec",
    "InitSpec",
    "LMHeadSpec",
    "LearnedPositions",
    "MLMHeadSpec",
    "ModelSpec",
    "NoPositions",
    "NormSpec",
    "PositionSpec",
    "RelativeBiasPositions",
    "ResolvedStack",
    "RotaryPositions",
    "SinusoidalPositions",
    "SpecError",
    "SpecValidationError",
    "StackSpec",
    "buffer_count",
    "json_schema",
    "list_presets",
    "load_spec",
    "parameter_count",
    "parse_spec",
    "preset",
    "presets_dir",
]
