"""zoo.viz: every plot writes a PNG of the size it promises; masks, curves, metrics and fonts behave."""

from __future__ import annotations

import json
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import zoo
from zoo.io.tokenizer import train_tokenizer
from zoo.viz import (
    AttentionMap,
    MissingFontWarning,
    VizDependencyError,
    attention_maps,
    backend,
    example_masks,
    plot_attention,
    plot_masks,
    plot_positions,
    plot_schedule,
    plot_training,
    read_metrics,
    schedule_curve,
)

LINES = ["나는 학생이다", "i am a student", "고양이가 생선을 먹는다", "the cat eats fish"] * 3


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG signature and IHDR chunk."""
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and header[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", header[16:24])


@pytest.fixture(scope="module")
def tiny_translator() -> tuple[zoo.ZooModel, zoo.Tokenizer]:
    tokenizer = train_tokenizer(iter(LINES), kind="bpe", vocab_size=80, min_frequency=1)
    spec = zoo.preset(
        "transformer-tiny",
        vocab_size=tokenizer.vocab_size,
        d_model=32,
        num_layers=1,
        max_positions=32,
        **{"attention.num_heads": 2, "ffn.d_ff": 32},
    )
    return zoo.build(spec), tokenizer


def test_attention_maps_of_an_encoder_decoder_are_softmax_rows_over_the_tokens(tiny_translator) -> None:
    model, tokenizer = tiny_translator
    maps = attention_maps(model, tokenizer, "고양이가 생선을 먹는다", target="the cat eats fish")
    assert [m.title for m in maps] == ["encoder self-attention", "decoder self-attention", "cross-attention"]
    source = [tokenizer.id_to_token(i) for i in tokenizer.encode("고양이가 생선을 먹는다")]
    target = tokenizer.encode("the cat eats fish")
    encoder, decoder, cross = maps
    assert encoder.queries == encoder.keys == source
    assert decoder.queries[0] == tokenizer.id_to_token(model.spec.start_token_id)
    assert len(decoder.queries) == len(target) and cross.keys == source
    assert cross.layers[0].shape == (2, len(target), len(source))
    np.testing.assert_allclose(cross.layers[0].sum(-1), 1.0, rtol=1e-5)
    causal = decoder.layers[0][0]
    assert np.allclose(np.triu(causal, k=1), 0.0)  # no query sees a later target token


def test_attention_maps_without_a_target_decode_one_greedily(tiny_translator) -> None:
    model, tokenizer = tiny_translator
    maps = attention_maps(model, tokenizer, "나는 학생이다", max_new_tokens=5)
    decoder = maps[1]
    assert decoder.queries[0] == tokenizer.id_to_token(model.spec.start_token_id)
    assert 1 <= len(decoder.queries) <= 6  # the start token plus at most five new ones, eos cut off
    assert model.training  # the caller's mode is restored
    assert decoder.layers[0].shape[1] == len(decoder.queries)


def test_plot_attention_is_heads_by_layers_panels(tmp_path: Path) -> None:
    weights = np.full((3, 4, 4), 0.25)  # (H, Tq, Tk)
    maps = [AttentionMap("self", [weights, weights], list("abcd"), list("abcd"))]
    path = plot_attention(maps, tmp_path / "a.png", panel=1.5, dpi=40)
    assert png_size(path) == (3 * 60, 2 * 60)


def test_hangul_labels_use_a_cjk_font_or_warn_how_to_install_one(tmp_path: Path) -> None:
    maps = [AttentionMap("자기 주의", [np.eye(2)[None]], ["고양이", "가"], ["고양이", "가"])]
    font = backend.find_cjk_font()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = plot_attention(maps, tmp_path / "ko.png", panel=2, dpi=30)
    missing = [w for w in caught if issubclass(w.category, MissingFontWarning)]
    assert bool(missing) == (font is None)
    assert not [w for w in caught if "missing from font" in str(w.message)]  # one clear warning at most
    assert png_size(path) == (60, 60)


def test_without_a_cjk_font_the_plot_is_still_written_with_install_advice(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(backend, "find_cjk_font", lambda: None)
    maps = [AttentionMap("self", [np.eye(2)[None]], ["나는", "학생"], ["나는", "학생"])]
    with pytest.warns(MissingFontWarning, match="apt-get install fonts-noto-cjk"):
        path = plot_attention(maps, tmp_path / "ko.png", panel=2, dpi=30)
    assert png_size(path) == (60, 60)


def test_find_cjk_font_takes_the_first_preferred_font_installed(monkeypatch) -> None:
    monkeypatch.setattr(backend, "CJK_FONTS", ("No Such Font", "DejaVu Sans"))
    assert backend.find_cjk_font() == "DejaVu Sans"
    monkeypatch.setattr(backend, "CJK_FONTS", ("No Such Font",))
    monkeypatch.setattr("matplotlib.font_manager.findSystemFonts", lambda *a, **k: [])
    assert backend.find_cjk_font() is None
    assert backend.has_cjk(["학생"]) and not backend.has_cjk(["student", "▁the"])


def test_encoder_decoder_masks_are_padding_causal_and_cross(tmp_path: Path) -> None:
    panels = example_masks(zoo.preset("transformer-tiny"), source_lengths=(3, 2), target_lengths=(3, 1))
    assert [p.title.split("\n")[0] for p in panels[1]] == [
        "encoder self-attention",
        "decoder self-attention",
        "decoder cross-attention",
    ]
    encoder, decoder, cross = (p.mask for p in panels[1])  # the padded example
    np.testing.assert_array_equal(encoder, [[1, 1, 0]] * 3)
    np.testing.assert_array_equal(decoder, [[1, 0, 0]] * 3)  # causal AND one real target key
    np.testing.assert_array_equal(cross, [[1, 1, 0]] * 3)
    np.testing.assert_array_equal(panels[0][1].mask, np.tril(np.ones((3, 3))))
    path = plot_masks(panels, tmp_path / "m.png", dpi=50)
    assert png_size(path) == (3 * 160, 2 * 160 + 20)


def test_a_decoder_has_one_causal_mask_and_an_encoder_one_padding_mask() -> None:
    gpt = example_masks(zoo.preset("gpt2-tiny"), target_lengths=(2, 2))
    assert len(gpt[0]) == 1 and np.array_equal(gpt[0][0].mask, np.tril(np.ones((2, 2))))
    bert = example_masks(zoo.preset("bert-tiny"), source_lengths=(2, 1))
    assert len(bert[1]) == 1 and np.array_equal(bert[1][0].mask, [[1, 0], [1, 0]])


def test_positions_and_schedule_plots_have_their_stated_sizes(tmp_path: Path) -> None:
    table = zoo.blocks.sinusoidal_table(20, 16).numpy()
    assert png_size(plot_positions(table, tmp_path / "p.png", dpi=40)) == (360, 200)
    rates = schedule_curve(d_model=512, warmup=40, steps=200)
    assert max(rates) == pytest.approx((512 * 40) ** -0.5) == rates[39]
    assert png_size(plot_schedule(rates, tmp_path / "s.png", warmup=40, dpi=40)) == (320, 180)


def test_metrics_reader_skips_broken_lines_and_tolerates_missing_keys(tmp_path: Path) -> None:
    lines = [
        {"step": 1, "loss": 5.0, "lr": 1e-4},
        {"step": 2, "loss": 4.0, "tokens_per_s": 900},
        {"loss": 3.0},  # no step
        {"step": 3, "loss": float("nan"), "val_loss": 4.5, "val_bleu": 1.5, "note": "text"},
    ]
    text = "\n".join(json.dumps(line) for line in lines) + '\n\n{"step": 4, "lo'  # a run still writing
    (tmp_path / "metrics.jsonl").write_text(text)
    metrics = read_metrics(tmp_path)
    assert metrics.series["loss"] == [(1, 5.0), (2, 4.0)]
    assert metrics.series["val_loss"] == [(3, 4.5)] and metrics.series["tokens_per_s"] == [(2, 900.0)]
    assert "note" not in metrics.series and metrics.skipped == 2
    assert png_size(plot_training(metrics, tmp_path / "t.png", dpi=40)) == (400, 280)


def test_training_plot_names_the_file_when_there_is_nothing_to_draw(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "epoch": 0}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl: no loss"):
        plot_training(read_metrics(tmp_path), tmp_path / "t.png")
    with pytest.raises(FileNotFoundError, match="no metrics log"):
        read_metrics(tmp_path / "missing")


def test_missing_matplotlib_names_the_extra(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    with pytest.raises(VizDependencyError, match=r"pip install matplotlib") as error:
        plot_positions(torch.zeros(2, 2).numpy(), tmp_path / "p.png")
    assert isinstance(error.value, ValueError)


def test_training_plot_says_which_loss_is_label_smoothed(tmp_path: Path) -> None:
    from zoo.viz.training import training_figure

    lines = [{"step": 1, "loss": 5.0}, {"step": 2, "loss": 4.0}, {"step": 2, "val_loss": 4.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))

    def legend() -> list[str]:
        loss_panel = training_figure(read_metrics(tmp_path)).axes[0]
        return [text.get_text() for text in loss_panel.get_legend().get_texts()]

    assert legend() == ["train loss", "validation loss (NLL)"]  # an older run: no run.json
    (tmp_path / "run.json").write_text(json.dumps({"loss_label_smoothing": 0.1}))
    assert legend() == ["train loss (label-smoothed, ε=0.1)", "validation loss (NLL)"]
    (tmp_path / "run.json").write_text(json.dumps({"loss_label_smoothing": 0.0}))
    assert legend() == ["train loss (NLL)", "validation loss (NLL)"]
    (tmp_path / "run.json").write_text(json.dumps({"loss_label_smoothing": 0.0, "loss_name": "DPO"}))
    assert legend() == ["train loss (DPO)", "validation loss (DPO)"]  # a dpo run's losses are not NLL


def test_training_plot_gives_custom_metrics_panels_of_their_own(tmp_path: Path) -> None:
    from zoo.training.report.records import METRIC_KEYS
    from zoo.viz.training import STANDARD_KEYS, training_figure

    assert STANDARD_KEYS == METRIC_KEYS  # the plot's copy of the record keys has not drifted
    lines = [{"step": s, "loss": 5.0 / s, "grad_norm": 1.0 + s, "my_metric": s, "note": "x"} for s in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    metrics = read_metrics(tmp_path)
    assert metrics.extra_keys == ["grad_norm", "my_metric"]
    figure = training_figure(metrics)
    visible = [ax.get_title() for ax in figure.axes if ax.get_visible()]
    # no validation score: the custom metrics follow loss, lr and throughput
    assert visible == ["loss", "learning rate", "throughput (tokens/s)", "grad_norm", "my_metric"]
    assert png_size(plot_training(metrics, tmp_path / "t.png", dpi=40)) == (400, 420)  # one more row


@pytest.mark.parametrize(
    ("logged", "third"),
    [
        ({"val_bleu": 20.0, "val_ppl": 9.0}, "validation BLEU"),  # translation
        ({"val_ppl": 9.0}, "validation perplexity"),  # a language model: no BLEU panel
        ({}, "throughput (tokens/s)"),  # DPO: neither, the slot goes to what follows
    ],
)
def test_the_validation_panel_is_the_score_the_run_logs(tmp_path: Path, logged: dict, third: str) -> None:
    from zoo.viz.training import training_figure

    lines = [
        {"step": s, "loss": 5.0 / s, "lr": 1e-3, "tokens_per_s": 100.0, "val_loss": 2.0} | logged
        for s in (1, 2)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    visible = [ax.get_title() for ax in training_figure(read_metrics(tmp_path)).axes if ax.get_visible()]
    assert visible[2] == third
    assert not any("BLEU" in title for title in visible) or "val_bleu" in logged
