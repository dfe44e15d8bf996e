"""What several subcommands share, parsed in one place: ``--dtype``, ``--device``, ``--seed``, counts that
cannot be negative, text that must be UTF-8, and the NAME|SPEC_FILE|DIR target of `zoo show`, `zoo diff` and `zoo plot masks`.

One vocabulary for every command, so that ``--dtype bf16`` means the same to `show` as to `generate`:

    --dtype   fp32 | float32 | bf16 | bfloat16 | fp16 | float16
    --device  auto (cuda when available, else cpu) | cpu | cuda | cuda:N | mps

Both are checked when the command line is parsed, so a typo is argparse's one-line error (exit 2) before
anything is loaded. The library's own helpers do the work: `zoo.analysis.dtype_info` names a dtype,
`zoo.devices.resolve_device` turns ``auto`` into a device.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from zoo.io.names import CONFIG_NAME, SPEC_NAME

if TYPE_CHECKING:  # torch loads only once a command runs: `zoo schema` and `zoo --help` stay instant
    import torch

    from zoo.spec import ModelSpec

DTYPE_CHOICES = ("fp32", "float32", "bf16", "bfloat16", "fp16", "float16")
DTYPE_METAVAR = "{fp32,bf16,fp16}"  # the long spellings are accepted too; the help says so


def parse_dtype(text: str) -> str:
    """The ``type`` of every ``--dtype``: one of `DTYPE_CHOICES` -> its canonical name (``"bfloat16"``)."""
    from zoo.analysis import dtype_info

    if text.lower() not in DTYPE_CHOICES:
        raise argparse.ArgumentTypeError(f"invalid dtype {text!r} (choose from {', '.join(DTYPE_CHOICES)})")
    return dtype_info(text.lower())[0]


def torch_dtype(name: str | None) -> torch.dtype | None:
    """The torch dtype of a name `parse_dtype` returned; None stays None ("as saved")."""
    import torch

    return None if name is None else getattr(torch, name)


def add_dtype_option(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, default: str | None, help: str
) -> None:
    """``--dtype`` in the shared vocabulary; ``help``: what the dtype is for, what the default means."""
    parser.add_argument(
        "--dtype",
        type=parse_dtype,
        default=default,
        metavar=DTYPE_METAVAR,
        help=f"{help}; fp32|float32, bf16|bfloat16 or fp16|float16",
    )


# The device types zoo runs on (`zoo.devices.resolve_device`). torch.device also parses "xla", "hpu", "meta"
# and more, which fail only once the weights are read, with a page of dispatcher text.
DEVICE_TYPES = ("cpu", "cuda", "mps")


def parse_device(text: str) -> str:
    """The ``type`` of every ``--device``: ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``, kept as text.

    Only the spelling is checked here; whether the device exists (CUDA on this machine) is for
    `zoo.load` to say, before it reads anything.
    """
    if text == "auto":  # argparse passes the default through here too: no torch import for `zoo --help`
        return text
    import torch

    try:
        device = torch.device(text)
    except RuntimeError:
        device = None
    if device is None or device.type not in DEVICE_TYPES or (device.type != "cuda" and device.index):
        raise argparse.ArgumentTypeError(f"invalid device {text!r} (expected auto, cpu, cuda, cuda:N or mps)")
    return text


# torch.Generator.manual_seed takes a 64-bit seed; a larger one raises an OverflowError mid-run.
SEED_LIMIT = 2**64


def parse_seed(text: str) -> int:
    """The ``type`` of ``--seed``: an int in [0, 2**64), the range torch's generators take."""
    seed = _int(text, "seed")
    if not 0 <= seed < SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"invalid seed {text} (expected an int from 0 to 2**64 - 1)")
    return seed


def non_negative_int(text: str) -> int:
    """The ``type`` of a count where 0 means none or off, e.g. ``--min-frequency``."""
    value = _int(text, "value")
    if value < 0:
        raise argparse.ArgumentTypeError(f"invalid value {text} (expected an int >= 0)")
    return value


def port(text: str) -> int:
    """The ``type`` of a TCP port: 0 (any free one) to 65535."""
    value = non_negative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"invalid port {text} (expected 0 to 65535)")
    return value


