"""Hugging Face interop: `from_hf` reads a transformers checkpoint folder, `to_hf` writes one.

    config.json ──config_to_spec──> ModelSpec ──build on meta──> model ──strict load──> model
    model*.safetensors ──hf_to_zoo──> zoo tensors ─────────────────────────┘

Each family module (gpt2, llama, bert [+ roberta], albert, t5, bart [+ marian]) holds one declarative
`FamilyMapping`; this module only reads and writes files and picks the mapping by ``model_type``. Weights
are read from safetensors only: zoo never unpickles a ``pytorch_model.bin``.
"""

from __future__ import annotations

import importlib
import json
import os
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from zoo.io.atomic import write_atomic, write_text_atomic
from zoo.io.checkpoint.loading import materialize_buffers
from zoo.io.hf.common import FamilyMapping, HFError, StateDict, architecture
from zoo.io.jsonfile import read_json_object
from zoo.io.names import CONFIG_NAME, INDEX_NAME, WEIGHTS_NAME
from zoo.io.tokenizer import Tokenizer
from zoo.models import ZooModel, build_model
from zoo.spec import ModelSpec
from zoo.spec.presets import format_validation_error

__all__ = ["FamilyMapping", "HFError", "family_mappings", "from_hf", "to_hf"]

FAMILY_MODULES = ("gpt2", "llama", "bert", "albert", "t5", "bart")
_PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json")


@cache
def family_mappings() -> tuple[FamilyMapping, ...]:
    """Every family mapping, in `FAMILY_MODULES` order (the order `to_hf` tries them in)."""
    found: list[FamilyMapping] = []
    for name in FAMILY_MODULES:
        module = importlib.import_module(f"zoo.io.hf.{name}")
        found += getattr(module, "MAPPINGS", None) or [module.MAPPING]
    return tuple(found)


def _mapping_for(model_type: Any, where: str) -> FamilyMapping:
    by_type = {t: m for m in family_mappings() for t in m.model_types}
    if model_type not in by_type:
        raise HFError(f"{where}: model_type {model_type!r} is not supported; supported: {', '.join(by_type)}")
    return by_type[model_type]


# -- reading -----------------------------------------------------------------------------------------------


def read_config(root: Path) -> dict[str, Any]:
    """The parsed ``config.json`` of a checkpoint folder."""
    path = root / CONFIG_NAME
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: not a directory (expected a Hugging Face checkpoint folder)")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found; a Hugging Face checkpoint folder needs its config.json")
    return read_json_object(path, error=HFError)


def weight_files(root: Path) -> list[Path]:
    """The safetensors files of a checkpoint: the shards its index names, else ``model.safetensors``."""
    index = root / INDEX_NAME
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise HFError(f"{index}: not a safetensors index with a weight_map ({error})") from None
        shards = [root / name for name in dict.fromkeys(weight_map.values())]
        for shard in shards:
            if not shard.is_file():
                raise FileNotFoundError(f"{shard}: shard listed in {index} is missing")
        return shards
    if (root / WEIGHTS_NAME).is_file():
        return [root / WEIGHTS_NAME]
    pickles = [name for name in _PICKLES if (root / name).is_file()]
    if pickles:
        raise FileNotFoundError(
            f"{root}: only {pickles[0]} found; zoo reads safetensors only and never unpickles weights "
            "(convert with transformers: model.save_pretrained(dir, safe_serialization=True))"
        )
    raise FileNotFoundError(
        f"{root}: no {WEIGHTS_NAME} or {INDEX_NAME} (the checkpoint has no safetensors weights)"
    )


def read_tensors(files: list[Path], *, names_only: bool = False) -> StateDict:
    """Every tensor of the given safetensors files, on the CPU (``names_only``: headers only, values None);
    a name in two files is an error."""
    tensors: StateDict = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt", device="cpu") as handle:
                for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    if name in tensors:
                        raise HFError(f"{file}: tensor {name} also appears in another shard")
                    tensors[name] = None if names_only else handle.get_tensor(name)  # type: ignore[assignment]
        except SafetensorError as error:
            raise HFError(f"{file}: not a readable safetensors file: {error}") from None
    return tensors


# -- loading -----------------------------------------------------------------------------------------------


