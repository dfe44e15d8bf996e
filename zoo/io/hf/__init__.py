"""Hugging Face interop: `from_hf` reads a transformers checkpoint folder, `to_hf` writes one.

    config.json ──config_to_spec──> ModelSpec ──build on meta──> model ──strict load──> model
    model*.safetensors ──hf_to_zoo──> zoo tensors ─────────────────────────┘

Each family module (gpt2, llama [+ mistral, qwen2, qwen3], bert [+ roberta, xlm-roberta, xlm-roberta-xl],
albert, t5 [+ mt5, umt5], bart [+ marian], m2m100, bigbird, opt, ctrl, distilbert, electra, mpnet, mbart
[+ pegasus], gpt_neox, phi3, gemma, modernbert, olmo2, starcoder2, cohere2, vit, clip [+ siglip], whisper) holds declarative `FamilyMapping`s; this module only reads and writes files, picks
the mapping by ``model_type`` and reads every export back (`faithful`). Weights are read from safetensors only:
zoo never unpickles a ``pytorch_model.bin``.

Reading checks before it builds: every file an index names is a plain name in the folder (checked before
any file is opened), every header parses, the spec that config.json gives asks for no more layers, widths
and tables than the weights hold (`zoo.io.checkpoint.limits`), and every weight is floating point in one
dtype (or ``dtype=`` casts them). ``model.safetensors`` is read before an index, as transformers does:
`to_hf` writes it, then config.json, then removes a previous export's index and shards.
"""

from __future__ import annotations

import importlib
import json
import os
import re
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError
from safetensors import SafetensorError
from safetensors.torch import save_file

from zoo.devices import default_device, path_argument, resolve_device, resolve_dtype
from zoo.generation.weight_layout import row_major
from zoo.io.atomic import fsync_dir, remove_quietly, remove_stale_temps, write_atomic, write_text_atomic
from zoo.io.checkpoint.files import CheckpointError, TensorInfo, read_header
from zoo.io.checkpoint.limits import check_allocation, check_spec_fits, numbered_parts
from zoo.io.checkpoint.loading import materialize_buffers
from zoo.io.checkpoint.mapped import MappedFiles, release_unless_shared
from zoo.io.generation_file import read_generation_file, set_generation_file, write_generation_file
from zoo.io.hf.common import (
    FamilyMapping,
    HFError,
    NoFamilyError,
    StateDict,
    TypedConfig,
    architecture,
    json_kind,
)
from zoo.io.hf.faithful import faithful_config
from zoo.io.hf.hub import resolve_checkpoint
from zoo.io.jsonfile import read_json_object
from zoo.io.names import (
    CONFIG_NAME,
    GENERATION_CONFIG_NAME,
    HF_PICKLE_NAMES,
    HF_SHARD_PATTERN,
    INDEX_NAME,
    SPECIAL_TOKENS_MAP_NAME,
    TOKENIZER_CONFIG_NAME,
    TOKENIZER_NAME,
    WEIGHTS_NAME,
    is_plain_file_name,
)
from zoo.io.outputs import HF_CHECKPOINT, check_output_dir
from zoo.io.paths import inside
from zoo.io.tokenizer import Tokenizer
from zoo.models import ZooModel, build_model
from zoo.quant import quantization_of
from zoo.spec import ModelSpec
from zoo.spec.errors import short_repr
from zoo.spec.presets import format_validation_error

__all__ = [
    "FamilyMapping",
    "HFError",
    "NoFamilyError",
    "family_mappings",
    "from_hf",
    "hf_config",
    "to_hf",
    "to_hf_state",
]

FAMILY_MODULES: tuple[str, ...] = (
    "gpt2",
    "llama",
    "bert",
    "albert",
    "t5",
    "bart",
    "m2m100",
    "bigbird",
    "opt",
    "ctrl",
    "distilbert",
    "electra",
    "mpnet",
    "mbart",
    "gpt_neox",
    "phi3",
    "gemma",
    "modernbert",
    "olmo2",
    "starcoder2",
    "cohere2",
    "gpt_oss",
    "deepseek",
    "llama4",
    "vit",
    "clip",
    "whisper",
)
# The files to_hf writes, hence the temp files a killed export may leave: `remove_stale_temps` removes those.
_OWN_FILES = re.compile(
    "|".join(
        map(
            re.escape,
            (
                WEIGHTS_NAME,
                CONFIG_NAME,
                GENERATION_CONFIG_NAME,
                TOKENIZER_NAME,
                TOKENIZER_CONFIG_NAME,
                SPECIAL_TOKENS_MAP_NAME,
            ),
        )
    )
)


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
    if not isinstance(model_type, str):  # a list or an object is no model type (and cannot be looked up)
        raise HFError(
            f"{where}: model_type must be a string naming the family, got {json_kind(model_type)}; "
            f"supported: {', '.join(by_type)}"
        )
    if model_type not in by_type:
        raise HFError(
            f"{where}: model_type {short_repr(model_type)} is not supported; supported: {', '.join(by_type)}"
        )
    return by_type[model_type]


