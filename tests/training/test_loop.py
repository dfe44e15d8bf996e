"""The loop's options: activation checkpointing, bf16 autocast, the language-modelling tasks, attentions."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from zoo.training import Trainer, train
from zoo.training.config import TrainConfig
from zoo.training.report.records import METRIC_KEYS


def test_activation_checkpointing_trains_exactly_like_storing_activations(
    make_config: Callable[..., TrainConfig], tmp_path: Path
) -> None:
    overrides = {
        "model.overrides.dropout": 0.1,
        "max_steps": 2,
    }  # dropout: recomputation must replay its masks
    plain = train(make_config(**overrides, output_dir=str(tmp_path / "a")))
    recomputed = train(
        make_config(**overrides, output_dir=str(tmp_path / "b"), activation_checkpointing=True)
    )
    for (name, a), (_, b) in zip(plain.model.state_dict().items(), recomputed.model.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-6), name
    assert list(recomputed.model.state_dict()) == list(plain.model.state_dict())  # names unchanged


def test_bf16_autocast_trains_float32_weights_on_cpu(make_config: Callable[..., TrainConfig]) -> None:
    result = train(make_config(precision="bf16", max_steps=2))
    assert all(p.dtype == torch.float32 for p in result.model.parameters())
    assert result.final["val_loss"] is not None and torch.isfinite(torch.tensor(result.final["val_loss"]))


def test_metrics_file_has_every_key_in_every_record(make_config: Callable[..., TrainConfig]) -> None:
    config = make_config(max_steps=2, **{"task.bleu": True, "task.bleu_samples": 4})
    train(config)
    records = [json.loads(line) for line in (config.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(tuple(r) == METRIC_KEYS for r in records)
    assert [r["step"] for r in records if r["loss"] is not None] == [1, 2]
    final = records[-1]
    assert final["val_ppl"] == pytest.approx(2.718281828 ** final["val_loss"], rel=1e-6)
    assert 0.0 <= final["val_bleu"] <= 100.0


def _lines(tmp_path: Path) -> Path:
    path = tmp_path / "lm.txt"
    path.write_text(
        "\n".join(["the cat sees the dog", "a dog eats the fish", "the bird sings"] * 40), encoding="utf-8"
    )
    return path


@pytest.mark.parametrize(
    ("model", "task"),
    [
        ({"preset": "gpt2-tiny", "overrides": {"max_positions": 32}}, "causal_lm"),
        ({"preset": "bert-tiny", "overrides": {"heads.mlm": {}, "max_positions": 32}}, "masked_lm"),
    ],
)
def test_language_model_tasks_lower_their_loss(
    model: dict, task: str, make_config: Callable[..., TrainConfig], tmp_path: Path
) -> None:
    lm = _lines(tmp_path)
    config = make_config(
        model=model,
        task=task,
        data={"train": str(lm), "valid": str(lm)},
        schedule={"kind": "constant", "lr": 3e-3, "warmup_steps": 0},
        max_steps=30,
        log_every=5,
        **{"tokenizer.vocab_size": 100},
    )
    trainer = Trainer(config)
    before = trainer.evaluate()["val_loss"]
    result = trainer.fit()
    assert result.final["val_loss"] < 0.7 * before
    assert result.final["val_bleu"] is None  # BLEU is for translation only


def test_trained_translator_returns_cross_attention_weights(make_config: Callable[..., TrainConfig]) -> None:
    result = train(make_config(max_steps=1))
    tok = result.tokenizer
    src = torch.tensor([tok.encode("the cat eats fish")])
    tgt = torch.tensor([[1, *tok.encode("고양이가 생선을 먹는다", add_eos=False)]])
    out = result.model.eval()(src, decoder_input_ids=tgt, output_attentions=True)
    assert len(out.cross_attentions) == 2  # one per decoder layer
    weights = out.cross_attentions[-1]
    assert weights.shape == (1, 2, tgt.shape[1], src.shape[1])  # (B, H, T, S)
    assert torch.allclose(weights.sum(-1), torch.ones(1, 2, tgt.shape[1]), atol=1e-5)


@pytest.mark.slow
def test_compiled_layers_train_like_eager_ones(
    make_config: Callable[..., TrainConfig], tmp_path: Path
) -> None:
    # eps 1e-6: the key bias's gradient is zero up to rounding, and fused kernels round differently.
    eager = train(make_config(max_steps=2, output_dir=str(tmp_path / "a"), **{"optim.eps": 1e-6}))
    compiled = train(
        make_config(max_steps=2, output_dir=str(tmp_path / "b"), compile=True, **{"optim.eps": 1e-6})
    )
    for (name, a), (_, b) in zip(eager.model.state_dict().items(), compiled.model.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-4), name


def test_activation_checkpointing_stores_fewer_tensors_for_backward() -> None:
    import zoo
    from zoo.training.distributed import checkpoint_activations

    def saved_tensor_count(model: torch.nn.Module) -> int:
        count = 0

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            nonlocal count
            count += 1
            return tensor

        ids = torch.randint(5, 100, (2, 7))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(ids, decoder_input_ids=ids).logits.sum()
        return count

    spec = zoo.preset("transformer-tiny").override(vocab_size=100, d_model=32, **{"attention.num_heads": 2})
    model = zoo.build(spec)
    stored = saved_tensor_count(model)
    checkpoint_activations(model)
    assert saved_tensor_count(model) < stored / 3


def test_run_json_says_the_training_loss_is_label_smoothed_and_the_plot_says_so(
    make_config: Callable[..., TrainConfig], tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    from zoo.viz.training import read_metrics, training_figure

    config = make_config(max_steps=1)
    train(config, progress=False)
    info = json.loads((config.output_dir / "run.json").read_text())
    assert info["task"] == "seq2seq" and info["loss_label_smoothing"] == 0.1  # the seq2seq default
    loss_panel = training_figure(read_metrics(config.output_dir)).axes[0]
    labels = [text.get_text() for text in loss_panel.get_legend().get_texts()]
    assert labels == ["train loss (label-smoothed, ε=0.1)", "validation loss (NLL)"]
    lm = make_config(output_dir=str(tmp_path / "lm"), **{"loss.label_smoothing": 0.0})
    Trainer(lm, progress=False).close()  # run.json is written before the first step
    assert json.loads((lm.output_dir / "run.json").read_text())["loss_label_smoothing"] == 0.0
