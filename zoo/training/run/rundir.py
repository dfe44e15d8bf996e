"""A run's output directory: what counts as a previous run there, and the rules every write into it
follows.

    previous_run(out)       the run, model and tokenizer files already there (a fresh run refuses them)
    clear_run(out)          deletes those and the sinks' files (``overwrite=True``); nothing else
    check_no_links(out)     a symbolic link where the trainer writes is refused, never written through
    writing(path)           an OSError while writing ``path`` (a full disk) becomes one `RunWriteError`

One trainer at a time: `zoo.training.run.runlock`.

A symbolic link is refused rather than followed or replaced: written through, ``metrics.jsonl`` -> a file
elsewhere would change that file; silently replaced, the link the user made would be gone.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from safetensors import SafetensorError

from zoo.io.names import (
    ADAPTER_NAME,
    CHECKPOINTS_DIR,
    CONFIG_NAME,
    INDEX_NAME,
    METRICS_CSV_NAME,
    METRICS_NAME,
    RUN_INFO_NAME,
    RUN_LOCK_NAME,
    SHARD_PATTERN,
    SOURCE_TOKENIZER_NAME,
    SPEC_NAME,
    SPECIAL_TOKENS_MAP_NAME,
    STEP_DIR_GLOB,
    TENSORBOARD_DIR,
    TOKENIZER_CONFIG_NAME,
    TOKENIZER_NAME,
    TRAIN_CONFIG_NAME,
    TRAINER_STATE_NAME,
    WEIGHTS_NAME,
)

# What a training run writes, and what a saved (or converted) model holds: a fresh run refuses any of them.
RUN_NAMES = (CHECKPOINTS_DIR, METRICS_NAME, TRAIN_CONFIG_NAME, RUN_INFO_NAME)
# The optional sinks' files: never without metrics.jsonl in a run, and a fresh sink starts them over anyway
# (so a stray one alone is no run); cleared with the run all the same.
SINK_NAMES = (METRICS_CSV_NAME, TENSORBOARD_DIR)
MODEL_NAMES = (
    WEIGHTS_NAME, INDEX_NAME, SPEC_NAME, CONFIG_NAME,
    TOKENIZER_NAME, SOURCE_TOKENIZER_NAME, TOKENIZER_CONFIG_NAME, SPECIAL_TOKENS_MAP_NAME, ADAPTER_NAME,
)  # fmt: skip
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class RunDirError(OSError):
    """The output directory cannot be used as it is; the message says why and what to do.

    An OSError (as `FileExistsError` is, for a previous run), so the CLI shows the message, not a traceback.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class RunWriteError(RunDirError):
    """A file of the run could not be written (a full disk, a read-only file system). ``errno``,
    ``strerror`` and ``filename`` are the cause's and the file's; the message adds what is left intact
    and how to go on."""

    def __init__(self, message: str, *, path: Path | str, cause: OSError) -> None:
        super().__init__(message)
        self.errno, self.strerror, self.filename = cause.errno, cause.strerror, str(path)


# --- a previous run ---------------------------------------------------------------------------------------


def previous_run(output_dir: Path) -> list[str]:
    """The names in ``output_dir`` a fresh run would clobber: run records, checkpoints, a model, a
    tokenizer."""
    if not output_dir.is_dir():
        return []
    found = []
    for name in (*RUN_NAMES, *MODEL_NAMES):
        path = output_dir / name
        if name == CHECKPOINTS_DIR and path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
            continue  # an empty checkpoints/ holds nothing to lose
        if os.path.lexists(path):
            found.append(f"{name}/" if path.is_dir() else name)
    found += sorted(p.name for p in output_dir.iterdir() if SHARD_PATTERN.fullmatch(p.name))
    return found


def previous_run_error(output_dir: Path, found: list[str]) -> FileExistsError:
    listed = ", ".join(found)
    if any(name.rstrip("/") in RUN_NAMES for name in found):
        if not has_checkpoint(output_dir):
            return FileExistsError(
                f"{output_dir} already holds a training run that saved no checkpoint to resume from: start "
                f"over ({option('overwrite')}, which deletes {listed}), or choose another output dir"
            )
        return FileExistsError(
            f"{output_dir} already holds a training run; resume it ({option('resume')}) or start over "
            f"({option('overwrite')}, which deletes {listed})"
        )
    return FileExistsError(
        f"{output_dir} already holds a saved model or tokenizer ({listed}), which training would replace: "
        f"choose another output dir, or start over ({option('overwrite')}, which deletes them)"
    )


