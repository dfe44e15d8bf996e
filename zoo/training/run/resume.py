"""Saving and restoring a run from its parts: resumable checkpoints, the final model, exact resume.

`CheckpointIO` is given the parts it saves and restores — model, optimizer, fp16's loss scaling, runtime,
spec, tokenizers, output directory — and a `TrainerState` for the progress; it never sees a trainer. (There
is no scheduler to save: the learning rate is a function of the step.) Full (unsharded) state dicts are
gathered through ``torch.distributed.checkpoint.state_dict``, which handles a plain model, DDP and FSDP2
alike, so a checkpoint written by 2 sharded processes loads into 1 process and back. Every process calls
these methods (gathering is collective); rank 0 writes.

A LoRA run (``lora``: the model has `zoo.lora` adapters on a frozen base loaded from ``model.init_from``)
saves the adapters (``adapter.safetensors``, `zoo.lora.save`) beside the usual files, whose weights are the
merged model (merged, copied, unmerged exactly), so a checkpoint and the final folder load, translate and
export like any model. Resuming rebuilds the base from ``init_from`` and loads only the adapters and the
optimizer: the base's fingerprint must still be the one the adapters were trained on.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

import zoo
import zoo.lora
from zoo.io.jsonfile import read_json_object
from zoo.io.names import ADAPTER_NAME, OPTIMIZER_NAME, SPEC_NAME, WEIGHTS_NAME
from zoo.lora.nf4 import dense
from zoo.spec import LoraSpec, ModelSpec
from zoo.training import distributed as dist_
from zoo.training.precision import LossScaling
from zoo.training.run import checkpoints, rundir
from zoo.training.run.global_batch import resumed_grad_accum
from zoo.training.run.state import TrainerState, rng_state, set_rng_state
from zoo.training.setup import Tokenizers, save_tokenizers

log = logging.getLogger(__name__)

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


class CheckpointIO:
    """Checkpoints of one run. ``scaling``: fp16's loss scale, saved and restored with the optimizer (None
    or a disabled one: nothing to save); ``sharded``: the model is FSDP-sharded over the processes;
    ``keep_last``: how many checkpoints to keep; ``grad_accum`` is recorded with the process count, and a
    resume must take as many batches a step (`zoo.training.run.global_batch`). ``lora``: the model carries these adapters (see the module docstring); ``base_id``: where its base
    came from (``model.init_from`` as given), recorded in the adapter files."""

    def __init__(
        self,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scaling: LossScaling | None = None,
        runtime: dist_.Runtime,
        spec: ModelSpec,
        tokenizers: Tokenizers,
        output_dir: Path,
        sharded: bool = False,
        keep_last: int = 2,
        grad_accum: int = 1,
        lora: LoraSpec | None = None,
        base_id: str | None = None,
    ) -> None:
        self.model, self.optimizer, self.runtime = model, optimizer, runtime
        self.scaling = scaling if scaling is not None and scaling.enabled else None
        self.spec, self.tokenizers, self.output_dir = spec, tokenizers, output_dir
        self.sharded, self.keep_last, self.grad_accum = sharded, keep_last, grad_accum
        self.lora, self.base_id = lora, base_id
        if lora is not None and sharded:  # TrainConfig refuses lora with fsdp: this is a programming error
            raise ValueError("CheckpointIO: LoRA adapters on a sharded (FSDP) model are not supported")

    def _saveable_model(self) -> torch.nn.Module | None:
        """A model zoo.save can write (rank 0; None elsewhere). Sharded weights are gathered into a copy;
        a LoRA model's are merged into one."""
        if self.lora is not None:
            return self._merged_copy() if self.runtime.is_main else None
        if not self.sharded:
            return self.model if self.runtime.is_main else None
        full = get_model_state_dict(self.model, options=_FULL)  # collective; the tensors land on rank 0
        if not self.runtime.is_main:
            return None
        from zoo.models.build import build_model

        copy = build_model(self.spec, device="cpu", init=False)
        copy.load_state_dict(full)
        return copy

    @torch.no_grad()
    def _merged_copy(self) -> torch.nn.Module:
        """A plain zoo model (on the CPU) holding the base weights with the adapters folded in; the trained
        model is merged only while its weights are copied, then unmerged bit for bit."""
        from zoo.models.build import build_model

        adapters = zoo.lora.adapter_state(self.model)
        zoo.lora.merge(self.model, keep_original=True)
        try:
            # QLoRA: merged weights are dense; the unadapted NF4 projections are dequantised here.
            state = self.model.state_dict()
            weights = {k: dense(v) for k, v in state.items() if k not in adapters}
            copy = build_model(self.spec, device="cpu", init=False)
            copy.load_state_dict(weights)
        finally:
            zoo.lora.unmerge(self.model)
        return copy

    def _save_model(self, model: torch.nn.Module | None, directory: Path) -> None:
        zoo.save(model, directory, tokenizer=self.tokenizers.text)
        save_tokenizers(self.tokenizers, directory)
        if self.lora is not None:
            zoo.lora.save(self.model, directory / ADAPTER_NAME, base_id=self.base_id)

    def save_checkpoint(self, state: TrainerState) -> Path:
        """A resumable checkpoint of ``state`` (its ``rng``: this process's streams, captured now if None)."""
        model = self._saveable_model()
        optimizer_state = get_optimizer_state_dict(self.model, self.optimizer, options=_FULL)
        rng = state.rng if state.rng is not None else rng_state(self.runtime.device)
        rng_states = dist_.gather_objects(rng, self.runtime)
        # The same on every process (the scaler's decisions follow the global gradient), so rank 0's is saved.
        scaler_state = {"grad_scaler": self.scaling.state_dict()} if self.scaling is not None else {}
        path = checkpoints.checkpoint_dir(self.output_dir, state.step)
        if self.runtime.is_main:
            provenance = {
                "world_size": self.runtime.world_size,
                "grad_accum": self.grad_accum,
                "zoo_version": zoo.__version__,
            } | ({"lora": self.lora.model_dump(mode="json")} if self.lora is not None else {})
            if self.tokenizers.text is None:  # a task that reads no text (images): no tokenizer to expect
                provenance["tokenizer"] = False
            checkpoints.write_checkpoint(
                path,
                save_model=lambda directory: self._save_model(model, directory),
                optimizer_state=optimizer_state,
                rng_states=rng_states,
                trainer_state=state.progress() | provenance | scaler_state,
            )
            checkpoints.prune_checkpoints(self.output_dir, self.keep_last)
        dist_.barrier(self.runtime)
        return path

    def save_final(self) -> None:
        """The trained model and its tokenizer(s) in ``output_dir``, ready for ``zoo.load``."""
        model = self._saveable_model()
        if self.runtime.is_main:
            hint = "the trained model was not saved: free some space (or fix the cause), "
            hint += rundir.go_on(self.output_dir)
            with rundir.writing(self.output_dir / WEIGHTS_NAME, hint=hint):
                self._save_model(model, self.output_dir)
        dist_.barrier(self.runtime)

    def load(self, path: Path) -> TrainerState:
        """Restore the weights, optimizer, loss scale (fp16) and this process's RNG from checkpoint ``path``
        (every process); returns the saved progress (step, epoch, position, elapsed_s, rng) for the caller to
        continue from."""
        saved = checkpoints.read_trainer_state(path)
        # The same batches per step on any number of processes, or refused (the Trainer has set grad_accum).
        resumed_grad_accum(path, saved, world_size=self.runtime.world_size, grad_accum=self.grad_accum)
        self._check_spec(path)
        self._check_lora(path, saved)
        if self.lora is not None:
            self._load_adapters(path)  # the frozen base is init_from's, loaded when the model was built
        else:
            weights = zoo.load(path).state_dict()
            set_model_state_dict(self.model, weights, options=StateDictOptions(full_state_dict=True))
        optimizer_state = checkpoints.unflatten_optimizer_state(path / OPTIMIZER_NAME)
        # Not strict: a parameter the loss never reached (BERT's pooler under an MLM head) has no optimizer
        # state yet, in the checkpoint as in a straight run; the spec was checked to be the same above.
        set_optimizer_state_dict(
            self.model,
            self.optimizer,
            optimizer_state,
            options=StateDictOptions(full_state_dict=True, strict=False),
        )
        self._load_scaler(path, saved)
        # A checkpoint of more processes holds more RNG states than there are ranks now, of fewer, none for
        # the new ranks: what they draw in training (dropout) is seeded per batch, not from these streams.
        rng = checkpoints.read_rng_state(path, self.runtime.rank)
        if rng is not None:
            set_rng_state(rng, self.runtime.device)
        dist_.barrier(self.runtime)
        return TrainerState.from_progress(saved, rng=rng, output_dir=self.output_dir)

    def _load_scaler(self, path: Path, saved: dict[str, Any]) -> None:
        if self.scaling is None:
            return  # not fp16 now: a saved scale (the run was fp16 before) has nothing to scale
        if "grad_scaler" not in saved:
            log.warning(
                "%s holds no loss scale (it was not written by an fp16 run): the loss scale starts over at %g",
                path, self.scaling.loss_scale,
            )  # fmt: skip
            return
        self.scaling.load_state_dict(saved["grad_scaler"])  # checked by read_trainer_state

    def _check_lora(self, path: Path, saved: dict[str, Any]) -> None:
        """A LoRA run resumes only from its own kind of checkpoint, with the same adapters."""
        saved_lora = saved.get("lora")
        if saved_lora is None and self.lora is not None:
            raise checkpoints.ResumeError(
                f"{path}: the checkpoint is of a full fine-tune, but this config trains LoRA adapters (lora); "
                "resume without the lora section, or start over"
            )
        if saved_lora is not None and self.lora is None:
            raise checkpoints.ResumeError(
                f"{path}: the checkpoint holds LoRA adapters (lora: {saved_lora}), but this config has no lora "
                "section; add the same one to resume"
            )
        if saved_lora is not None and self.lora is not None:
            current = self.lora.model_dump(mode="json")
            changed = sorted(
                k for k in saved_lora.keys() | current.keys() if saved_lora.get(k) != current.get(k)
            )
            if changed:
                raise checkpoints.ResumeError(
                    f"{path}: the checkpoint's lora section differs from this config's in: {', '.join(changed)}"
                )

    @torch.no_grad()
    def _load_adapters(self, path: Path) -> None:
        """Copy the checkpoint's adapter tensors into the model's adapters, once its base is checked to be
        the one they were trained on (`zoo.lora.base_fingerprint`)."""
        file = path / ADAPTER_NAME
        info = zoo.lora.read_adapter(file)
        modules = zoo.lora.adapter_modules(self.model)
        fingerprint = zoo.lora.base_fingerprint(zoo.lora.base_weights(modules))
        if fingerprint != info.fingerprint:
            raise checkpoints.ResumeError(
                f"{file}: the adapters were trained on another base (fingerprint {info.fingerprint[:12]}; "
                f"{info.base_id or 'model.init_from'} now gives {fingerprint[:12]}): resume with the base the "
                "run started from"
            )
        saved, ours = load_file(str(file)), zoo.lora.adapter_state(self.model)
        if saved.keys() != ours.keys() or any(saved[k].shape != ours[k].shape for k in ours):
            raise checkpoints.ResumeError(f"{file}: the adapter tensors do not fit this model's adapters")
        for name, tensor in ours.items():
            tensor.copy_(saved[name])

    def _check_spec(self, path: Path) -> None:
        saved = read_json_object(path / SPEC_NAME, error=checkpoints.ResumeError)
        current = self.spec.model_dump(mode="json")
        if saved != current:
            changed = sorted(k for k in saved.keys() | current.keys() if saved.get(k) != current.get(k))
            raise checkpoints.ResumeError(
                f"{path}: the checkpoint's model spec differs from this config's in: {', '.join(changed)}"
            )


