"""Pictures of fixed tables: the attention masks of a padded batch, the sinusoidal positions, the lr schedule.

Each ``plot_*`` writes one PNG of a fixed size (stated in its docstring) and returns the path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zoo.viz.backend import new_figure, save

EXAMPLE_SOURCE_LENGTHS = (7, 4)  # a batch of two: the second source is padded by 3
EXAMPLE_TARGET_LENGTHS = (6, 3)  # and its target by 3


@dataclass
class MaskPanel:
    """One (Tq, Tk) boolean "may attend" mask of one example, with what made it."""

    title: str
    mask: Any  # (Tq, Tk) numpy bool
    query_real: int  # real (non-padding) query positions
    key_real: int


def example_masks(
    spec: Any,
    *,
    source_lengths: tuple[int, ...] = EXAMPLE_SOURCE_LENGTHS,
    target_lengths: tuple[int, ...] = EXAMPLE_TARGET_LENGTHS,
) -> list[list[MaskPanel]]:
    """The masks every stack of ``spec`` builds for a right-padded batch, per example: [example][panel].

    Made by `zoo.blocks.masks`, the only place masks are made: a causal stack reads the target batch
    (causal AND key padding), a bidirectional one the source batch (key padding); a stack with
    cross-attention also gets the source's key padding over the target queries.
    """
    import torch

    from zoo.blocks import masks

    def batch(lengths: tuple[int, ...]) -> torch.Tensor:  # (B, T) 1 = token
        return torch.tensor([[1] * n + [0] * (max(lengths) - n) for n in lengths])

    source, target = batch(source_lengths), batch(target_lengths)
    S, T = source.shape[1], target.shape[1]
    per_example: list[list[MaskPanel]] = [[] for _ in source_lengths]
    for name, stack in spec.stacks().items():
        user = target if stack.causal else source
        n = user.shape[1]
        mask, is_causal = masks.self_attention_mask(user, q_len=n, k_len=n, causal=stack.causal)
        if mask is None:  # nothing to hide: SDPA would get is_causal or no mask at all
            mask = (
                masks.causal_mask(n, n)[None, None] if is_causal else torch.ones(1, 1, n, n, dtype=torch.bool)
            )
        mask = mask.expand(len(source_lengths), 1, n, n)
        rule = "causal AND key padding" if stack.causal else "key padding"
        lengths = target_lengths if stack.causal else source_lengths
        for i, panels in enumerate(per_example):
            panels.append(
                MaskPanel(f"{name} self-attention\n{rule}", mask[i, 0].numpy(), lengths[i], lengths[i])
            )
        if stack.cross_attention is not None:
            cross = masks.cross_attention_mask(source)
            cross = torch.ones(1, 1, 1, S, dtype=torch.bool) if cross is None else cross
            cross = cross.expand(len(source_lengths), 1, T, S)
            for i, panels in enumerate(per_example):
                panels.append(
                    MaskPanel(
                        f"{name} cross-attention\nsource key padding",
                        cross[i, 0].numpy(),
                        target_lengths[i],
                        source_lengths[i],
                    )
                )
    return per_example


def plot_masks(panels: list[list[MaskPanel]], out: str | Path, *, title: str = "", dpi: int = 100) -> Path:
    """Rows = examples, columns = masks; 3.2 × 3.2 inches a panel plus 0.4 inches for the title
    (at dpi 100: 320 px per panel)."""
    rows, cols = len(panels), max(len(row) for row in panels)
    figure = new_figure(3.2 * cols, 3.2 * rows + 0.4, dpi=dpi)  # first: it checks matplotlib is there
    from matplotlib.colors import ListedColormap

    if title:
        figure.suptitle(title)
    axes = figure.subplots(rows, cols, squeeze=False)
    colors = ListedColormap(["#e8e8e8", "#2b6cb0"])  # hidden, may attend
    for r, row in enumerate(panels):
        for c in range(cols):
            ax = axes[r][c]
            if c >= len(row):
                ax.set_axis_off()
                continue
            panel = row[c]
            tq, tk = panel.mask.shape
            ax.imshow(panel.mask, cmap=colors, vmin=0, vmax=1, interpolation="nearest")
            ax.set_title(f"example {r}: {panel.title}", fontsize=8)
            ax.set_xticks(range(tk), [str(k) if k < panel.key_real else "pad" for k in range(tk)], fontsize=6)
            ax.set_yticks(
                range(tq), [str(q) if q < panel.query_real else "pad" for q in range(tq)], fontsize=6
            )
            ax.set_xlabel("key", fontsize=7)
            ax.set_ylabel("query", fontsize=7)
            ax.set_xticks([x - 0.5 for x in range(1, tk)], minor=True)
            ax.set_yticks([y - 0.5 for y in range(1, tq)], minor=True)
            ax.grid(which="minor", color="white", linewidth=1)
            ax.tick_params(which="minor", length=0)
    return save(figure, out)


def plot_positions(table: Any, out: str | Path, *, title: str = "", dpi: int = 100) -> Path:
    """A (positions, d_model) table as a heatmap with a colour bar; 9 × 5 inches (900 × 500 px at dpi 100)."""
    figure = new_figure(9, 5, dpi=dpi)
    ax = figure.subplots()
    image = ax.imshow(table, cmap="RdBu", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    ax.set_xlabel("dimension")
    ax.set_ylabel("position")
    ax.set_title(title or f"sinusoidal positions ({table.shape[0]} × {table.shape[1]})")
    figure.colorbar(image, ax=ax)
    return save(figure, out)


def schedule_curve(*, d_model: int, warmup: int, steps: int, scale: float = 1.0) -> list[float]:
    """The paper's learning rate at steps 1..steps (`zoo.training.schedules.noam`)."""
    from zoo.training.schedules import noam

    return [noam(step, d_model=d_model, warmup=warmup, scale=scale) for step in range(1, steps + 1)]


def plot_schedule(
    rates: list[float], out: str | Path, *, warmup: int, title: str = "", dpi: int = 100
) -> Path:
    """The lr against the step, the peak at ``warmup`` marked; 8 × 4.5 inches (800 × 450 px at dpi 100)."""
    figure = new_figure(8, 4.5, dpi=dpi)
    ax = figure.subplots()
    steps = range(1, len(rates) + 1)
    ax.plot(steps, rates, color="#2b6cb0")
    if warmup <= len(rates):
        peak = rates[warmup - 1]
        ax.axvline(warmup, color="grey", linestyle=":", linewidth=1)
        ax.annotate(
            f"peak {peak:.2e} at step {warmup}", (warmup, peak), textcoords="offset points", xytext=(8, -4)
        )
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    return save(figure, out)
