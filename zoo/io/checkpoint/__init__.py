"""zoo's own checkpoint format: safetensors weights with the spec in their metadata (format: docs/weights.md).

    zoo.save(model, "runs/mt")                      # runs/mt/model.safetensors + runs/mt/spec.json
    model = zoo.load("runs/mt")                     # or "runs/mt/model.safetensors": the spec is inside
    model = zoo.load("runs/mt", device="cuda", dtype=torch.bfloat16)
    model, report = zoo.load("runs/mt", strict=False, return_report=True)

The package, along the data flow:

    files.py       one safetensors file: header parsing and checks, tied tensors, shard plans, the errors
    discovery.py   finding one checkpoint on disk, headers only: which files, which spec, which tensors
                   (`open_checkpoint`)
    limits.py      what a spec may ask for given the tensors a file holds (layers, widths, fixed tables)
    saving.py      `save`: every file written atomically; the old checkpoint switches to the new in one step
    loading.py     `load`, `read_spec`, `load_tokenizer`: checked before any tensor is read
"""

from __future__ import annotations

from zoo.io.checkpoint.discovery import Checkpoint, LoadReport, open_checkpoint
from zoo.io.checkpoint.files import CheckpointError, CheckpointNotFoundError, parse_size
from zoo.io.checkpoint.loading import load, load_tokenizer, read_spec
from zoo.io.checkpoint.saving import save

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CheckpointNotFoundError",
    "LoadReport",
    "load",
    "load_tokenizer",
    "open_checkpoint",
    "parse_size",
    "read_spec",
    "save",
]