# -- reading -----------------------------------------------------------------------------------------------


def read_config(root: Path) -> dict[str, Any]:
    """The parsed ``config.json`` of a checkpoint folder."""
    path = inside(root, CONFIG_NAME, error=HFError)  # not a link out of the folder (`zoo.io.paths`)
    if not root.is_dir():
        what = "not a directory" if root.exists() else "no such folder"
        raise FileNotFoundError(f"{root}: {what} (expected a Hugging Face checkpoint folder)")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found; a Hugging Face checkpoint folder needs its config.json")
    return read_json_object(path, error=HFError)


def weight_files(root: Path) -> list[Path]:
    """The safetensors files of a checkpoint: ``model.safetensors``, else the shards its index names.

    ``model.safetensors`` comes first, as in transformers' ``from_pretrained``: a folder holding both (an
    export interrupted before it removed the previous index) loads the same in both libraries. Every name
    in the index must be a plain file name in ``root``, checked before any file is looked at.
    """
    if (root / WEIGHTS_NAME).is_file():
        return [inside(root, WEIGHTS_NAME, error=HFError)]
    index = inside(root, INDEX_NAME, error=HFError)
    if index.is_file():
        data = read_json_object(index, error=HFError)
        weight_map = data.get("weight_map")
        if not isinstance(weight_map, dict):
            raise HFError(
                f"{index}: not a safetensors index: 'weight_map' must map tensor names to file names, "
                f"got {type(weight_map).__name__}"
            )
        for name, shard in weight_map.items():
            if not is_plain_file_name(shard):
                raise HFError(
                    f"{index}: 'weight_map' sends {name} to {shard!r}, which is not a plain file name in "
                    "this folder; refusing to read outside it"
                )
        shards = [inside(root, name, error=HFError) for name in dict.fromkeys(weight_map.values())]
        for shard in shards:
            if not shard.is_file():
                raise FileNotFoundError(f"{shard}: shard listed in {index} is missing")
        return shards
    pickles = [name for name in HF_PICKLE_NAMES if (root / name).is_file()]
    if pickles:
        raise FileNotFoundError(
            f"{root}: only {pickles[0]} found; zoo reads safetensors only and never unpickles weights "
            "(convert with transformers: model.save_pretrained(dir, safe_serialization=True))"
        )
    raise FileNotFoundError(
        f"{root}: no {WEIGHTS_NAME} or {INDEX_NAME} (the checkpoint has no safetensors weights)"
    )


def read_headers(files: list[Path]) -> dict[str, TensorInfo]:
    """Every tensor's dtype and shape, from the headers alone (checked like zoo's own files); a name in two
    files is an error."""
    infos: dict[str, TensorInfo] = {}
    for file in files:
        try:
            _, found = read_header(file)
        except CheckpointError as error:
            raise HFError(f"{file}: not a readable safetensors file: {error}") from None
        except OSError as error:
            raise HFError(f"{file}: cannot read: {error.strerror or error}") from None
        for name in found:
            if name in infos:
                raise HFError(f"{file}: tensor {name} also appears in another shard")
        infos |= found
    return infos


def read_tensors(files: list[Path], source: MappedFiles | None = None) -> StateDict:
    """Every tensor of the given safetensors files on the CPU, each a view of its file's memory mapping
    (nothing is copied; ``source``: the `MappedFiles` to read them through); a name in two files is an error."""
    source = source or MappedFiles(files)
    tensors: StateDict = {}
    for file in files:
        try:
            for name in source.names(file):
                if name in tensors:
                    raise HFError(f"{file}: tensor {name} also appears in another shard")
                tensors[name] = source.get(file, name)
        except SafetensorError as error:
            raise HFError(f"{file}: not a readable safetensors file: {error}") from None
    return tensors


# -- loading -----------------------------------------------------------------------------------------------


