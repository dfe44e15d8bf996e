"""`export_gguf`: a zoo decoder as one GGUF file for llama.cpp (and Ollama, LM Studio, transformers'
``gguf_file=``), written with the ``gguf`` package.

    model ──to_hf_state──> HF config + tensors ──arches row──> metadata, refusals
                                             └──tensors.plan──> names, shapes, types ──stream──> FILE.gguf

The file is written to a temp path beside the target and renamed into place (`zoo.io.atomic`); tensors are
made and written one at a time, so the export holds one tensor's copy beside the model.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zoo._extras import install_hint
from zoo.export.errors import ExportError
from zoo.export.gguf.arches import ARCHES, BY_MODEL_TYPE, Arch, Config, refusals
from zoo.export.gguf.tensors import GGUF_TYPES, GGUFType, plan, tensor_data
from zoo.export.gguf.vocab import Entry, special_entries, vocab_metadata
from zoo.io.atomic import write_atomic
from zoo.io.outputs import GGUF_MODEL, check_output_file
from zoo.io.tokenizer import Tokenizer
from zoo.models.base import ZooModel

INSTALL_HINT = f"GGUF export needs the gguf package: {install_hint('gguf')}"
# general.file_type (llama.cpp's LlamaFileType) per --type
_FILE_TYPES = {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32}


class GGUFMissingError(ExportError, ImportError):
    """The gguf package is not installed (an ``ImportError`` too): the message says how to install it."""


@dataclass(frozen=True)
class GGUFExport:
    """What `export_gguf` wrote: the file, llama.cpp's architecture, the type, the tensor count, whether a
    vocabulary went in, and the file's size in bytes."""

    path: Path
    arch: str
    type: GGUFType
    tensors: int
    vocabulary: bool
    bytes: int


def require_gguf() -> None:
    """Raise `GGUFMissingError` unless the gguf package is importable."""
    if importlib.util.find_spec("gguf") is None:
        raise GGUFMissingError(INSTALL_HINT)


def llama_cpp_arch(config: Config) -> Arch:
    """The row for a Hugging Face config's model type, or `ExportError` naming the family and why."""
    model_type = str(config.get("model_type"))
    arch = BY_MODEL_TYPE.get(model_type)
    if arch is None:
        known = ", ".join(t for a in ARCHES for t in a.model_types)
        raise ExportError(
            f"GGUF export: the {model_type} family is not written as a llama.cpp architecture (these are: {known})"
        )
    if reasons := refusals(arch, config):
        raise ExportError(
            f"GGUF export: llama.cpp's {arch.name} cannot run this {model_type}: {'; '.join(reasons)}"
        )
    return arch


def export_gguf(
    model: ZooModel,
    path: str | Path,
    *,
    tokenizer: Tokenizer | None = None,
    type: GGUFType = "f32",
    model_type: str | None = None,
    overwrite: bool = False,
) -> GGUFExport:
    """Write ``model`` (a decoder of a family llama.cpp runs) to ``path`` as GGUF.

    ``type``: f32, f16, bf16 or q8_0 for the matrices (1-D tensors, the router and learned positions stay
    f32). ``tokenizer``: its vocabulary, merges, special ids and chat template go in the file (without one,
    ``tokenizer.ggml.model`` is ``none``: llama.cpp loads the weights but cannot tokenize text). A family
    llama.cpp cannot run, or an option of one it hard-codes otherwise, is refused by name. An existing file
    that is not GGUF is refused unless ``overwrite``; an earlier GGUF file is replaced.

    ``model_type``: the Hugging Face family whose layout is written (default: the first that expresses the
    model, as `zoo.to_hf` chooses; a plain Phi-3-shaped model is a llama one).
    """
    require_gguf()
    if type not in GGUF_TYPES:
        raise ExportError(f"GGUF type {type!r} is not one of {', '.join(GGUF_TYPES)}")
    path = Path(path).expanduser()
    if path.is_dir():
        raise ExportError(f"{path} is a folder; give the file to write, e.g. {path / 'model.gguf'}")
    family = model.spec.family
    if family != "decoder":
        raise ExportError(f"GGUF export: llama.cpp runs decoders; this model is an {family}")
    check_output_file(
        path, GGUF_MODEL, writer="zoo.export.export_gguf", overwrite=overwrite, option="--overwrite"
    )
    from zoo.io.hf import NoFamilyError, hf_config, to_hf_state

    try:  # the family and its refusals from the spec alone, before any weight is read
        arch = llama_cpp_arch(hf_config(model.spec, model_type=model_type))
    except NoFamilyError as error:
        raise ExportError(f"GGUF export: {error.summary}") from error
    config, tensors = to_hf_state(model, model_type=model_type)
    planned = plan(arch, config, tensors, type)
    entries = _metadata(arch, config, model, type)
    spec = model.spec
    specials = {"bos": spec.bos_token_id, "eos": spec.eos_token_id, "pad": spec.pad_token_id}
    if tokenizer is not None:  # a decoder's prompt is [bos, *ids], as zoo generate feeds it
        entries += vocab_metadata(
            tokenizer, vocab_size=int(spec.vocab_size), add_bos=True, special_ids=specials
        )
    else:
        entries += [Entry("tokenizer.ggml.model", "none", "str"), *special_entries(specials)]

    def write(temp: Path) -> None:
        import numpy as np
        from gguf import GGUFWriter

        writer = GGUFWriter(temp, arch.name)
        for entry in entries:
            _add(writer, entry)
        for item in planned:
            writer.add_tensor_info(
                item.name, item.shape, np.dtype(np.float32), item.nbytes, raw_dtype=item.qtype
            )
        writer.write_header_to_file(temp)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for item in planned:  # one tensor's copy at a time
            writer.write_tensor_data(tensor_data(arch, config, item))
        writer.close()

    write_atomic(path, write)
    return GGUFExport(path, arch.name, type, len(planned), tokenizer is not None, path.stat().st_size)


def _metadata(arch: Arch, config: Config, model: ZooModel, kind: GGUFType) -> list[Entry]:
    """general.* and the architecture's rows (a row whose value is None is left out)."""
    entries = [
        Entry("general.name", model.spec.name or str(config["model_type"]), "str"),
        Entry("general.file_type", _FILE_TYPES[kind], "u32"),
        Entry("general.quantization_version", 2, "u32"),  # ggml's GGML_QNT_VERSION
    ]
    for row in arch.metadata:
        value = row.read(config)
        if value is not None:
            entries.append(Entry(row.key.format(arch=arch.name), value, row.kind))
    return entries


def _add(writer: Any, entry: Entry) -> None:
    """One metadata entry, with its GGUF type (an array's element type for a list)."""
    from gguf import GGUFValueType as V

    kinds = {"u32": V.UINT32, "i32": V.INT32, "f32": V.FLOAT32, "bool": V.BOOL, "str": V.STRING}
    cast = {"u32": int, "i32": int, "f32": float, "bool": bool, "str": str}[entry.kind]
    if isinstance(entry.value, list):
        writer.add_key_value(entry.key, [cast(v) for v in entry.value], V.ARRAY, sub_type=kinds[entry.kind])
    else:
        writer.add_key_value(entry.key, cast(entry.value), kinds[entry.kind])
