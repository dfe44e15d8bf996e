"""zoo: a config-driven Transformer model zoo for PyTorch.

One pydantic spec, one set of shared blocks, three families (encoder, decoder, encoder-decoder).

    import zoo
    model = zoo.build("transformer-base")

Spec names load eagerly and import no torch (so `zoo schema` and spec linting are instant); everything
that needs torch is imported on first use.
"""

from __future__ import annotations

from zoo._lazy import lazy_exports
from zoo.spec import ModelSpec, SpecError, json_schema, list_presets, load_spec, parse_spec, preset

__version__ = "0.1.0"

# public name -> "module:attribute", imported on first access (PEP 562)
_LAZY = {
    "build": "zoo.models.build:build_model",
    "ZooModel": "zoo.models.base:ZooModel",
    "EncoderModel": "zoo.models.encoder:EncoderModel",
    "DecoderModel": "zoo.models.decoder:DecoderModel",
    "EncoderDecoderModel": "zoo.models.encoder_decoder:EncoderDecoderModel",
    "ModelOutput": "zoo.models.outputs:ModelOutput",
    "save": "zoo.io.checkpoint:save",
    "load": "zoo.io.checkpoint:load",
    "load_tokenizer": "zoo.io.checkpoint:load_tokenizer",
    "load_pretrained": "zoo.io.pretrained:load_pretrained",
    "read_spec": "zoo.io.checkpoint:read_spec",
    "CheckpointError": "zoo.io.checkpoint:CheckpointError",
    "from_hf": "zoo.io.hf:from_hf",
    "to_hf": "zoo.io.hf:to_hf",
    "read_hf_spec": "zoo.io.hf:read_hf_spec",
    "train": "zoo.training.loop:train",
    "Tokenizer": "zoo.io.tokenizer:Tokenizer",
    "ChatTemplateError": "zoo.io.tokenizer:ChatTemplateError",
    "TextStream": "zoo.generation.text:TextStream",
    "ChatSession": "zoo.generation.chat:ChatSession",
    "summary": "zoo.analysis:summary",
    "parameter_count": "zoo.models.build:parameter_count",
    "buffer_count": "zoo.models.build:buffer_count",
    "embed": "zoo.embeddings:embed",
    "transcribe": "zoo.audio:transcribe",
}

__all__ = [
    "ModelSpec",
    "SpecError",
    "__version__",
    "json_schema",
    "list_presets",
    "load_spec",
    "parse_spec",
    "preset",
    *_LAZY,
]


# subpackages reachable as attributes after a bare `import zoo` (zoo.generation.stream_text, zoo.training...)
_SUBPACKAGES = (
    "analysis",
    "audio",
    "blocks",
    "embeddings",
    "evaluation",
    "export",
    "generation",
    "io",
    "lora",
    "models",
    "quant",
    "training",
    "viz",
)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, submodules=_SUBPACKAGES, eager=__all__)
