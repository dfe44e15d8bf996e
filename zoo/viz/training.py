"""Training curves from a run's metrics log: ``runs/x/metrics.jsonl``, one JSON object a line.

Each line has a ``step`` and any of ``loss``, ``lr``, ``val_loss``, ``val_bleu``, ``tokens_per_s``. The
reader is tolerant: lines without a step, blank lines and a half-written last line (a run still going)
are skipped and counted, missing keys leave gaps, and unknown keys are ignored.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zoo.viz.backend import new_figure, save

METRICS_FILE = "metrics.jsonl"
PANELS = (
    ("loss", ("loss", "val_loss")),
    ("learning rate", ("lr",)),
    ("validation BLEU", ("val_bleu",)),
    ("throughput (tokens/s)", ("tokens_per_s",)),
)


@dataclass
class Metrics:
    """Series by key: ``series["loss"] == [(step, value), ...]``; ``skipped`` lines that were unusable."""

    source: Path
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    skipped: int = 0


def metrics_path(run: str | Path) -> Path:
    """``run`` itself when it is a file, else ``run/metrics.jsonl``."""
    path = Path(run).expanduser()
    file = path / METRICS_FILE if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(
            f"{file}: no metrics log (a training run writes {METRICS_FILE} in its folder)"
        )
    return file


def read_metrics(run: str | Path) -> Metrics:
    """Every numeric series in a run's metrics log, keyed by name, in file order."""
    file = metrics_path(run)
    metrics = Metrics(file)
    for line in file.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            step = float(record["step"])
        except (ValueError, KeyError, TypeError):
            metrics.skipped += 1
            continue
        for key, value in record.items():
            if key != "step" and _is_number(value):
                metrics.series.setdefault(key, []).append((step, float(value)))
    return metrics


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def plot_training(metrics: Metrics, out: str | Path, *, title: str = "", dpi: int = 100) -> Path:
    """A 2 × 2 grid: loss (train and validation), lr, validation BLEU, tokens/s; 10 × 7 inches
    (1000 × 700 px at dpi 100). A panel without data says so."""
    if not any(metrics.series.get(key) for _, keys in PANELS for key in keys):
        known = ", ".join(key for _, keys in PANELS for key in keys)
        raise ValueError(f"{metrics.source}: no {known} values to plot")
    figure = new_figure(10, 7, dpi=dpi)
    figure.suptitle(title or f"training run {metrics.source.parent.name}")
    for ax, (name, keys) in zip(figure.subplots(2, 2).flat, PANELS):
        drawn = False
        for key in keys:
            points = metrics.series.get(key, [])
            if points:
                steps, values = zip(*points)
                marker = "o" if key.startswith("val_") else None
                ax.plot(steps, values, marker=marker, markersize=3, label=key)
                drawn = True
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if drawn and len(keys) > 1:
            ax.legend()
        if not drawn:
            ax.text(
                0.5,
                0.5,
                f"no {' / '.join(keys)} in the log",
                ha="center",
                va="center",
                transform=ax.transAxes,
            )
    return save(figure, out)
