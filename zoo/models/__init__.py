"""The three families, their heads and outputs, and the generic builder."""

from zoo.models.base import ZooModel
from zoo.models.build import build_model, resolve_spec
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
    "build_model",
    "resolve_spec",
]
