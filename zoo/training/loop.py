"""The training loop: `Trainer` (and `train`, its one-call form) runs a `TrainConfig` end to end.

    lock the output dir (`runlock`: one trainer at a time) -> refuse a previous run there unless overwrite /
    pick the newest checkpoint that verifies to resume from (`resume_point`; nothing is written yet)
    -> setup: the task (`zoo.training.tasks`) -> tokenizer(s) -> spec (vocab and special ids from the
       tokenizer) -> every split prepared and checked (raw files into the cache; memory-mapped, never loaded)
       -> the batches planned (every length checked); only then is the output dir cleared and written
    -> model (``lora``: + adapters, the init_from weights frozen)
    -> for each step: grad_accum micro-batches per process, loss summed over real target tokens and
       divided by the step's token count over every micro-batch and process -> (fp16: unscale) -> clip
       -> optimizer step (fp16: skipped when the gradients overflowed; `zoo.training.precision`)
    -> every log_every steps a record; every eval.every_steps validation; every checkpoint.every_steps a
       resumable checkpoint -> final validation, and the model + tokenizer saved to ``output_dir``

A fresh start that fails before training begins removes what it wrote (its tokenizers, its run files), so
the output dir holds no "previous run" that would refuse the corrected rerun.

Stopping early loses nothing (`zoo.training.stopping`): on SIGINT / SIGTERM the step under way finishes, a
checkpoint is saved and `TrainingInterrupted` raised; a loss that is no longer finite raises
`TrainingDiverged` at the next record, validation or save, and its weights are never saved.

Dividing by the whole step's token count makes one step the gradient of one big batch, whatever the
split into micro-batches and processes: 2 processes x 1 batch == 1 process x 2 accumulated batches. Each
forward's RNG (dropout) is seeded from its batch's place in the epoch, not from the process, so that holds
with dropout too, and a run resumes on another number of processes step for step when the batches per step
stay the same (`zoo.training.run.global_batch`: an unset grad_accum is derived, a mismatch refused).

The loop prints nothing itself. It reports through a `Reporter` (`zoo.training.report.reporting`): callbacks,
the progress bar among them, get a `TrainerState` snapshot on rank 0, and each record goes to
``metrics.jsonl`` and the chosen sinks after the callbacks have seen it. It saves and resumes through
`CheckpointIO` (`zoo.training.run.resume`), given the parts to save rather than the trainer. Warnings go to
the ``zoo.training`` logger.

A ``lora`` section trains `zoo.lora` adapters on the weights of ``model.init_from``, frozen: the optimizer
holds only the adapters, the state carries the trainable / total parameter counts (the CLI prints them;
``run.json`` records them), and the run saves ``adapter.safetensors`` beside the merged model.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from contextlib import AbstractContextManager, suppress
from pathlib import Path
from typing import Any

import numpy as np
import torch

import zoo.lora
from zoo.generation.weight_layout import row_major
from zoo.io.atomic import write_text_atomic
from zoo.io.names import TRAIN_CONFIG_NAME
from zoo.models.base import ZooModel
from zoo.models.build import build_model
from zoo.training import distributed as dist_
from zoo.training import pretrained, stopping
from zoo.training.batching import Batch, BatchOrder, plan_once
from zoo.training.config import ConfigError, TrainConfig
from zoo.training.evaluate import validate
from zoo.training.optim import build_optimizer, clip_gradients, set_learning_rate
from zoo.training.precision import LossScaling, resolve_precision
from zoo.training.precision import autocast as precision_autocast
from zoo.training.report.progress import ProgressBar, ProgressSetting
from zoo.training.report.records import Callback, TrainResult, check_callbacks, write_run_info
from zoo.training.report.reporting import Interval, Reporter, check_sinks
from zoo.training.report.sinks import MetricSink
from zoo.training.run import rundir, runlock
from zoo.training.run.checkpoints import read_trainer_state
from zoo.training.run.global_batch import resumed_grad_accum
from zoo.training.run.resume import CheckpointIO, is_own_checkpoint, resume_point, start_fresh
from zoo.training.run.state import TrainerState
from zoo.training.schedules import learning_rate
from zoo.training.setup import Prepared, setup
from zoo.training.tasks.base import Collate, Limits, Split, Units
from zoo.training.threads import resolve_threads

_FORWARD_STREAM = 1  # keeps the forward's seeds (`Trainer._forward_seed`) apart from other streams


class Trainer:
    """Set up everything a config describes (checking all data up front), then `fit`.

    ``callbacks``: `Callback` subclasses or any objects with some of its hooks. ``progress``: "auto" (a
    bar when stderr is a terminal), True, False, or a `ProgressBar` to draw elsewhere. ``sinks``: metric
    sinks besides the config's ``log_sinks`` — built-in names ("csv", "tensorboard") or objects with
    ``write(record)``.
    """

    def __init__(
        self,
        config: TrainConfig,
        *,
        callbacks: Iterable[Callback | Any] = (),
        progress: ProgressSetting | ProgressBar = "auto",
        sinks: Iterable[str | MetricSink] = (),
        resume: bool | str | Path = False,
        overwrite: bool = False,
    ) -> None:
        self.config = config
        callbacks = check_callbacks(callbacks)
        sinks = check_sinks(sinks, config_sinks=config.log_sinks)
        self.runtime = dist_.start_runtime(config.device)
        self._lock: runlock.RunLock | None = None
        self._wrote = False  # a fresh start has cleared the output dir and begun writing into it
        try:
            # Held until close(): a second trainer in this output dir fails at once, naming this process.
            self._lock = runlock.lock_run(config.output_dir, self.runtime)
            self._setup(resume, overwrite)
            self.reporter = Reporter(
                callbacks=callbacks,
                progress=progress,
                sinks=sinks,
                config_sinks=config.log_sinks,
                output_dir=self.output_dir,
                resume_step=self.step if self.resume_from is not None else None,
                is_main=self.runtime.is_main,
            )
        except BaseException:
            if self._wrote and self.runtime.is_main:
                # A start that failed is no run: what it wrote (the tokenizers, perhaps the run's files) would
                # only block its corrected rerun. Whatever was there before, it had refused or cleared.
                with suppress(OSError):
                    rundir.clear_run(config.output_dir)
            self._release()
            raise

    # --- setup ------------------------------------------------------------------------------------------

    def _setup(self, resume: bool | str | Path, overwrite: bool) -> None:
        """Everything before the first step, in order: the CPU threads, the checkpoint to resume from, the
        config resolved and the batches planned, the model, what a step uses, then the start (fresh or not)."""
        self._use_threads()
        self.output_dir = out = self.config.output_dir
        # Nothing in ``out`` changes until the run is accepted: checked here, then (fresh) cleared just
        # before the tokenizers are written, or (resumed) the checkpoint loaded before anything is written.
        self.resume_from = resume_point(out, resume, overwrite=overwrite)
        own = self.resume_from is not None and is_own_checkpoint(self.resume_from, out)
        if self.resume_from is not None:
            self._keep_global_batch(self.resume_from)
        init_from = self._resolve()
        self._build_model(init_from)
        self._build_step_parts(init_from)
        self._start(own)

    def _keep_global_batch(self, path: Path) -> None:
        """On another number of processes, the checkpoint's batches per step: ``batch.grad_accum`` set to
        keep them when the config leaves it unset, else refused unless it does (`run.global_batch`)."""
        batch = self.config.batch
        grad_accum = resumed_grad_accum(
            path,
            read_trainer_state(path),
            world_size=self.runtime.world_size,
            grad_accum=batch.grad_accum,
            given="grad_accum" in batch.model_fields_set,
        )
        if grad_accum != batch.grad_accum:
            self.config = self.config.override(**{"batch.grad_accum": grad_accum})

    def _use_threads(self) -> None:
        """How many CPU threads torch computes with (`zoo.training.threads`): half the CPUs on a CPU run,
        unless the config says."""
        threads = resolve_threads(self.config.num_threads, device_type=self.runtime.device.type)
        if threads is not None:
            torch.set_num_threads(threads)

    def _resolve(self) -> Path | None:
        """The config resolved by `setup` and the batches planned from it (`_take`); returns the folder of
        ``model.init_from``, if any. A fresh run's output dir is cleared only once this has succeeded."""
        planned = False

        def before_writing(resolved: Prepared | None) -> None:
            nonlocal planned
            if resolved is not None:  # rank 0: the batches planned (every length checked) before any write
                self._take(resolved)
                planned = True
            start_fresh(self.output_dir, self.runtime)
            self._wrote = True

        prepared = setup(
            self.config, resume_from=self.resume_from, runtime=self.runtime, before_writing=before_writing
        )
        if not planned:
            self._take(prepared)
        return prepared.init_from

    def _build_model(self, init_from: Path | None) -> None:
        """The model from the seed (with ``init_from``'s weights, LoRA's adapters), the task's objective on
        it, and the model as the run trains it: checkpointed, compiled, wrapped for the processes."""
        config, runtime = self.config, self.runtime
        torch.manual_seed(config.seed)  # the same initial weights on every process
        self.model: ZooModel = build_model(self.spec, device=runtime.device)
        # A resume loads its checkpoint, except a LoRA run's base: its checkpoints hold only the adapters.
        if init_from is not None and (self.resume_from is None or config.lora is not None):
            loaded = pretrained.load_weights(self.model, init_from)
            if config.lora is not None and loaded.new:
                raise ConfigError(
                    f"lora: the task adds head tensors to {init_from} ({', '.join(loaded.new[:4])}) "
                    "that LoRA would keep frozen at their random initialisation: start from a model that has "
                    "this head, or train without lora"
                )
        if config.lora is not None:  # base frozen; adapters trainable, B = 0 so the outputs are unchanged
            if config.lora.quantize_base is not None and runtime.distributed:
                raise ConfigError(
                    f"lora.quantize_base {config.lora.quantize_base} runs in one process for now ({runtime.world_size} "
                    "were started): DDP would broadcast the NF4 base; use quantize_base: null, or one process"
                )
            zoo.lora.apply(self.model, config.lora)
        self.task.started_from(init_from)  # contrastive reads the folder's pooling
        # What the task trains on (DPO's keeps a frozen reference: the starting weights, never checkpointed).
        self.objective = self.task.objective(
            self.spec,
            label_smoothing=config.loss.label_smoothing,
            model=self.model,
            starting_model=lambda: self._starting_model(init_from),
            chunk_tokens=self.task.chunk_tokens(config.loss.chunk_tokens, self.spec),
        )
        self.parameter_counts = zoo.lora.trainable_parameters(self.model)  # (trainable, total)
        if config.activation_checkpointing:
            dist_.checkpoint_activations(self.model)
        if config.compile:
            dist_.compile_layers(self.model)
        row_major(self.model)  # a model given in that decoded single rows (zoo.generation.weight_layout)
        self.wrapped = dist_.wrap_model(
            self.model,
            runtime,
            strategy=config.distributed.strategy,
            find_unused=self.task.has_unused_parameters(self.spec),  # e.g. BERT's pooler under MLM
        )

    def _build_step_parts(self, init_from: Path | None) -> None:
        """What a step uses beside the model: the optimizer, the precision (fp16: its loss scaling), the
        guard that stops a run early, and `CheckpointIO`, which saves and restores the run's parts."""
        config, runtime = self.config, self.runtime
        self.optimizer = build_optimizer(self.model, config.optim)
        self.precision = resolve_precision(config.precision, runtime.device)
        self.scaling = LossScaling(self.precision, runtime.device)  # fp16's loss scale; else a pass-through
        self.guard = stopping.Guard(
            runtime,
            output_dir=self.output_dir,
            skipping=self.scaling.enabled,
            max_skipped_steps=config.max_skipped_steps,
        )
        self.io = CheckpointIO(
            model=self.model,
            optimizer=self.optimizer,
            scaling=self.scaling,
            runtime=runtime,
            spec=self.spec,
            tokenizers=self.tokenizers,
            output_dir=self.output_dir,
            sharded=runtime.distributed and config.distributed.strategy == "fsdp",
            keep_last=config.checkpoint.keep_last,
            grad_accum=config.batch.grad_accum,
            lora=config.lora,
            base_id=str(init_from) if init_from is not None else None,
        )

    def _start(self, own: bool) -> None:
        """Step 0 of a fresh run, its run files written; or a resumed run where its checkpoint left off
        (``own``: one of this output dir's checkpoints, so the run continues rather than starts over)."""
        config, runtime = self.config, self.runtime
        if self.resume_from is None:
            self._write_run_files()
        self.step, self.elapsed_before = 0, 0.0
        self._saved: tuple[int, Path] | None = None  # the last checkpoint: (step, path)
        self.lr: float | None = None
        self.grad_norm: torch.Tensor | None = None  # on the device: read only when reported
        self._started = time.perf_counter()
        # Each forward is seeded from its batch (`_forward_seed`); this stream is what else draws meanwhile.
        torch.manual_seed(config.seed + 1 + runtime.rank)
        if self.resume_from is not None:
            saved = self.io.load(self.resume_from)  # weights, optimizer, loss scale and RNG restored in place
            self.step, self.elapsed_before = saved.step, saved.elapsed_s
            self.order.epoch, self.order.position = saved.epoch, saved.position
            self._saved = (self.step, self.resume_from) if own else None
            if not own:  # another run's checkpoint continues here: what the output dir held is overwritten
                start_fresh(self.output_dir, runtime)
            self._write_run_files()  # the resume is accepted: now the run's files may change

    def _starting_model(self, init_from: Path | None) -> ZooModel:
        """A new model holding the weights this run started from: ``model.init_from``'s, else the seed's
        initialisation (built again from the seed, the global RNG left as it was)."""
        device = self.runtime.device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(self.config.seed)
            model = build_model(self.spec, device=device)
        if init_from is not None:
            pretrained.load_weights(model, init_from)
        return model

    def _write_run_files(self) -> None:
        """``train_config.yaml`` and ``run.json`` (rank 0)."""
        out = self.output_dir
        if self.runtime.is_main:
            with rundir.writing(out / TRAIN_CONFIG_NAME):
                write_text_atomic(out / TRAIN_CONFIG_NAME, self.config.to_yaml())
            write_run_info(
                out,
                task=self.task.name,
                label_smoothing=self.label_smoothing,
                objective=self.objective,
                parameters=self.parameter_counts,
                lora=self.config.lora,
                init_from=self.config.model.init_from,
            )

    def _take(self, prepared: Prepared) -> None:
        """What `setup` resolved, and the batches planned from it."""
        self.task, self.spec, self.tokenizers = prepared.task, prepared.spec, prepared.tokenizers
        self.train_split, self.valid_split = prepared.train, prepared.valid
        self._plan_batches(prepared.limits)

    def _plan_batches(self, limits: Limits) -> None:
        """Units (examples or packed windows) and their lengths from each split, the batch order, and
        the task's collators; nothing here reads a token."""
        config, batch, task = self.config, self.config.batch, self.task

        def units_and_collator(split: Split) -> tuple[Units, Collate]:
            units = task.units(split, tokenizers=self.tokenizers, limits=limits)
            collate = task.collator(split, units, spec=self.spec, tokenizers=self.tokenizers, limits=limits)
            return units, collate

        train_units, self.collate = units_and_collator(self.train_split)
        self.order = BatchOrder(
            train_units.lengths,
            max_tokens=batch.max_tokens,
            max_sentences=batch.max_sentences,
            group=batch.grad_accum * self.runtime.world_size,  # batches per step, over all processes
            seed=config.seed,
            shuffle=batch.shuffle,
            describe=train_units.describe,
        )
        self.valid_plan: list[np.ndarray] = []
        self.collate_valid: Collate | None = None
        if self.valid_split is not None:
            valid_units, self.collate_valid = units_and_collator(self.valid_split)
            self.valid_plan = plan_once(
                valid_units.lengths,
                max_tokens=batch.max_tokens,
                max_sentences=batch.max_sentences,
                describe=valid_units.describe,
            )
        self.steps_per_epoch = self.order.steps_per_epoch
        by_epochs = config.epochs * self.steps_per_epoch if config.epochs else math.inf
        self.total_steps = int(min(config.max_steps or math.inf, by_epochs))

    # --- the loop -------------------------------------------------------------------------------------------

    @property
    def label_smoothing(self) -> float:
        return self.task.label_smoothing(self.config.loss.label_smoothing)

    def autocast(self) -> AbstractContextManager:
        """The run's autocast (``precision``, resolved for the device: `zoo.training.precision`)."""
        return precision_autocast(self.precision, self.runtime.device)

    def fit(self) -> TrainResult:
        """Train to ``total_steps`` (resuming where a checkpoint left off), validate, save; returns the result."""
        try:
            return self._fit()
        finally:  # also on an exception: a live bar left running would garble the terminal
            self.reporter.stop()

    def _fit(self) -> TrainResult:
        self.reporter.notify("on_train_start", self.state)
        self.wrapped.train()
        self._started = time.perf_counter()
        self.interval = Interval(self.runtime.device)
        checkpoint_every = self.config.checkpoint.every_steps
        eval_every = self.config.eval.every_steps
        with self.guard.signals():  # SIGINT / SIGTERM: finish the step, keep a checkpoint, stop
            while self.step < self.total_steps:
                self._stop_if_signalled()
                loss = self._train_step(*self._next_batches())
                self.step += 1
                self.guard.after_step(self.step, loss, self.grad_norm)  # on the device: no sync
                if self.step % self.config.log_every == 0 or self.step == self.total_steps:
                    self._log()
                    self._check_finite()
                if eval_every and self.step % eval_every == 0 and self.step < self.total_steps:
                    with self.interval.paused():
                        self.evaluate()
                if checkpoint_every and (self.step % checkpoint_every == 0 or self.step == self.total_steps):
                    with self.interval.paused():
                        self.save_checkpoint()
            # Still listening: a signal during the final validation keeps the finished steps (a resume
            # validates and saves them), and the final save is never cut short by the first signal.
            self._stop_if_signalled()
            final = self.evaluate() if self.valid_split is not None else {}
            self._stop_if_signalled()
            self._check_finite(weights=True)  # never a final model that is not finite
            self.io.save_final()
            if self.runtime.is_main:
                self.task.save_final(self.output_dir, self.tokenizers)  # a sentence-transformers folder
        self.model.eval()  # handed back ready for inference, as zoo.load returns models
        result = TrainResult(
            model=self.model,
            tokenizer=self.tokenizers.text,
            source_tokenizer=self.tokenizers.source,
            output_dir=self.output_dir,
            step=self.step,
            final=final,
        )
        self.reporter.notify("on_train_end", self.state, result)
        return result

    def _stop_if_signalled(self) -> None:
        """After a SIGINT / SIGTERM (on any process: every one agrees), keep a checkpoint of the last
        complete step (unless it was just saved) and raise `TrainingInterrupted`; a second signal meanwhile
        stops at once."""
        signum = self.guard.interrupted()
        if signum is None:
            return
        self._check_finite(weights=True)
        path = self._saved[1] if self._saved is not None and self._saved[0] == self.step else None
        raise stopping.TrainingInterrupted(signum, step=self.step, checkpoint=path or self.save_checkpoint())

    def _check_finite(self, *, weights: bool = False) -> None:
        """`TrainingDiverged` if a loss went non-finite (one host sync); ``weights``: the weights too."""
        self.guard.check(
            step=self.step, model=self.model if weights else None, loss_scale=self.scaling.loss_scale
        )

    def _next_batches(self) -> tuple[list[Batch], list[int]]:
        """This process's micro-batches for the next step (only these are read and collated), and their
        indices in the epoch's order."""
        mine = self.order.next_group()[self.runtime.rank :: self.runtime.world_size]
        return [self.collate(units, generator=self._batch_rng(i)) for i, units in mine], [i for i, _ in mine]

    def _batch_rng(self, batch_index: int) -> torch.Generator:
        # What a collator draws (MLM's masks) is a function of (seed, epoch, batch): a resumed run draws
        # exactly as a straight one.
        return torch.Generator().manual_seed(
            self.config.seed * 1_000_003 + self.order.epoch * 10_007 + batch_index
        )

    def _forward_seed(self, batch_index: int) -> int:
        """The global RNG's seed for batch ``batch_index``'s forward and backward (dropout): a function of
        (seed, epoch, batch), so a batch draws the same masks on whichever process, after whichever resume
        (`zoo.training.run.global_batch`); a stream apart from the collator's (`_batch_rng`)."""
        entropy = (self.config.seed, self.order.epoch, batch_index, _FORWARD_STREAM)
        return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0])

    def _train_step(self, batches: list[Batch], indices: list[int] | None = None) -> torch.Tensor:
        """One optimizer step on this process's ``batches``; returns its summed loss (on the device).
        ``indices``: the batches' places in the epoch's order, which seed each forward's RNG (None: the
        global RNG runs on, as a bench timing bare steps leaves it)."""
        # GRPO samples its completions here, each batch from its own seed (the same after a resume)
        batches = [self.objective.rollout(b, device=self.runtime.device) for b in batches]
        counts = [self.objective.count(b) for b in batches]  # target tokens, or DPO's pairs
        local = sum(counts)
        (step_count,) = dist_.all_reduce_sum([float(local)], self.runtime)
        # Each process's loss is scaled by world_size because DDP / FSDP average (not sum) the gradients.
        scale = self.runtime.world_size / max(step_count, 1.0)
        lr = learning_rate(
            self.config.schedule, self.step + 1, d_model=self.spec.d_model, total_steps=self.total_steps
        )
        set_learning_rate(self.optimizer, lr)
        self.lr = lr
        step_loss = torch.zeros((), device=self.runtime.device)
        for k, batch in enumerate(batches):
            last = k == len(batches) - 1
            if indices is not None:
                torch.manual_seed(self._forward_seed(indices[k]))
            with dist_.no_gradient_sync(self.wrapped, enabled=self.runtime.distributed and not last):
                sums = self.objective(
                    self.wrapped, batch, device=self.runtime.device, autocast=self.autocast(), train=True
                )
                objective = sums.loss * scale
                if sums.aux_loss is not None:  # MoE: + coef x load-balancing loss, weighted like the units
                    objective = (
                        objective + self.config.loss.router_aux_coef * sums.aux_loss * counts[k] * scale
                    )
                    self.interval.add_aux(sums.aux_loss, counts[k])
                self.scaling.scale(objective).backward()  # fp16: times the loss scale
            self.interval.loss_sum += sums.loss.detach()  # on the device: no host sync per micro-batch
            self.interval.add_metrics(sums.metrics)
            self.interval.input_tokens += batch.num_tokens
            step_loss = step_loss + sums.loss.detach()
        self.interval.target_tokens += local
        self.scaling.unscale(self.optimizer)  # fp16: the clip and the reported norm see true gradients
        self.grad_norm = clip_gradients(self.model, self.config.optim.clip_grad_norm)
        self.scaling.step(self.optimizer, self.grad_norm)  # fp16: skipped if the gradients overflowed
        self.optimizer.zero_grad(set_to_none=True)
        return step_loss

    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self._started

    def _log(self) -> None:
        # fp16 runs add loss_scale and skipped_steps (since the last record) after the standard keys.
        record = self._record(**self.interval.measure(self.runtime), lr=self.lr, **self.scaling.measure())
        self.reporter.report("on_log", self.state, record)

    def evaluate(self) -> dict[str, Any]:
        """Validation loss (and perplexity, or DPO's rewards: the task's objective), and the task's scores
        (seq2seq's BLEU, classification's accuracy) now; recorded and returned (on every process)."""
        if self.valid_split is None or self.collate_valid is None:
            return {}
        collate = self.collate_valid
        # A fixed generator per batch: MLM validation masks the same way every time, and the global RNG
        # (dropout) is left untouched, so validating never changes what training does next.
        batches = (
            collate(units, generator=torch.Generator().manual_seed(i))
            for i, units in enumerate(self.valid_plan)
        )
        metric = self.task.metric(self.spec)  # accuracy for classification
        values = validate(
            self.objective,
            self.model,
            batches,
            device=self.runtime.device,
            autocast=self.autocast(),
            metric=metric,
        )
        scores: dict[str, Any] = {"val_bleu": None, **(metric.compute() if metric is not None else {})}
        scores |= self.task.scores(
            self.model,
            self.valid_split,
            tokenizers=self.tokenizers,
            autocast=self.autocast(),
        )
        self.wrapped.train()
        record = self._record(**values, **scores)
        self.reporter.report("on_eval", self.state, record)
        return record

    def save_checkpoint(self) -> Path:
        """A resumable checkpoint of this step (every process must call it; rank 0 writes). Refused with
        `TrainingDiverged` when the loss or the weights are no longer finite."""
        self._check_finite(weights=True)
        state = self.state
        path = self.io.save_checkpoint(state)
        self._saved = (state.step, path)
        self.reporter.notify("on_checkpoint", state, path)
        return path

    @property
    def state(self) -> TrainerState:
        """Where the run stands now, as a value (what callbacks receive; its progress is what a checkpoint
        saves)."""
        return TrainerState(
            step=self.step,
            epoch=self.order.epoch,
            position=self.order.position,
            elapsed_s=self.elapsed(),
            total_steps=self.total_steps,
            steps_per_epoch=self.steps_per_epoch,
            lr=self.lr,
            grad_norm=float(self.grad_norm) if self.grad_norm is not None else None,
            output_dir=self.output_dir,
            trainable_parameters=self.parameter_counts[0],
            total_parameters=self.parameter_counts[1],
            lora=self.config.lora,
        )

    @property
    def progress(self) -> ProgressBar | None:
        """The bar this trainer draws itself (None: none, or one passed among the callbacks)."""
        return self.reporter.bar

    def log_metrics(self, **values: Any) -> None:
        """Add custom metrics (``grad_norm=2.3, my_metric=0.9``) to the records.

        Inside a callback's ``on_log`` / ``on_eval`` they join the record being reported (written after
        every callback has seen it); anywhere else they join the next record. Values are numbers, strings,
        None, or 1-element tensors; the standard keys (`METRIC_KEYS`) and fp16's ``loss_scale`` and
        ``skipped_steps`` are the trainer's to measure. (A callback adds keys to the record it is given
        instead: ``record["name"] = value``.)
        """
        self.reporter.log_metrics(**values)

    def _record(self, **values: Any) -> dict[str, Any]:
        return self.reporter.record(self.step, self.elapsed(), **values)

    def close(self) -> None:
        """Close the sinks, unlock the output dir and leave the process group if this trainer started it."""
        self.reporter.stop()
        self._release()

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()
        dist_.stop_runtime(self.runtime)


def train(
    config: TrainConfig | str | Path,
    *,
    callbacks: Iterable[Callback | Any] = (),
    progress: ProgressSetting | ProgressBar = "auto",
    sinks: Iterable[str | MetricSink] = (),
    resume: bool | str | Path = False,
    overwrite: bool = False,
) -> TrainResult:
    """Run a training config (a `TrainConfig` or a YAML path) end to end; see `Trainer`."""
    if not isinstance(config, TrainConfig):
        config = TrainConfig.from_yaml(config)
    trainer = Trainer(
        config, callbacks=callbacks, progress=progress, sinks=sinks, resume=resume, overwrite=overwrite
    )
    try:
        return trainer.fit()
    finally:
        trainer.close()
