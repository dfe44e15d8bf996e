"""Plots (matplotlib, the ``viz`` extra: ``pip install matplotlib``), written as PNG files.

    zoo.viz.plot_attention(zoo.viz.attention_maps(model, tokenizer, "나는 학생이다"), "attention.png")
    zoo.viz.plot_masks(zoo.viz.example_masks(zoo.preset("transformer-tiny")), "masks.png")
    zoo.viz.plot_positions(sinusoidal_table(50, 128).numpy(), "positions.png")
    zoo.viz.plot_schedule(zoo.viz.schedule_curve(d_model=512, warmup=4000, steps=20000), "lr.png", warmup=4000)
    zoo.viz.plot_training(zoo.viz.read_metrics("runs/x"), "runs/x/training.png")

Importing this package needs neither matplotlib nor torch; each function imports what it draws with, and
a missing matplotlib raises `VizDependencyError` naming the extra. No global matplotlib state is touched.
"""

from zoo.viz.attention import AttentionMap, attention_maps, panel_inches, plot_attention
from zoo.viz.backend import MissingFontWarning, VizDependencyError, find_cjk_font
from zoo.viz.tables import MaskPanel, example_masks, plot_masks, plot_positions, plot_schedule, schedule_curve
from zoo.viz.training import Metrics, plot_training, read_metrics

__all__ = [
    "AttentionMap",
    "MaskPanel",
    "Metrics",
    "MissingFontWarning",
    "VizDependencyError",
    "attention_maps",
    "example_masks",
    "find_cjk_font",
    "panel_inches",
    "plot_attention",
    "plot_masks",
    "plot_positions",
    "plot_schedule",
    "plot_training",
    "read_metrics",
    "schedule_curve",
]
