"""What several subcommands share, parsed in one place: ``--dtype``, ``--device``, and the
NAME|SPEC_FILE|DIR target of `zoo show`, `zoo diff` and `zoo plot masks`.

One vocabulary for every command, so that ``--dtype bf16`` means the same to `show` as to `generate`:

    --dtype   fp32 | float32 | bf16 | bfloat16 | fp16 | float16
    --device  auto (cuda when available, else cpu) | cpu | cuda | cuda:N | mps | ...

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


def parse_device(text: str) -> str:
    """The ``type`` of every ``--device``: ``auto`` or a device string torch understands, kept as text.

    Only the spelling is checked here; whether the device exists (CUDA on this machine) is for
    `zoo.load` to say, before it reads anything.
    """
    if text == "auto":  # argparse passes the default through here too: no torch import for `zoo --help`
        return text
    import torch

    try:
        torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(
            f"invalid device {text!r} (expected auto, cpu, cuda, cuda:N, mps, ...)"
        ) from None
    return text


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
        help=f"auto, cpu, cuda, cuda:N, mps, ... (default: {default_help})",
    )


def load_target_spec(target: str) -> ModelSpec:
    """The spec of a preset name, a spec file, a zoo checkpoint or a Hugging Face folder (``config.json``).

    A zoo checkpoint (``spec.json`` or safetensors metadata) is read by `zoo.analysis.load_target_spec`;
    a folder with a ``config.json`` and no ``spec.json`` goes through the Hugging Face import path, reading
    the config and the weights' headers (which tensors exist decides e.g. tied embeddings), never the
    weights themselves.
    """
    from zoo.analysis import load_target_spec as load_zoo_target

    path = Path(target).expanduser()
    if path.is_dir() and (path / CONFIG_NAME).is_file() and not (path / SPEC_NAME).is_file():
        from zoo.io.hf import read_hf_spec

        return read_hf_spec(path)
    return load_zoo_target(target)