def from_hf(
    path: str | os.PathLike[str],
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
) -> ZooModel:
    """Load a Hugging Face checkpoint folder (``config.json`` + safetensors, sharded or not) as a zoo model.

    ``path`` is a folder, or a Hub id (``"org/name"``, ``"name"``, ``"org/name@revision"``) when no such
    path exists: read from huggingface_hub's cache, downloaded into it unless ``HF_HUB_OFFLINE=1``
    (`zoo.io.hf.hub`; the ``hub`` extra).

    The spec comes from ``config.json``, the weights are renamed, fused or transposed by the family's
    mapping and loaded strictly: every zoo tensor must come from the file, and every file tensor must be
    used (buffers such as ``position_ids`` and pretraining-only heads aside). ``dtype=None`` keeps the
    stored dtype. The model is returned in eval mode, as transformers' ``from_pretrained`` does. The
    folder's ``generation_config.json`` (Whisper's prompt and suppressed tokens) travels with the model, as
    it was read: `zoo.save` and `zoo.to_hf` write it (`zoo.io.generation_file`).

    ``device`` and ``dtype`` are checked first, as `zoo.load` checks them (`zoo.devices`: ``"cuda"`` without
    CUDA is one line, not torch's assertion); ``device=None`` is the ambient device (the CPU unless ``with
    torch.device(...)`` says otherwise). On ``meta`` the folder is checked and the model returned without
    reading any weights.

    >>> model = zoo.from_hf("~/.cache/huggingface/hub/models--gpt2/snapshots/<rev>")
    >>> model = zoo.from_hf("Helsinki-NLP/opus-mt-en-de")
    """
    path = path_argument(path, where="zoo.from_hf")
    target = resolve_device(device) if device is not None else default_device()
    cast = resolve_dtype(dtype)
    root = resolve_checkpoint(path)
    spec, mapping, files = _read_spec(root)  # the spec is checked against the headers: nothing built yet
    generation = read_generation_file(root, error=HFError)  # Whisper's prompt: travels with the model
    if target.type == "meta":  # the structure only: nothing is read
        stored = Counter(info.dtype for info in read_headers(files).values() if info.dtype.is_floating_point)
        model = build_model(spec, device="meta", init=False, dtype=cast or stored.most_common(1)[0][0])
        setattr(model, "name_or_path", os.fspath(path))  # noqa: B010
        set_generation_file(model, generation)
        return model.eval()
    # Read in place: a tensor the mapping renames is the model's weight as it lies in the file; one it fuses,
    # transposes, casts or moves is copied one at a time, and its source's pages given back (`mapped`).
    with MappedFiles(files) as source:
        hf_tensors = read_tensors(files, source)
        with _naming_errors(root):
            tensors = mapping.hf_to_zoo(hf_tensors, spec)
        del hf_tensors
        model = build_model(spec, device="meta", init=False)
        load_strict(model, tensors, source=str(root), device=target, dtype=cast)
    setattr(model, "name_or_path", os.fspath(path))  # noqa: B010 (what zoo.lora.save records as base_id)
    set_generation_file(model, generation)
    return model.eval()


def read_hf_spec(path: str | os.PathLike[str]) -> ModelSpec:
    """The zoo spec of a Hugging Face checkpoint folder (or Hub id), as `from_hf` derives it, without reading
    weights.

    Reads ``config.json`` and the weight files' headers (which tensors exist decides e.g. a tied head), and
    refuses a config asking for more layers or wider tensors than the weights hold.
    """
    return _read_spec(resolve_checkpoint(path_argument(path, where="zoo.read_hf_spec")))[0]


def _read_spec(root: Path) -> tuple[ModelSpec, FamilyMapping, list[Path]]:
    """(spec, mapping, weight files): config.json read, every header checked, the spec held against them."""
    config = TypedConfig(read_config(root))  # each field's type checked as the family reads it
    mapping = _mapping_for(config.get("model_type"), str(root / CONFIG_NAME))
    files = weight_files(root)
    infos = read_headers(files)  # headers only: errors before any tensor is read
    name = _checkpoint_name(root)
    with _naming_errors(root):
        spec = mapping.config_to_spec(config, set(infos))
        source = f"Hugging Face {architecture(config) or config['model_type']} ({name})"
        spec = spec.override(name=name, source=source)
    # Hugging Face names its layers h.N, layers.N, layer.N or block.N: N layers, N numbers in the names.
    layers = numbered_parts(infos)
    shapes = {n: info.shape for n, info in infos.items()}
    held = {stack: set(range(len(layers))) for stack in spec.stacks()}
    check_spec_fits(
        spec, shapes, held, source=str(root / CONFIG_NAME), held_by="the checkpoint", error=HFError
    )
    return spec, mapping, files


