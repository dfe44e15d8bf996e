"""Attention heatmaps: every layer and head of a model on one sentence (pair), tokens on the axes.

    maps = attention_maps(model, tokenizer, "나는 학생이다", target="I am a student")
    plot_attention(maps, "attention.png")

An encoder-decoder gives three kinds of maps (encoder self-, decoder self- and cross-attention), a decoder
or an encoder one. Rows of the figure are (kind, layer), columns are heads; each panel is a (Tq, Tk) map,
queries down, keys across. Decoder rows are the decoder *inputs*: the start token, then the target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zoo.viz.backend import fonts_for, new_figure, save


@dataclass
class AttentionMap:
    """One kind of attention over one example: per layer an (H, Tq, Tk) array of weights."""

    title: str
    layers: list[Any]  # per layer (H, Tq, Tk), numpy
    queries: list[str]
    keys: list[str]


def attention_maps(
    model: Any, tokenizer: Any, source: str, *, target: str | None = None, max_new_tokens: int = 32
) -> list[AttentionMap]:
    """Run ``model`` on ``source`` (and ``target``) with ``output_attentions=True`` and collect the maps.

    An encoder-decoder without ``target`` decodes one greedily (``model.generate``) and is then run
    teacher-forced on what it produced. A decoder-only model reads ``source`` (plus ``target``) as one text.
    """
    import torch

    device = next(model.parameters()).device
    tokens = tokenizer.encode(source, add_eos=True)
    if not tokens:
        raise ValueError("the source sentence gave no tokens")
    ids = torch.tensor([tokens], device=device)  # (1, S)
    was_training = model.training
    model.eval()  # no dropout on the weights we draw
    try:
        return _collect(model, tokenizer, ids, source, target, max_new_tokens)
    finally:
        model.train(was_training)


def _collect(
    model: Any, tokenizer: Any, ids: Any, source: str, target: str | None, max_new_tokens: int
) -> list[AttentionMap]:
    import torch

    spec, device = model.spec, ids.device
    with torch.no_grad():
        if spec.family != "encoder-decoder":
            if target:
                ids = torch.tensor([tokenizer.encode(f"{source} {target}", add_eos=True)], device=device)
            out = model(ids, output_attentions=True)
            kind = "self-attention" if spec.family == "encoder" else "causal self-attention"
            return [_map(f"{spec.family} {kind}", out.attentions, _labels(tokenizer, ids[0]))]
        if target is None:
            generated = model.generate(ids, max_new_tokens=max_new_tokens)  # (1, 1 + new): start token first
            decoder_ids = _inputs_before_eos(generated[0], spec.eos_token_id)[None]  # (1, T)
        else:
            target_ids = tokenizer.encode(target, add_eos=True)
            decoder_ids = torch.tensor([[spec.start_token_id, *target_ids[:-1]]], device=device)  # (1, T)
        out = model(ids, decoder_input_ids=decoder_ids, output_attentions=True)
    src, tgt = _labels(tokenizer, ids[0]), _labels(tokenizer, decoder_ids[0])
    return [
        _map("encoder self-attention", out.encoder_attentions, src),
        _map("decoder self-attention", out.attentions, tgt),
        _map("cross-attention", out.cross_attentions, tgt, src),
    ]


def _map(
    title: str, weights: Sequence[Any], queries: list[str], keys: list[str] | None = None
) -> AttentionMap:
    layers = [w[0].float().cpu().numpy() for w in weights]  # (B, H, Tq, Tk) -> (H, Tq, Tk)
    return AttentionMap(title, layers, queries, keys if keys is not None else queries)


def _labels(tokenizer: Any, ids: Any) -> list[str]:
    return [tokenizer.id_to_token(int(i)) or str(int(i)) for i in ids]


def _inputs_before_eos(ids: Any, eos: int | None) -> Any:
    """Generated ids (start token first) cut before the first end-of-sequence token: the decoder inputs
    that produced the output, as with teacher forcing on a target that ends in eos."""
    if eos is None:
        return ids
    hits = (ids[1:] == eos).nonzero()
    return ids[: int(hits[0]) + 1] if len(hits) else ids


def panel_inches(tokens: int) -> float:
    """Side of one heatmap panel: 2.4 inches, growing with the token count so tick labels stay legible."""
    return max(2.4, 0.18 * tokens + 1.0)


def plot_attention(
    maps: Sequence[AttentionMap], out: str | Path, *, panel: float | None = None, dpi: int = 100
) -> Path:
    """One PNG: a row per (kind, layer), a column per head.

    Size: ``heads × panel`` by ``total layers × panel`` inches at ``dpi`` (``panel`` defaults to
    `panel_inches` of the longest token list).
    """
    if not maps or not any(m.layers for m in maps):
        raise ValueError("no attention weights to plot")
    rows = [(m, layer, weights) for m in maps for layer, weights in enumerate(m.layers)]
    cols = max(weights.shape[0] for _, _, weights in rows)
    side = panel or panel_inches(max(max(len(m.queries), len(m.keys)) for m in maps))
    labels = [token for m in maps for token in (*m.queries, *m.keys, m.title)]
    with fonts_for(labels):
        figure = new_figure(cols * side, len(rows) * side, dpi=dpi)
        axes = figure.subplots(len(rows), cols, squeeze=False)
        longest = max(max(len(m.queries), len(m.keys)) for m in maps)
        fontsize = min(9.0, max(5.0, 0.5 * side * 72 / (longest + 6)))  # labels share the panel's side
        for r, (m, layer, weights) in enumerate(rows):
            for h in range(cols):
                ax = axes[r][h]
                if h >= weights.shape[0]:
                    ax.set_axis_off()
                    continue
                ax.imshow(weights[h], cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
                ax.set_title(f"layer {layer}, head {h}", fontsize=fontsize + 1)
                ax.set_xticks(range(len(m.keys)), m.keys, rotation=90, fontsize=fontsize)
                if h == 0:  # the heads of a row share their queries: label them once
                    ax.set_yticks(range(len(m.queries)), m.queries, fontsize=fontsize)
                    ax.set_ylabel(m.title, fontsize=fontsize + 2)
                else:
                    ax.set_yticks([])
        return save(figure, out)
