"""Where a trainer's news goes: callbacks and the progress bar see each event, then the sinks write records.

    trainer event -> Reporter.notify(hook, state, ...)        the bar, then each callback (rank 0 only)
    a record      -> Reporter.report(hook, state, record)     the same, then settle_record -> every sink

Callbacks get a `TrainerState` snapshot, never the trainer. They may add keys to the record they are shown
(``record["grad_norm"] = state.grad_norm``); it is written after every callback has seen it, so the keys
reach ``metrics.jsonl`` and every sink. Code that holds the trainer adds metrics with
``trainer.log_metrics(...)``, which lands here too: in the record being reported when called from a hook,
else in the next record.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from zoo.training import distributed as dist_
from zoo.training.report.progress import ProgressBar, ProgressSetting, progress_bar
from zoo.training.report.records import TRAINER_KEYS, check_custom_metrics, make_record, settle_record
from zoo.training.report.sinks import MetricSink, check_sink_names, open_sink, truncate_records
from zoo.training.run.state import TrainerState


def check_sinks(sinks: Iterable[str | MetricSink], *, config_sinks: Iterable[str]) -> list[str | MetricSink]:
    """The sinks as a list, failing before any work for a bad name, a missing package or a non-sink."""
    sinks = list(sinks)
    # Before any work: a missing tensorboard should not surface after the data is read.
    check_sink_names([*config_sinks, *(s for s in sinks if isinstance(s, str))])
    for sink in sinks:
        if not isinstance(sink, str) and not callable(getattr(sink, "write", None)):
            raise TypeError(f"sink {sink!r} is neither a sink name nor an object with write(record)")
    return sinks


class Reporter:
    """The callbacks, the bar and the sinks of one run. Everything shows and writes on rank 0 only.

    ``callbacks`` have passed `check_callbacks`; ``sinks`` have passed `check_sinks`. ``resume_step``: the step of the checkpoint a run resumes from (records past it are dropped from the
    logs, which then continue), None for a fresh run.
    """

    def __init__(
        self,
        *,
        callbacks: Iterable[Any],
        progress: ProgressSetting | ProgressBar,
        sinks: list[str | MetricSink],
        config_sinks: Iterable[str],
        output_dir: Path,
        resume_step: int | None,
        is_main: bool,
    ) -> None:
        self.callbacks = list(callbacks)
        self.is_main = is_main
        given_bar = any(isinstance(c, ProgressBar) for c in self.callbacks)
        # "auto" stands down when a bar came in as a callback (as older code passes one): never two bars.
        self.bar = progress_bar(progress, is_main=is_main and not given_bar)
        self._pending: dict[str, Any] = {}  # log_metrics values waiting for the next record
        self._reporting: dict[str, Any] | None = None  # the record callbacks are looking at now
        self.sinks: list[MetricSink] = []
        if not is_main:
            return
        if resume_step is not None:
            truncate_records(output_dir, after=resume_step)  # the steps about to be redone
        names = dict.fromkeys(["jsonl", *config_sinks, *(s for s in sinks if isinstance(s, str))])
        for name in names:  # metrics.jsonl always (resume and `zoo plot training` read it), once each
            self.sinks.append(open_sink(name, output_dir, resume_step=resume_step))
        self.sinks += [sink for sink in sinks if not isinstance(sink, str)]

    def notify(self, hook: str, state: TrainerState, *args: Any) -> None:
        """Call ``hook(state, *args)`` on the bar and every callback that has it (duck typing)."""
        if self.is_main:
            for callback in [self.bar, *self.callbacks]:
                method = getattr(callback, hook, None)
                if method is not None:
                    method(state, *args)

    def record(self, step: int, elapsed_s: float, **values: Any) -> dict[str, Any]:
        """A new record: the standard values given, then the metrics logged since the last record."""
        record = make_record(step, elapsed_s, **values, **self._pending)
        self._pending = {}
        return record

    def report(self, hook: str, state: TrainerState, record: dict[str, Any]) -> None:
        """Show ``record`` to the callbacks (which may add keys to it), then write it to every sink."""
        standard = {key: record[key] for key in TRAINER_KEYS if key in record}  # fp16's keys when present
        self._reporting = record
        try:
            self.notify(hook, state, record)
        finally:
            self._reporting = None
        settle_record(record, standard)
        if self.is_main:
            for sink in self.sinks:
                sink.write(record)

    def log_metrics(self, **values: Any) -> None:
        """Custom metrics: into the record being reported, or the next one (see `Trainer.log_metrics`)."""
        plain = check_custom_metrics(values)
        (self._reporting if self._reporting is not None else self._pending).update(plain)

    def stop(self) -> None:
        """Stop the bar(s) and close the sinks (a later record reopens them)."""
        for bar in [self.bar, *self.callbacks]:
            if isinstance(bar, ProgressBar):
                bar.close()
        for sink in self.sinks:
            close = getattr(sink, "close", None)  # optional: `MetricSink` needs only ``write``
            if callable(close):
                close()


class Interval:
    """The training loss and throughput since the last record. The loss is summed on the device and read
    only when a record is made; time spent validating or checkpointing (`paused`) does not count."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.reset()

    def reset(self) -> None:
        self.loss_sum = torch.zeros((), device=self.device)  # the objective summed over target tokens
        self.aux_sum: torch.Tensor | None = None  # MoE: load-balancing loss x target tokens, summed
        self.metric_sums: dict[str, torch.Tensor] = {}  # the objective's metrics (DPO's rewards), summed
        self.target_tokens, self.input_tokens = 0, 0
        self.start, self.paused_s = time.perf_counter(), 0.0

    @contextmanager
    def paused(self) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.paused_s += time.perf_counter() - start

    def measure(self, runtime: dist_.Runtime) -> dict[str, float]:
        """``loss`` per target token (per the objective's unit: DPO's pairs) and ``tokens_per_s`` (inputs)
        over every process, then the objective's metrics as means per unit, and for a Mixture-of-Experts
        model ``aux_loss`` (its load-balancing loss, a token-weighted mean, not in ``loss``); starts a new
        interval."""
        aux, names = self.aux_sum, list(self.metric_sums)
        interval = [float(self.loss_sum), float(self.target_tokens), float(self.input_tokens)]
        interval += [float(self.metric_sums[name]) for name in names]
        loss_sum, tokens, inputs, *rest = dist_.all_reduce_sum(
            interval + ([float(aux)] if aux is not None else []), runtime
        )
        seconds = max(time.perf_counter() - self.start - self.paused_s, 1e-9)
        self.reset()
        record = {"loss": loss_sum / max(tokens, 1.0), "tokens_per_s": inputs / seconds}
        record |= {name: value / max(tokens, 1.0) for name, value in zip(names, rest)}
        aux_sum = rest[len(names) :]
        return record | ({"aux_loss": aux_sum[0] / max(tokens, 1.0)} if aux_sum else {})

    def add_metrics(self, sums: dict[str, torch.Tensor]) -> None:
        """Count one micro-batch's metric sums (no host sync)."""
        for name, value in sums.items():
            value = value.detach().float()
            self.metric_sums[name] = value if name not in self.metric_sums else self.metric_sums[name] + value

    def add_aux(self, aux_loss: torch.Tensor, tokens: int) -> None:
        """Count one micro-batch's load-balancing loss, weighted by its ``tokens`` targets (no host sync)."""
        weighted = aux_loss.detach().float() * tokens
        self.aux_sum = weighted if self.aux_sum is None else self.aux_sum + weighted
