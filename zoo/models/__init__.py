"""The three families, their heads and outputs, the generic builder, and a spec's sizes counted on its model."""

from zoo.models.base import ZooModel
from zoo.models.build import buffer_count, build_model, parameter_count, resolve_spec
from zoo.models.decoder import DecoderModel
from zoo.models.encoder import EncoderModel
from zoo.models.encoder_decoder import EncoderDecoderModel
from zoo.models.outputs import ModelOutput

__all__ = [
    "DecoderModel",
    "EncoderDecoderModel",
    "EncoderModel",
    "ModelOutput",
    "ZooModel",
    "buffer_count",
    "build_model",
    "parameter_count",
    "resolve_spec",
]