def from_hf(
    path: str | os.PathLike[str],
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> ZooModel:
    """Load a Hugging Face checkpoint folder (``config.json`` + safetensors, sharded or not) as a zoo model.

    The spec comes from ``config.json``, the weights are renamed, fused or transposed by the family's
    mapping and loaded strictly: every zoo tensor must come from the file, and every file tensor must be
    used (buffers such as ``position_ids`` and pretraining-only heads aside). ``dtype=None`` keeps the
    stored dtype. The model is returned in eval mode, as transformers' ``from_pretrained`` does.

    >>> model = zoo.from_hf("~/.cache/huggingface/hub/models--gpt2/snapshots/<rev>")
    """
    root = Path(path).expanduser()
    spec, mapping = _read_spec(root)
    files = weight_files(root)
    hf_tensors = read_tensors(files)
    with _naming_errors(root):
        tensors = mapping.hf_to_zoo(hf_tensors, spec)
    model = build_model(spec, device="meta", init=False)
    load_strict(model, tensors, source=str(root), device=torch.device(device or "cpu"), dtype=dtype)
    return model.eval()


def read_hf_spec(path: str | os.PathLike[str]) -> ModelSpec:
    """The zoo spec of a Hugging Face checkpoint folder, as `from_hf` derives it, without reading weights.

    Reads ``config.json`` and the weight files' headers (which tensors exist decides e.g. a tied head).
    """
    return _read_spec(Path(path).expanduser())[0]


def _read_spec(root: Path) -> tuple[ModelSpec, FamilyMapping]:
    config = read_config(root)
    mapping = _mapping_for(config.get("model_type"), str(root / CONFIG_NAME))
    names = set(read_tensors(weight_files(root), names_only=True))  # headers only: errors before the read
    name = _checkpoint_name(root)
    with _naming_errors(root):
        spec = mapping.config_to_spec(config, names)
        source = f"Hugging Face {architecture(config) or config['model_type']} ({name})"
        return spec.override(name=name, source=source), mapping


def load_strict(
    model: ZooModel, tensors: StateDict, *, source: str, device: torch.device, dtype: torch.dtype | None
) -> None:
    """Load ``tensors`` into a (meta-built) model: names and shapes must match exactly; then make the fixed
    tables (rotary angles, sinusoids) on ``device``."""
    expected = model.state_dict()
    problems = [f"missing {n}" for n in expected if n not in tensors]
    problems += [f"unexpected {n}" for n in tensors if n not in expected]
    problems += [
        f"{n}: expected shape {tuple(expected[n].shape)}, got {tuple(t.shape)}"
        for n, t in tensors.items()
        if n in expected and t.shape != expected[n].shape
    ]
    if problems:
        more = f" (and {len(problems) - 8} more)" if len(problems) > 8 else ""
        raise HFError(
            f"{source}: the converted tensors do not fit the model: {'; '.join(problems[:8])}{more}"
        )

    def place(tensor: torch.Tensor) -> torch.Tensor:
        cast = dtype is not None and tensor.is_floating_point()
        return tensor.to(device=device, dtype=dtype if cast else tensor.dtype)

    model.load_state_dict({n: place(t) for n, t in tensors.items()}, strict=True, assign=True)
    materialize_buffers(model, device)  # non-persistent buffers are not in the file: give them real storage
    model.reset_buffers()


@contextmanager
def _naming_errors(root: Path) -> Iterator[None]:
    """Re-raise a family's errors (HFError, a plain ValueError, an invalid spec) naming the checkpoint."""
    try:
        yield
    except ValidationError as error:
        raise HFError(
            f"{root / CONFIG_NAME}: gives an invalid zoo spec:\n{format_validation_error(error)}"
        ) from None
    except ValueError as error:
        raise HFError(f"{root}: {error}") from None


def _checkpoint_name(root: Path) -> str:
    """``gpt2`` for a hub cache snapshot ``models--gpt2/snapshots/<rev>``, else the folder's name."""
    root = root.resolve()
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith("models--"):
        return root.parent.parent.name.removeprefix("models--").replace("--", "/")
    return root.name


# -- writing -----------------------------------------------------------------------------------------------


def to_hf(
    model: ZooModel,
    out_dir: str | os.PathLike[str],
    *,
    model_type: str | None = None,
    tokenizer: Tokenizer | None = None,
) -> Path:
    """Write ``model`` as a Hugging Face checkpoint: ``config.json`` + ``model.safetensors``.

    The family is the first whose format can express the spec (gpt2, llama, bert, roberta, albert, ...),
    or ``model_type``. Files are written atomically. transformers' ``AutoModel*.from_pretrained(out_dir)``
    loads the result. With ``tokenizer``, its ``tokenizer.json`` and ``tokenizer_config.json`` go beside
    the weights, so ``AutoTokenizer.from_pretrained(out_dir)`` gives zoo's ids. Returns the folder.

    >>> zoo.to_hf(zoo.from_hf("gpt2_dir"), "export/")
    """
    spec = model.spec
    mapping, config = _export_config(spec, model_type)
    state = model.state_dict()
    if any(t.is_meta for t in state.values()):
        raise HFError("to_hf: the model has meta tensors (built on the meta device and never loaded)")
    tensors = {n: t.detach().to("cpu").contiguous() for n, t in mapping.zoo_to_hf(state, spec).items()}
    floats = Counter(t.dtype for t in tensors.values() if t.is_floating_point())
    if floats:
        dtype = str(floats.most_common(1)[0][0]).removeprefix("torch.")
        config |= {"torch_dtype": dtype, "dtype": dtype}  # transformers 4.x reads torch_dtype, 5.x dtype
    out = Path(out_dir).expanduser()
    write_atomic(out / WEIGHTS_NAME, lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}))
    write_text_atomic(out / CONFIG_NAME, json.dumps(config, indent=2, sort_keys=True) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(out, model_max_length=spec.max_positions)
    return out


def _export_config(spec: Any, model_type: str | None) -> tuple[FamilyMapping, dict[str, Any]]:
    """The mapping that can express ``spec`` and its config.json; errors list why each family cannot."""
    if model_type is not None:
        mapping = _mapping_for(model_type, "to_hf")
        return mapping, mapping.spec_to_config(spec)
    reasons = []
    for mapping in family_mappings():
        try:
            return mapping, mapping.spec_to_config(spec)
        except ValueError as error:
            reasons.append(f"  {'/'.join(mapping.model_types)}: {error}")
    raise HFError("no Hugging Face family can express this spec:\n" + "\n".join(reasons))