def resume_point(output_dir: Path, resume: bool | str | Path, *, overwrite: bool) -> Path | None:
    """The checkpoint to resume from (verified), or None for a fresh run. Writes nothing: a fresh run
    refuses a previous run, a model or tokenizers in ``output_dir`` unless ``overwrite`` (`start_fresh`
    then clears them, once the config has been checked), and a symbolic link there is always refused."""
    rundir.check_no_links(output_dir)
    if resume is True:
        return checkpoints.resumable_checkpoint(output_dir)
    if resume:
        path = Path(resume)
        problem = checkpoints.checkpoint_problem(path)
        if problem is not None:
            raise checkpoints.ResumeError(f"{path}: cannot resume from this checkpoint: {problem}")
        if is_own_checkpoint(path, output_dir):
            return path  # the run continues
    found = rundir.previous_run(output_dir)
    if found and not overwrite:
        raise rundir.previous_run_error(output_dir, found)
    return Path(resume) if resume else None


def is_own_checkpoint(path: Path, output_dir: Path) -> bool:
    """``path`` is one of ``output_dir``'s checkpoints (resuming from it continues that run)."""
    return path.resolve().is_relative_to(output_dir.resolve())


def start_fresh(output_dir: Path, runtime: dist_.Runtime) -> None:
    """Clear a previous run being overwritten (rank 0; what `rundir.previous_run` finds, nothing else)."""
    if runtime.is_main:
        rundir.clear_run(output_dir)
    dist_.barrier(runtime)
