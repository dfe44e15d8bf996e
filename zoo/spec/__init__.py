"""The pydantic model spec. Imports no torch, so specs, presets and the JSON Schema load instantly."""

import importlib
from typing import Any

from zoo.spec.blocks import (
    AlibiPositions,
    AttentionSpec,
    ClampedGLU,
    DynamicRopeScaling,
    EmbeddingSpec,
    FeedForwardSpec,
    FFNSpec,
    InputEmbeddingSpec,
    LatentAttentionSpec,
    LearnedPositions,
    LinearRopeScaling,
    Llama3RopeScaling,
    LongRopeScaling,
    MoESpec,
    NoPositions,
    NormSpec,
    PatchEmbeddingSpec,
    PositionSpec,
    RelativeBiasPositions,
    RelativeBiasSpec,
    RopeScaling,
    RotaryPositions,
    SinusoidalPositions,
    TemperatureTuning,
    YarnRopeScaling,
)
from zoo.spec.errors import SpecError, SpecValidationError
from zoo.spec.frontends import AudioEmbeddingSpec, InputSpec
from zoo.spec.lora import LoraSpec
from zoo.spec.model import (
    ClassifierSpec,
    DecoderSpec,
    DualEncoderSpec,
    EncoderDecoderSpec,
    EncoderHeadsSpec,
    EncoderSpec,
    HeadTransformSpec,
    ImageClassifierSpec,
    InitSpec,
    LMHeadSpec,
    MLMHeadSpec,
    ModelSpec,
    ReplacedTokenHeadSpec,
    SequenceClassifierSpec,
    TokenClassifierSpec,
    json_schema,
    parse_spec,
)
from zoo.spec.patterns import (
    AttentionPattern,
    BlockSparsePattern,
    CausalPattern,
    ChunkedPattern,
    FullPattern,
    PrefixLMPattern,
    SlidingWindowPattern,
)
from zoo.spec.presets import list_presets, load_spec, preset, presets_dir
from zoo.spec.stacks import ResolvedStack, StackSpec

__all__ = [
    "AlibiPositions",
    "AttentionPattern",
    "AttentionSpec",
    "AudioEmbeddingSpec",
    "BlockSparsePattern",
    "CausalPattern",
    "ChunkedPattern",
    "ClampedGLU",
    "ClassifierSpec",
    "DecoderSpec",
    "DualEncoderSpec",
    "DynamicRopeScaling",
    "EmbeddingSpec",
    "EncoderDecoderSpec",
    "EncoderHeadsSpec",
    "EncoderSpec",
    "FFNSpec",
    "FeedForwardSpec",
    "FullPattern",
    "HeadTransformSpec",
    "ImageClassifierSpec",
    "InitSpec",
    "InputEmbeddingSpec",
    "InputSpec",
    "LMHeadSpec",
    "LatentAttentionSpec",
    "LearnedPositions",
    "LinearRopeScaling",
    "Llama3RopeScaling",
    "LongRopeScaling",
    "LoraSpec",
    "MLMHeadSpec",
    "MoESpec",
    "ModelSpec",
    "NoPositions",
    "NormSpec",
    "PatchEmbeddingSpec",
    "PositionSpec",
    "PrefixLMPattern",
    "RelativeBiasPositions",
    "RelativeBiasSpec",
    "ReplacedTokenHeadSpec",
    "ResolvedStack",
    "RopeScaling",
    "RotaryPositions",
    "SequenceClassifierSpec",
    "SinusoidalPositions",
    "SlidingWindowPattern",
    "SpecError",
    "SpecValidationError",
    "StackSpec",
    "TemperatureTuning",
    "TokenClassifierSpec",
    "YarnRopeScaling",
    "buffer_count",
    "json_schema",
    "list_presets",
    "load_spec",
    "parameter_count",
    "parse_spec",
    "preset",
    "presets_dir",
]

# A spec's sizes are counted on its model, built on the meta device (`zoo.models.build`), which needs torch:
# these two names stay where they were published and resolve on first use, as the `zoo` facade's names do
# (the same functions as `zoo.parameter_count` and `zoo.buffer_count`). Importing zoo.spec loads no torch.
_SIZES = {"parameter_count": "zoo.models.build", "buffer_count": "zoo.models.build"}


def __getattr__(name: str) -> Any:
    if name not in _SIZES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_SIZES[name]), name)
    globals()[name] = value
    return value
