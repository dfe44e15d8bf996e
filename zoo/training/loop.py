"""The training loop: `Trainer` (and `train`, its one-call form) runs a `TrainConfig` end to end.

    read + check all data -> tokenizer(s) -> spec (vocab and special ids from the tokenizer) -> model
    -> for each step: grad_accum micro-batches per process, loss summed over real target tokens and divided
       by the step's token count over every micro-batch and process -> clip -> optimizer step
    -> every log_every steps a record; every eval.every_steps validation; every checkpoint.every_steps a
       resumable checkpoint -> final validation, and the model + tokenizer saved to ``output_dir``

Dividing by the whole step's token count makes one step the gradient of one big batch, whatever the
split into micro-batches and processes: 2 processes x 1 batch == 1 process x 2 accumulated batches.

The loop prints nothing itself. It reports through callbacks (called on rank 0 only: `Callback`
subclasses or any object with some of its hooks), writes each record to ``metrics.jsonl`` and the chosen
sinks (`zoo.training.sinks`) after the callbacks have seen it, and draws a progress bar only through
`zoo.training.progress` (``progress="auto"``: when stderr is a terminal). Warnings go to the
``zoo.training`` logger.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch

from zoo.models.base import ZooModel
from zoo.models.build import build_model
from zoo.training import distributed as dist_
from zoo.training import prepare
from zoo.training.batching import Batch, BatchOrder, Collator, plan_batches
from zoo.training.config import TrainConfig
from zoo.training.evaluate import bleu, validation_loss
from zoo.training.losses import IGNORE_INDEX, label_smoothed_cross_entropy
from zoo.training.optim import build_optimizer, clip_gradients, set_learning_rate
from zoo.training.progress import ProgressBar, ProgressSetting, progress_bar
from zoo.training.records import (
    METRIC_KEYS,
    Callback,
    TrainResult,
    check_callbacks,
    make_record,
    metric_value,
    write_run_info,
)
from zoo.training.resume import CheckpointIO, resume_point
from zoo.training.schedules import learning_rate
from zoo.training.sinks import MetricSink, check_sink_names, open_sink

CONFIG_NAME = "train_config.yaml"


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
        self.callbacks = check_callbacks(callbacks)
        sinks = list(sinks)
        # Before any work: a missing tensorboard should not surface after the data is read.
        check_sink_names([*config.log_sinks, *(s for s in sinks if isinstance(s, str))])
        for sink in sinks:
            if not isinstance(sink, str) and not callable(getattr(sink, "write", None)):
                raise TypeError(f"sink {sink!r} is neither a sink name nor an object with write(record)")
        self._pending: dict[str, Any] = {}  # log_metrics values waiting for the next record
        self._reporting: dict[str, Any] | None = None  # the record callbacks are looking at now
        self.runtime = dist_.start_runtime(config.device)
        try:
            self._setup(resume, overwrite)
            self._setup_reporting(progress, sinks)
        except BaseException:
            dist_.stop_runtime(self.runtime)
            raise

    # --- setup ------------------------------------------------------------------------------------------

    def _setup(self, resume: bool | str | Path, overwrite: bool) -> None:
        config, runtime = self.config, self.runtime
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        self.output_dir = out = config.output_dir
        self.resume_from = resume_from = resume_point(out, resume, overwrite=overwrite, runtime=runtime)
        spec = prepare.base_spec(config)
        self.task = prepare.resolve_task(config, spec)
        train_text, self.valid_text = prepare.read_splits(config, task=self.task)

        self.tokenizers = prepare.shared_tokenizers(
            config,
            train_text,
            task=self.task,
            output_dir=out,
            resumed=resume_from is not None,
            runtime=runtime,
        )
        if runtime.is_main:
            (out / CONFIG_NAME).write_text(config.to_yaml(), encoding="utf-8")
        self.spec = prepare.wire_spec(spec, self.tokenizers, config, task=self.task)
        limit = prepare.max_length(config, self.spec)
        self.train_data = prepare.encode_split(
            train_text, self.tokenizers, config, task=self.task, limit=limit
        )
        self.valid_data = (
            prepare.encode_split(self.valid_text, self.tokenizers, config, task=self.task, limit=limit)
            if self.valid_text is not None
            else None
        )
        self._plan_batches()

        torch.manual_seed(config.seed)  # the same initial weights on every process
        self.model: ZooModel = build_model(self.spec, device=runtime.device)
        if config.activation_checkpointing:
            dist_.checkpoint_activations(self.model)
        if config.compile:
            dist_.compile_layers(self.model)
        self.wrapped = dist_.wrap_model(
            self.model,
            runtime,
            strategy=config.distributed.strategy,
            find_unused=self.task == "masked_lm",  # BERT's pooler computes outputs no MLM loss reads
        )
        self.optimizer = build_optimizer(self.model, config.optim)
        self.io = CheckpointIO(self)
        self.step = 0
        self.elapsed_before = 0.0
        self._started = time.perf_counter()
        torch.manual_seed(config.seed + 1 + runtime.rank)  # dropout: a different stream per process
        if resume_from is not None:
            self.io.load(resume_from)
        if runtime.is_main:
            write_run_info(out, task=self.task, label_smoothing=self.label_smoothing)

    def _setup_reporting(
        self, progress: ProgressSetting | ProgressBar, sinks: list[str | MetricSink]
    ) -> None:
        """The bar and the sinks, on rank 0 only (elsewhere nothing draws or writes)."""
        given_bar = any(isinstance(c, ProgressBar) for c in self.callbacks)
        # "auto" stands down when a bar came in as a callback (as older code passes one): never two bars.
        self.progress = progress_bar(progress, is_main=self.runtime.is_main and not given_bar)
        self.sinks: list[MetricSink] = []
        if not self.runtime.is_main:
            return
        resume_step = self.step if self.resume_from is not None else None
        names = dict.fromkeys(["jsonl", *self.config.log_sinks, *(s for s in sinks if isinstance(s, str))])
        for name in names:  # metrics.jsonl always (resume and `zoo plot training` read it), once each
            self.sinks.append(open_sink(name, self.output_dir, resume_step=resume_step))
        self.sinks += [sink for sink in sinks if not isinstance(sink, str)]

    def _plan_batches(self) -> None:
        config, batch = self.config, self.config.batch
        self.plan = plan_batches(
            self.train_data, max_tokens=batch.max_tokens, max_sentences=batch.max_sentences, seed=config.seed
        )
        self.valid_plan = (
            plan_batches(self.valid_data, max_tokens=batch.max_tokens, max_sentences=batch.max_sentences)
            if self.valid_data is not None
            else []
        )
        self.order = BatchOrder(
            len(self.plan),
            group=batch.grad_accum * self.runtime.world_size,  # batches per step, over all processes
            seed=config.seed,
            shuffle=batch.shuffle,
        )
        self.steps_per_epoch = self.order.steps_per_epoch
        by_epochs = config.epochs * self.steps_per_epoch if config.epochs else math.inf
        self.total_steps = int(min(config.max_steps or math.inf, by_epochs))
        special = tuple(i for i in self.tokenizers.target.special_ids().values() if i is not None)

        def collator(data: Any) -> Collator:
            return Collator(
                data,
                task=self.task,
                pad_id=self.spec.pad_token_id,
                start_id=getattr(self.spec, "start_token_id", None),
                mask_id=self.tokenizers.target.mask_id,
                special_ids=special,
                vocab_size=self.spec.vocab_size,
                mlm_probability=config.loss.mlm_probability,
            )

        self.collate = collator(self.train_data)
        self.collate_valid = collator(self.valid_data) if self.valid_data is not None else None

    # --- the loop -------------------------------------------------------------------------------------------

    @property
    def label_smoothing(self) -> float:
        eps = self.config.loss.label_smoothing
        return eps if eps is not None else (0.1 if self.task == "seq2seq" else 0.0)

    def autocast(self) -> AbstractContextManager:
        precision, device = self.config.precision, self.runtime.device
        if precision == "auto":
            bf16_ok = device.type == "cuda" and torch.cuda.is_bf16_supported()
            precision = "bf16" if bf16_ok else "fp32"
        if precision == "fp32":
            return nullcontext()
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)

    def fit(self) -> TrainResult:
        """Train to ``total_steps`` (resuming where a checkpoint left off), validate, save; returns the result."""
        try:
            return self._fit()
        finally:  # also on an exception: a live bar left running would garble the terminal
            self._stop_reporting()

    def _fit(self) -> TrainResult:
        self._notify("on_train_start", self)
        self.wrapped.train()
        self._started = time.perf_counter()
        self._reset_interval()
        checkpoint_every = self.config.checkpoint.every_steps
        eval_every = self.config.eval.every_steps
        while self.step < self.total_steps:
            self._train_step(self._next_batches())
            self.step += 1
            if self.step % self.config.log_every == 0 or self.step == self.total_steps:
                self._log()
            if eval_every and self.step % eval_every == 0 and self.step < self.total_steps:
                self._paused(self.evaluate)
            if checkpoint_every and (self.step % checkpoint_every == 0 or self.step == self.total_steps):
                self._paused(self.save_checkpoint)
        final = self.evaluate() if self.valid_data is not None else {}
        self.io.save_final()
        self.model.eval()  # handed back ready for inference, as zoo.load returns models
        result = TrainResult(
            model=self.model,
            tokenizer=self.tokenizers.target,
            source_tokenizer=self.tokenizers.source,
            output_dir=self.output_dir,
            step=self.step,
            final=final,
        )
        self._notify("on_train_end", self, result)
        return result

    def _next_batches(self) -> list[Batch]:
        """This process's micro-batches for the next step."""
        mine = self.order.next_group()[self.runtime.rank :: self.runtime.world_size]
        return [self.collate(self.plan[i], generator=self._masking_rng(i)) for i in mine]

    def _masking_rng(self, batch_index: int) -> torch.Generator | None:
        # MLM masks are a function of (seed, epoch, batch): a resumed run masks exactly as a straight one.
        if self.task != "masked_lm":
            return None
        return torch.Generator().manual_seed(
            self.config.seed * 1_000_003 + self.order.epoch * 10_007 + batch_index
        )

    def _train_step(self, batches: list[Batch]) -> None:
        local = sum(int((b.targets != IGNORE_INDEX).sum()) for b in batches)
        (step_tokens,) = dist_.all_reduce_sum([float(local)], self.runtime)
        # Each process's loss is scaled by world_size because DDP / FSDP average (not sum) the gradients.
        scale = self.runtime.world_size / max(step_tokens, 1.0)
        lr = learning_rate(
            self.config.schedule, self.step + 1, d_model=self.spec.d_model, total_steps=self.total_steps
        )
        set_learning_rate(self.optimizer, lr)
        self.lr = lr
        for k, batch in enumerate(batches):
            # The head runs only where a target is (skipping padding, and MLM's ~85% unscored positions).
            scored = batch.targets != IGNORE_INDEX  # (B, T), on the CPU: selecting needs no device sync
            targets = batch.targets[scored].to(self.runtime.device, non_blocking=True)  # (N,)
            batch = batch.to(self.runtime.device)
            last = k == len(batches) - 1
            with dist_.no_gradient_sync(self.wrapped, enabled=self.runtime.distributed and not last):
                with self.autocast():
                    logits = self.wrapped(**batch.inputs, logits_mask=scored).logits  # (N, V)
                sums = label_smoothed_cross_entropy(logits, targets, label_smoothing=self.label_smoothing)
                (sums.loss * scale).backward()
            # Summed on the device and read at log time: no host sync per micro-batch.
            self._loss_sum += sums.loss.detach()
            self._input_tokens += batch.num_tokens
        self._target_tokens += local
        self.grad_norm = clip_gradients(self.model, self.config.optim.clip_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _reset_interval(self) -> None:
        # Since the last record: objective summed over target tokens, target tokens, input tokens.
        self._loss_sum = torch.zeros((), device=self.runtime.device)
        self._target_tokens, self._input_tokens = 0, 0
        self._interval_start = time.perf_counter()
        self._interval_paused = 0.0

    def _paused(self, action: Any) -> None:
        """Run ``action`` (validation, checkpoint) without counting its time against throughput."""
        start = time.perf_counter()
        action()
        self._interval_paused += time.perf_counter() - start

    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self._started

    def _log(self) -> None:
        interval = [float(self._loss_sum), float(self._target_tokens), float(self._input_tokens)]
        loss_sum, tokens, inputs = dist_.all_reduce_sum(interval, self.runtime)
        seconds = max(time.perf_counter() - self._interval_start - self._interval_paused, 1e-9)
        record = self._record(loss=loss_sum / max(tokens, 1.0), lr=self.lr, tokens_per_s=inputs / seconds)
        self._reset_interval()
        self._report("on_log", record)

    def evaluate(self) -> dict[str, Any]:
        """Validation loss, perplexity and (seq2seq) BLEU now; recorded and returned (on every process)."""
        if self.valid_data is None or self.collate_valid is None:
            return {}
        # A fixed generator per batch: MLM validation masks the same way every time, and the global RNG
        # (dropout) is left untouched, so validating never changes what training does next.
        batches = (
            self.collate_valid(indices, generator=torch.Generator().manual_seed(i))
            for i, indices in enumerate(self.valid_plan)
        )
        val_loss, val_ppl = validation_loss(
            self.model, batches, device=self.runtime.device, autocast=self.autocast()
        )
        val_bleu = None
        if self.task == "seq2seq" and self.config.eval.bleu:
            pairs = list(zip(self.valid_text.sources, self.valid_text.targets))  # type: ignore[union-attr]
            pairs = pairs[: self.config.eval.bleu_samples]
            with self.autocast():
                val_bleu = bleu(
                    self.model,
                    pairs,
                    source_tokenizer=self.tokenizers.for_source,
                    target_tokenizer=self.tokenizers.target,
                    num_beams=self.config.eval.num_beams,
                    max_new_tokens=self.config.eval.max_new_tokens,
                    metric=self.config.eval.bleu_metric,
                )
        self.wrapped.train()
        record = self._record(val_loss=val_loss, val_ppl=val_ppl, val_bleu=val_bleu)
        self._report("on_eval", record)
        return record

    def save_checkpoint(self) -> Path:
        """A resumable checkpoint of this step (every process must call it; rank 0 writes)."""
        path = self.io.save_checkpoint()
        self._notify("on_checkpoint", self, path)
        return path

    def log_metrics(self, **values: Any) -> None:
        """Add custom metrics (``grad_norm=2.3, my_metric=0.9``) to the records.

        Inside a callback's ``on_log`` / ``on_eval`` they join the record being reported (written after
        every callback has seen it); anywhere else they join the next record. Values are numbers, strings,
        None, or 1-element tensors; the standard keys (`METRIC_KEYS`) are the trainer's to measure.
        """
        taken = sorted(set(values) & set(METRIC_KEYS))
        if taken:
            raise ValueError(f"{', '.join(taken)}: standard metric(s) the trainer measures; use another name")
        plain = {key: metric_value(key, value) for key, value in values.items()}
        (self._reporting if self._reporting is not None else self._pending).update(plain)

    def _record(self, **values: Any) -> dict[str, Any]:
        record = make_record(self.step, self.elapsed(), **values, **self._pending)
        self._pending = {}
        return record

    def _report(self, hook: str, record: dict[str, Any]) -> None:
        """Show ``record`` to the callbacks (which may add to it through log_metrics), then write it."""
        self._reporting = record
        try:
            self._notify(hook, self, record)
        finally:
            self._reporting = None
        if self.runtime.is_main:
            for sink in self.sinks:
                sink.write(record)

    def _notify(self, hook: str, *args: Any) -> None:
        if self.runtime.is_main:
            for callback in [self.progress, *self.callbacks]:
                method = getattr(callback, hook, None)  # duck typing: any subset of the hooks
                if method is not None:
                    method(*args)

    def _stop_reporting(self) -> None:
        """Stop the bar(s) and close the sinks (a later record reopens them)."""
        for bar in [self.progress, *self.callbacks]:
            if isinstance(bar, ProgressBar):
                bar.close()
        for sink in self.sinks:
            if callable(getattr(sink, "close", None)):
                sink.close()

    def close(self) -> None:
        """Close the sinks and leave the process group if this trainer started it."""
        self._stop_reporting()
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