def load_strict(
    model: ZooModel, tensors: StateDict, *, source: str, device: torch.device, dtype: torch.dtype | None
) -> None:
    """Load ``tensors`` into a (meta-built) model: names and shapes must match exactly; then make the fixed
    tables (rotary angles, sinusoids) on ``device``. ``tensors`` is emptied as they are placed, so that a
    cast or a move drops each source (a fused copy, say) before the next: never two copies of the weights."""
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
    _check_dtypes(tensors, source=source, cast=dtype is not None)
    elements = sum(t.numel() for t in tensors.values())
    check_allocation(
        model, model.spec, loaded=set(tensors), file_elements=elements, source=source, error=HFError
    )

    def place(tensor: torch.Tensor) -> torch.Tensor:
        cast = dtype is not None and tensor.is_floating_point()
        placed = tensor.to(device=device, dtype=dtype if cast else tensor.dtype)
        release_unless_shared([tensor], placed)  # a copy: the source's file pages go (`mapped`)
        return placed

    placed = {name: place(tensors.pop(name)) for name in list(tensors)}
    model.load_state_dict(placed, strict=True, assign=True)
    materialize_buffers(model, device)  # non-persistent buffers are not in the file: give them real storage
    model.reset_buffers()


def _check_dtypes(tensors: StateDict, *, source: str, cast: bool) -> None:
    """Every weight floating point (zoo's tensors all are); without a cast, all in one dtype."""
    for name, tensor in tensors.items():
        if not tensor.is_floating_point():
            raise HFError(f"{source}: {name} is {_dtype_name(tensor)}; a floating-point weight is expected")
    elements: Counter[torch.dtype] = Counter()
    for tensor in tensors.values():
        elements[tensor.dtype] += tensor.numel()
    if cast or len(elements) < 2:
        return
    main = elements.most_common(1)[0][0]
    odd = next(name for name, tensor in tensors.items() if tensor.dtype != main)
    raise HFError(
        f"{source}: {odd} is {_dtype_name(tensors[odd])} but the checkpoint's other weights are "
        f"{str(main).removeprefix('torch.')}; pass dtype= to load every weight in one dtype"
    )