# How messages name the options a caller passes: ``train(config, resume=True)`` in Python, ``--resume``
# under ``zoo train`` (which sets this around its call, `cli_options`).
_CLI_OPTIONS: contextvars.ContextVar[bool] = contextvars.ContextVar("zoo_training_cli_options", default=False)


def option(name: str, value: str = "True") -> str:
    """The option ``name`` (``resume``, ``overwrite``) as the caller spells it: ``resume=True`` from Python,
    ``--resume`` inside `cli_options`; ``value`` other than True: ``resume=PATH`` / ``--resume PATH``."""
    if _CLI_OPTIONS.get():
        return f"--{name}" if value == "True" else f"--{name} {value}"
    return f"{name}={value}"


@contextlib.contextmanager
def cli_options() -> Iterator[None]:
    """Inside, messages name the command line's options (``--resume``), not `train`'s arguments."""
    token = _CLI_OPTIONS.set(True)
    try:
        yield
    finally:
        _CLI_OPTIONS.reset(token)


def has_checkpoint(output_dir: Path) -> bool:
    """Whether ``output_dir`` holds a checkpoint that finished writing (its ``trainer_state.json`` is written
    last); whether it also verifies is `zoo.training.run.checkpoints.resumable_checkpoint`'s question."""
    return any((output_dir / CHECKPOINTS_DIR).glob(f"{STEP_DIR_GLOB}/{TRAINER_STATE_NAME}"))


def go_on(output_dir: Path) -> str:
    """How a run in ``output_dir`` that stopped can go on: ``--resume`` when it has a checkpoint, else start
    over."""
    if has_checkpoint(output_dir):
        return f"then continue it from its last checkpoint ({option('resume')})"
    return f"then start it over ({option('overwrite')}): it saved no checkpoint to resume from"


def clear_run(output_dir: Path) -> None:
    """Delete what `previous_run` finds and the sinks' files (a link is removed, never its target)."""
    found = previous_run(output_dir)
    found += [name for name in SINK_NAMES if os.path.lexists(output_dir / name)]
    for name in found:
        path = output_dir / name.rstrip("/")
        with writing(path, hint="nothing else was deleted"):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)


# --- symbolic links ---------------------------------------------------------------------------------------


def check_no_links(output_dir: Path) -> None:
    """Refuse a symbolic link under any name the trainer writes in ``output_dir`` (the directory itself may
    be one: the run lives where it points)."""
    if not output_dir.is_dir():
        return
    names = [*RUN_NAMES, *SINK_NAMES, *MODEL_NAMES, RUN_LOCK_NAME]
    names += [p.name for p in output_dir.iterdir() if SHARD_PATTERN.fullmatch(p.name)]
    for name in names:
        if (output_dir / name).is_symlink():
            raise link_error(output_dir / name)


def link_error(path: Path) -> RunDirError:
    try:
        target = f" (to {os.readlink(path)})"
    except OSError:
        target = ""
    return RunDirError(
        f"{path} is a symbolic link{target}: the trainer never writes through a link, which would change the "
        "file it points to; remove the link (or put a plain file in its place), or choose another output dir"
    )


def open_no_link(path: Path, flags: int) -> int:
    """``os.open(path, flags | O_CREAT)`` (mode 0644), refusing a symbolic link at ``path``."""
    try:
        return os.open(path, flags | os.O_CREAT | _NOFOLLOW, 0o644)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise link_error(path) from None
        raise


# --- write errors -----------------------------------------------------------------------------------------


def write_error(path: Path | str, error: OSError, *, hint: str | None = None) -> RunWriteError:
    """One error naming ``path``, the cause, and how to go on."""
    full = error.errno in (errno.ENOSPC, errno.EDQUOT)
    reason = f"the disk is full ({error.strerror})" if full else error.strerror or str(error)
    remedy = "free some space" if full else "fix that"
    # The run's own files (metrics.jsonl, run.json, train_config.yaml) lie in its output dir.
    hint = hint or f"the run stopped; what it wrote before is intact: {remedy}, {go_on(Path(path).parent)}"
    return RunWriteError(f"could not write {path}: {reason}; {hint}", path=path, cause=error)


@contextlib.contextmanager
def writing(path: Path | str, *, hint: str | None = None) -> Iterator[None]:
    """An OSError inside (or safetensors' error, which is how its writer reports a full disk) becomes a
    `RunWriteError` naming ``path``; a `RunDirError` passes unchanged."""
    try:
        yield
    except RunDirError:
        raise
    except (OSError, SafetensorError) as error:
        cause = error if isinstance(error, OSError) else OSError(str(error))
        raise write_error(path, cause, hint=hint) from error
