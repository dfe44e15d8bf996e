"""Training curves from a run's metrics log: ``runs/x/metrics.jsonl``, one JSON object a line.

Each line has a ``step`` and any of ``loss``, ``lr``, ``val_loss``, ``val_bleu``, ``tokens_per_s``, plus
any custom metrics the run logged (``grad_norm``, ...), which get a panel each below the standard four.
The reader is tolerant: lines without a step, blank lines and a half-written last line (a run still going)
are skipped and counted, missing keys leave gaps, and non-numeric values are ignored.

The two losses are different quantities and the legend says so: training ``loss`` is the objective,
label smoothing included, and ``val_loss`` is plain NLL. The smoothing comes from the run's ``run.json``
(written beside the log since it existed); without one the training curve is just "train loss". A run
whose losses are not token NLL names them there (``loss_name``: a DPO run's curves are "(DPO)").
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zoo.io.jsonfile import read_json
from zoo.io.names import METRICS_NAME, RUN_INFO_NAME
from zoo.viz.backend import new_figure, save

# Every record's keys (zoo.training.report.records.METRIC_KEYS, spelled out so plotting never imports the
# training stack); any other numeric key is a custom metric.
STANDARD_KEYS = ("step", "loss", "lr", "tokens_per_s", "val_loss", "val_ppl", "val_bleu", "elapsed_s")
PANELS = (
    ("loss", ("loss", "val_loss")),
    ("learning rate", ("lr",)),
    ("validation BLEU", ("val_bleu",)),
    ("throughput (tokens/s)", ("tokens_per_s",)),
)
# The third panel is the run's validation score: BLEU for a translation run, perplexity for a language model
# (which has no BLEU); a run with neither (DPO, classification) gives the slot to its own metrics.
VALIDATION_PANELS = (("validation BLEU", ("val_bleu",)), ("validation perplexity", ("val_ppl",)))


@dataclass
class Metrics:
    """Series by key: ``series["loss"] == [(step, value), ...]``; ``skipped`` lines that were unusable;
    ``run`` the run's ``run.json`` (empty when there is none)."""

    source: Path
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    skipped: int = 0
    run: dict[str, Any] = field(default_factory=dict)

    @property
    def extra_keys(self) -> list[str]:
        """Custom metrics: numeric series outside the standard keys, in the order the log names them."""
        return [key for key in self.series if key not in STANDARD_KEYS]


def metrics_path(run: str | Path) -> Path:
    """``run`` itself when it is a file, else ``run/metrics.jsonl``."""
    path = Path(run).expanduser()
    file = path / METRICS_NAME if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(
            f"{file}: no metrics log (a training run writes {METRICS_NAME} in its folder)"
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
            record = json.loads(line)  # not the bounded reader: a metric log records a NaN loss as NaN
            step = float(record["step"])
        except (ValueError, KeyError, TypeError, RecursionError):
            metrics.skipped += 1
            continue
        for key, value in record.items():
            if key != "step" and _is_number(value):
                metrics.series.setdefault(key, []).append((step, float(value)))
    metrics.run = _read_run_info(file.parent / RUN_INFO_NAME)
    return metrics


def _read_run_info(path: Path) -> dict[str, Any]:
    try:
        info = read_json(path)
    except (OSError, ValueError):  # no run.json (an older run, a copied log) or an unreadable one
        return {}
    return info if isinstance(info, dict) else {}


def curve_label(key: str, run: dict[str, Any]) -> str:
    """The legend entry of a series: the losses say what they measure; other keys are their names."""
    name = run.get("loss_name")  # a loss other than token NLL (DPO's), named by run.json
    if key in ("loss", "val_loss") and isinstance(name, str) and name:
        return f"{'train' if key == 'loss' else 'validation'} loss ({name})"
    if key == "val_loss":
        return "validation loss (NLL)"
    if key == "loss":
        eps = run.get("loss_label_smoothing")
        if not _is_number(eps):
            return "train loss"
        return f"train loss (label-smoothed, ε={eps:g})" if eps else "train loss (NLL)"
    return key


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def training_figure(metrics: Metrics, *, title: str = "", dpi: int = 100) -> Any:
    """The figure `plot_training` writes: a 2 × 2 grid — loss (train and validation), lr, the validation
    score (BLEU, or perplexity for a language model), tokens/s — 10 × 7 inches, then the custom metrics, two
    panels (3.5 inches) a row. A run with no validation score puts its custom metrics in that slot; a loss,
    lr or throughput panel without data says so."""
    extras = metrics.extra_keys
    if not any(metrics.series.get(key) for _, keys in PANELS for key in keys):
        known = ", ".join(key for _, keys in PANELS for key in keys)
        raise ValueError(f"{metrics.source}: no {known} values to plot")
    scored = [panel for panel in VALIDATION_PANELS if metrics.series.get(panel[1][0])][:1]
    standard = [PANELS[0], PANELS[1], *scored, PANELS[3]]
    panels = [*standard, *((key, (key,)) for key in extras)]
    rows = max(2, math.ceil(len(panels) / 2))
    figure = new_figure(10, 3.5 * rows, dpi=dpi)
    figure.suptitle(title or f"training run {metrics.source.parent.name}")
    axes = list(figure.subplots(rows, 2).flat)
    for ax, (name, keys) in zip(axes, panels):
        drawn = False
        for key in keys:
            points = metrics.series.get(key, [])
            if points:
                steps, values = zip(*points)
                marker = "o" if key.startswith("val_") else None
                ax.plot(steps, values, marker=marker, markersize=3, label=curve_label(key, metrics.run))
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
    for ax in axes[len(panels) :]:  # the empty half of a last row of custom metrics
        ax.set_visible(False)
    return figure


def plot_training(metrics: Metrics, out: str | Path, *, title: str = "", dpi: int = 100) -> Path:
    """`training_figure` written as a PNG (1000 × 700 px at dpi 100 without custom metrics)."""
    return save(training_figure(metrics, title=title, dpi=dpi), out)