def _dtype_name(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


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


# (bos first, eos last): how zoo frames a text for a model of each family, where the tokenizer has those tokens,
# and so how an exported tokenizer without a post-processor of its own must frame it for transformers. A
# decoder's prompt is `bos text` (zoo generate, zoo serve and zoo's lm-eval adapter feed it so; causal_lm, chat
# and dpo train on `bos ...` rows): an eos at its end would be read as the end of a document. An encoder's text
# is `bos text eos` (masked_lm and classification train on it); a seq2seq source is `text eos` (zoo translate,
# seq2seq training; the target side, `text eos`, is transformers' `text_target` with the same framing).
MODEL_FRAMING: dict[str, tuple[bool, bool]] = {
    "decoder": (True, False),
    "encoder": (True, True),
    "encoder-decoder": (False, True),
    "dual-encoder": (True, True),  # CLIP's text: <|startoftext|> text <|endoftext|>
}


def to_hf(
    model: ZooModel,
    out_dir: str | os.PathLike[str],
    *,
    model_type: str | None = None,
    tokenizer: Tokenizer | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``model`` as a Hugging Face checkpoint: ``config.json`` + ``model.safetensors``.

    The family is the first whose format can express the spec (gpt2, llama, bert, roberta, albert, ...),
    or ``model_type``. transformers' ``AutoModel*.from_pretrained(out_dir)`` loads the result. With
    ``tokenizer``, its ``tokenizer.json`` and ``tokenizer_config.json`` go beside the weights, so
    ``AutoTokenizer.from_pretrained(out_dir)`` gives the ids zoo feeds the model: a tokenizer without a
    post-processor of its own (one zoo trained) frames text as the model's family is used (`MODEL_FRAMING`),
    a decoder's prompt ``[bos, *ids]`` as ``zoo generate`` feeds it, for one. The ``generation_config.json``
    the model carries (read by `zoo.from_hf` or `zoo.load`) is written as it was read, for transformers'
    ``generate`` (Whisper's prompt and suppressed tokens). Returns the folder.

    A folder that holds anything but Hugging Face model files (a zoo model, a training run, other files) is
    refused unless ``overwrite``, which removes the other models' files there first (`zoo.io.outputs`); an
    earlier export is replaced.

    Every file is written atomically, weights first: renaming ``model.safetensors`` into place switches the
    folder's weights in one step (it is read before any index), then ``config.json`` follows, then a
    previous export's ``model.safetensors.index.json`` and ``model-0000i-of-0000n.safetensors`` shards are
    removed. Killed at any moment, the folder holds the old weights or the new ones; killed between the two
    renames, the new weights sit beside the previous ``config.json`` (harmless when the architecture is
    unchanged; otherwise export again).

    >>> zoo.to_hf(zoo.from_hf("gpt2_dir"), "export/")
    """
    check_output_dir(out_dir, HF_CHECKPOINT, writer="zoo.to_hf", overwrite=overwrite)
    spec = model.spec
    config, tensors = to_hf_state(model, model_type=model_type)
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(out, _OWN_FILES)  # what killed exports left
    # The weights switch in one rename: model.safetensors is read before any index (here and in transformers).
    write_atomic(out / WEIGHTS_NAME, lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}))
    write_text_atomic(out / CONFIG_NAME, json.dumps(config, indent=2, sort_keys=True) + "\n")
    write_generation_file(out, model)  # or a previous export's removed: transformers would read it
    _remove_previous_shards(out)
    if tokenizer is not None:
        add_bos, add_eos = MODEL_FRAMING[spec.family]
        tokenizer.save_pretrained(out, model_max_length=spec.max_positions, add_bos=add_bos, add_eos=add_eos)
    return out


def to_hf_state(model: ZooModel, *, model_type: str | None = None) -> tuple[dict[str, Any], StateDict]:
    """The ``config.json`` dict and the state dict (on the CPU) that `to_hf` writes, in memory: what another
    format's writer starts from (`zoo.export.gguf`). The family is chosen as `to_hf` chooses it."""
    _check_plain_weights(model)
    spec = model.spec
    mapping, config = _export_config(spec, model_type)
    row_major(
        model
    )  # contiguous in place, one matrix at a time, not a copy of every one (generation.weight_layout)
    state = model.state_dict()
    if any(t.is_meta for t in state.values()):
        raise HFError("to_hf: the model has meta tensors (built on the meta device and never loaded)")
    tensors = {n: t.detach().to("cpu").contiguous() for n, t in mapping.zoo_to_hf(state, spec).items()}
    floats = Counter(t.dtype for t in tensors.values() if t.is_floating_point())
    if floats:
        dtype = str(floats.most_common(1)[0][0]).removeprefix("torch.")
        config |= {"torch_dtype": dtype, "dtype": dtype}  # transformers 4.x reads torch_dtype, 5.x dtype
    return config, tensors


def hf_config(spec: ModelSpec, *, model_type: str | None = None) -> dict[str, Any]:
    """The ``config.json`` dict `to_hf` writes for ``spec`` (the family chosen as `to_hf` chooses it), from
    the spec alone: no weights are read. `NoFamilyError` when no family can express it."""
    return _export_config(spec, model_type)[1]


def _check_plain_weights(model: ZooModel) -> None:
    """Refuse weights a Hugging Face config cannot describe: adapters beside them, or quantised ones."""
    # io sits below zoo.lora, so its wrapper is recognised by class name (as zoo.save does).
    if any(type(module).__name__ == "LoraLinear" for module in model.modules()):
        raise HFError(
            "to_hf: the model has LoRA adapters: export them with zoo.lora.to_peft beside the base, or fold "
            "them in with zoo.lora.merge_and_unload first"
        )
    if (record := quantization_of(model)) is not None:
        raise HFError(
            f"to_hf: the model's weights are quantised ({record.describe()}); export the floating-point model"
        )


def _remove_previous_shards(out: Path) -> None:
    """Remove a previous sharded checkpoint's index, then its shards (only Hugging Face's shard names,
    ``model-00001-of-00003.safetensors``): unread now that ``model.safetensors`` is there, but stale, and
    loaded by any reader that prefers an index."""
    index = out / INDEX_NAME
    if index.is_file() or index.is_symlink():
        remove_quietly(index)
        fsync_dir(out)
    for path in out.iterdir():
        if HF_SHARD_PATTERN.fullmatch(path.name) and (path.is_file() or path.is_symlink()):
            remove_quietly(path)
    fsync_dir(out)


def _export_config(spec: Any, model_type: str | None) -> tuple[FamilyMapping, dict[str, Any]]:
    """The mapping that can express ``spec`` and its config.json; errors list why each family cannot."""
    if model_type is not None:
        mapping = _mapping_for(model_type, "to_hf")
        return mapping, faithful_config(mapping, spec)
    reasons = []
    for mapping in family_mappings():
        try:
            return mapping, faithful_config(mapping, spec)
        except ValueError as error:
            reasons.append(("/".join(mapping.model_types), error))
    raise NoFamilyError(reasons)  # the closest family first
