"""Saving and restoring a `Trainer`: resumable checkpoints, the final model, exact resume.

Full (unsharded) state dicts are gathered through ``torch.distributed.checkpoint.state_dict``, which
handles a plain model, DDP and FSDP2 alike, so a checkpoint written by 2 sharded processes loads into 1
process and back. Every process calls these methods (gathering is collective); rank 0 writes.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

import zoo
from zoo.training import distributed as dist_
from zoo.training import prepare, state
from zoo.training.records import METRICS_NAME, truncate_records

if TYPE_CHECKING:
    from zoo.training.loop import Trainer

log = logging.getLogger(__name__)

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


class CheckpointIO:
    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.sharded = trainer.runtime.distributed and trainer.config.distributed.strategy == "fsdp"

    def _saveable_model(self) -> torch.nn.Module | None:
        """A model zoo.save can write (rank 0; None elsewhere). Sharded weights are gathered into a copy."""
        t = self.trainer
        if not self.sharded:
            return t.model if t.runtime.is_main else None
        full = get_model_state_dict(t.model, options=_FULL)  # collective; the tensors land on rank 0
        if not t.runtime.is_main:
            return None
        from zoo.models.build import build_model

        copy = build_model(t.spec, device="cpu", init=False)
        copy.load_state_dict(full)
        return copy

    def save_checkpoint(self) -> Path:
        t = self.trainer
        model = self._saveable_model()
        optimizer_state = get_optimizer_state_dict(t.model, t.optimizer, options=_FULL)
        rng = dist_.gather_objects(state.rng_state(t.runtime.device), t.runtime)
        path = state.checkpoint_dir(t.output_dir, t.step)
        if t.runtime.is_main:
            trainer_state = {
                "step": t.step,
                "epoch": t.order.epoch,
                "position": t.order.position,
                "elapsed_s": t.elapsed(),
                "world_size": t.runtime.world_size,
                "grad_accum": t.config.batch.grad_accum,
                "zoo_version": zoo.__version__,
            }

            def save_model(directory: Path) -> None:
                zoo.save(model, directory, tokenizer=t.tokenizers.target)
                prepare.save_tokenizers(t.tokenizers, directory)

            state.write_checkpoint(
                path,
                save_model=save_model,
                optimizer_state=optimizer_state,
                rng_states=rng,
                trainer_state=trainer_state,
            )
            state.prune_checkpoints(t.output_dir, t.config.checkpoint.keep_last)
        dist_.barrier(t.runtime)
        return path

    def save_final(self) -> None:
        """The trained model and its tokenizer(s) in ``output_dir``, ready for ``zoo.load``."""
        t = self.trainer
        model = self._saveable_model()
        if t.runtime.is_main:
            zoo.save(model, t.output_dir, tokenizer=t.tokenizers.target)
            prepare.save_tokenizers(t.tokenizers, t.output_dir)
        dist_.barrier(t.runtime)

    def load(self, path: Path) -> None:
        """Restore weights, optimizer, data position and RNG from checkpoint ``path`` (every process)."""
        t = self.trainer
        saved = state.read_trainer_state(path)
        saved_spec = json.loads((path / "spec.json").read_text(encoding="utf-8"))
        current = t.spec.model_dump(mode="json")
        if saved_spec != current:
            changed = sorted(
                k for k in saved_spec.keys() | current.keys() if saved_spec.get(k) != current.get(k)
            )
            raise state.ResumeError(
                f"{path}: the checkpoint's model spec differs from this config's in: {', '.join(changed)}"
            )
        weights = zoo.load(path).state_dict()
        set_model_state_dict(t.model, weights, options=StateDictOptions(full_state_dict=True))
        optimizer_state = state.unflatten_optimizer_state(path / state.OPTIMIZER_NAME)
        set_optimizer_state_dict(
            t.model, t.optimizer, optimizer_state, options=StateDictOptions(full_state_dict=True)
        )
        t.step, t.order.epoch, t.order.position = saved["step"], saved["epoch"], saved["position"]
        t.elapsed_before = float(saved["elapsed_s"])
        rng = state.read_rng_state(path, t.runtime.rank)
        if saved["world_size"] != t.runtime.world_size or saved["grad_accum"] != t.config.batch.grad_accum:
            log.warning(
                "%s was written by %d process(es) with grad_accum %d; now %d and %d: training continues, "
                "but not step for step as the original run would have",
                path, saved["world_size"], saved["grad_accum"], t.runtime.world_size, t.config.batch.grad_accum,
            )  # fmt: skip
        if rng is not None:
            state.set_rng_state(rng, t.runtime.device)
        if t.runtime.is_main:
            truncate_records(t.output_dir, after=t.step)
        dist_.barrier(t.runtime)


def resume_point(
    output_dir: Path, resume: bool | str | Path, *, overwrite: bool, runtime: dist_.Runtime
) -> Path | None:
    """The checkpoint to resume from, or None for a fresh run (clearing a previous one if ``overwrite``)."""
    if resume is True:
        found = state.latest_checkpoint(output_dir)
        if found is None:
            raise state.ResumeError(f"{output_dir}: no complete checkpoint to resume from")
        return found
    if resume:
        return Path(resume)
    previous = (output_dir / METRICS_NAME).exists() or state.latest_checkpoint(output_dir) is not None
    if previous and not overwrite:
        raise FileExistsError(
            f"{output_dir} already holds a training run; resume it (--resume) or start over (--overwrite)"
        )
    if previous and runtime.is_main:
        shutil.rmtree(output_dir / state.CHECKPOINTS_DIR, ignore_errors=True)
        (output_dir / METRICS_NAME).unlink(missing_ok=True)
    dist_.barrier(runtime)
    return None