def positive_int(text: str) -> int:
    """The ``type`` of a count that must be at least 1, e.g. ``--batch-size``."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid value {text!r} (expected an int >= 1)")
    return value


BYTE_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def byte_size(text: str) -> int:
    """The ``type`` of a size in bytes: an int, or one with a binary suffix (``512M``, ``1G``, ``1GiB``:
    powers of 1024), e.g. ``--prefix-cache-bytes``; 0 is allowed (off)."""
    cleaned = text.strip().upper().removesuffix("B").removesuffix("I")
    number, unit = (cleaned[:-1], cleaned[-1]) if cleaned[-1:] in ("K", "M", "G", "T") else (cleaned, "")
    try:
        value = float(number) * BYTE_UNITS[unit]
    except ValueError:
        value = -1.0
    if not 0 <= value < 2**63 or value != value:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r} (expected bytes >= 0: an int, or with K, M, G or T, e.g. 512M, 1G)"
        )
    return int(value)


def utf8_text(text: str) -> str:
    """The ``type`` of a text argument: bytes that are not UTF-8 (Python keeps them as lone surrogates)
    are argparse's error here, not the tokenizer's TypeError later."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        code = ord(text[error.start])
        # surrogateescape keeps an undecodable byte b (0x80-0xff) as U+DC00 + b
        what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
        raise argparse.ArgumentTypeError(
            f"not UTF-8 text ({what} at character {error.start}); check the terminal's encoding"
        ) from None
    return text


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid {what} {text!r} (expected an int)") from None


def add_device_option(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    default: str | None = "auto",
    default_help: str = "auto = cuda when available, else cpu",
) -> None:
    """``--device``, ``auto`` by default: the GPU when CUDA is available, else the CPU.

    ``default=None`` (with its ``default_help``) is for a command whose config already names a device.
    """
    parser.add_argument(
        "--device",
        type=parse_device,
        default=default,
        help=f"auto, cpu, cuda, cuda:N or mps (default: {default_help})",
    )


_SPEC_SUFFIXES = (".yaml", ".yml", ".json", ".safetensors")  # a file, whose loader names it when missing


def _looks_like_hub_id(target: str) -> bool:
    """``org/name``: not a preset, not a file name (a missing ``my/spec.yaml`` keeps its own error), not a
    path under a folder here (``runs/demo`` beside ``runs/``: `zoo.io.hf.hub.names_a_local_path`)."""
    from zoo.spec import list_presets

    if "/" not in target or target in list_presets() or target.endswith(_SPEC_SUFFIXES):
        return False
    # zoo.io.hf imports torch and the converters: only for an org/name
    from zoo.io.hf.hub import names_a_local_path, parse_hub_id

    return parse_hub_id(target) is not None and not names_a_local_path(target)


def load_target_spec(target: str) -> ModelSpec:
    """The spec of a preset name, a spec file, a zoo checkpoint, a Hugging Face folder (``config.json``) or
    a Hub id in the local Hugging Face cache (``org/name``; a preset or an existing path wins).

    A zoo checkpoint (``spec.json`` or safetensors metadata) is read by `zoo.analysis.load_target_spec`;
    a folder with a ``config.json`` and no ``spec.json`` goes through the Hugging Face import path, reading
    the config and the weights' headers (which tensors exist decides e.g. tied embeddings), never the
    weights themselves.
    """
    from zoo.cli import kinds

    # A training config, a tokenizer or a config.json given by mistake: one line saying what it is.
    with kinds.expecting(
        target,
        kinds.SPEC,
        kinds.CHECKPOINT,
        kinds.RUN,
        kinds.HF_FOLDER,
        expected="a model spec or checkpoint",
    ):
        return _load_target_spec(target)


def _load_target_spec(target: str) -> ModelSpec:
    from zoo.analysis import load_target_spec as load_zoo_target

    path = Path(target).expanduser()
    if path.is_dir() and (path / CONFIG_NAME).is_file() and not (path / SPEC_NAME).is_file():
        from zoo.io.hf import read_hf_spec

        return read_hf_spec(path)
    if not path.exists() and _looks_like_hub_id(target):
        from zoo.io.hf import read_hf_spec  # a Hub id, resolved through the Hugging Face cache

        return read_hf_spec(target)
    if not path.exists() and "/" in target and path.suffix not in _SPEC_SUFFIXES:  # no preset has a "/"
        raise FileNotFoundError(f"{target}: no such folder (a zoo checkpoint or a Hugging Face folder)")
    return load_zoo_target(target)
