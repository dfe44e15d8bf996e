"""GGUF export: a zoo decoder as one file llama.cpp runs (and Ollama, LM Studio, transformers' ``gguf_file=``).

    zoo.export.export_gguf(model, "model.gguf", tokenizer=tok, type="q8_0")   # the gguf extra

The modules, along the flow:

    arches.py   the Hugging Face families llama.cpp runs, as rows: GGUF architecture, metadata, refusals
    rope.py     rope scaling as llama.cpp reads it: linear as metadata, Llama 3's as rope_freqs.weight
    tensors.py  HF tensors -> llama.cpp's names, layouts (rotary permutation, 1 + weight norms) and types
    vocab.py    a tokenizer.json -> tokenizer.ggml.* metadata and the chat template
    write.py    `export_gguf`: plan, then stream one tensor at a time into an atomic write

Which families and options are written, the handoff to llama.cpp and Ollama: docs/export.md.
"""

from __future__ import annotations

from zoo.export.gguf.tensors import GGUF_TYPES, GGUFType
from zoo.export.gguf.write import GGUFExport, GGUFMissingError, export_gguf, llama_cpp_arch, require_gguf

__all__ = [
    "GGUF_TYPES",
    "GGUFExport",
    "GGUFMissingError",
    "GGUFType",
    "export_gguf",
    "llama_cpp_arch",
    "require_gguf",
]
