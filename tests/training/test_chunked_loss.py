"""``loss.chunk_tokens``: the trainer's causal-LM, chat and DPO losses computed through the LM head a chunk of
tokens at a time (`zoo.losses.chunked`) are the plain losses -- their values, metrics and every parameter's
gradient within 1e-5 in float32, and a run's weights -- and the setting is on by default for those tasks
only."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import zoo
from zoo.losses import IGNORE_INDEX, shift_labels_left
from zoo.losses.chunked import auto_chunk_tokens
from zoo.training import TrainConfig, Trainer, train
from zoo.training.batching import Batch
from zoo.training.config import ConfigError
from zoo.training.objectives import Objective, TokenCrossEntropy
from zoo.training.tasks.dpo import DirectPreference
from zoo.training.tasks.reference import frozen

CPU = torch.device("cpu")
GPT = {"preset": "gpt2-tiny", "overrides": {"max_positions": 32, "dropout": 0.0}}


def model(seed: int = 0, **overrides: Any) -> zoo.DecoderModel:
    torch.manual_seed(seed)
    built = zoo.build(zoo.preset("gpt2-tiny").override(dropout=0.0, **overrides))
    assert isinstance(built, zoo.DecoderModel)
    return built


def batch(rows: int, length: int, *, prompt: int, seed: int = 0, vocab: int = 512) -> Batch:
    """A right-padded batch whose first ``prompt`` positions of each row are not scored (chat's prompts,
    DPO's): targets (B, T) are the next tokens elsewhere, -100 at padding, prompts and the last position."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, length), generator=generator)
    mask = torch.ones_like(ids)
    for row in range(rows):
        mask[row, length - row % 3 :] = 0  # some rows padded
    targets = shift_labels_left(ids.masked_fill(mask == 0, IGNORE_INDEX))
    targets[:, : prompt - 1] = IGNORE_INDEX
    return Batch({"input_ids": ids, "attention_mask": mask}, targets, int(mask.sum()))


def run(objective: Objective, net: torch.nn.Module, data: Batch, *, train: bool) -> tuple[Any, list[Any]]:
    """The objective's sums and every trainable parameter's gradient of its loss."""
    params = [p for p in net.parameters() if p.requires_grad]
    sums = objective(net, data, device=CPU, train=train)
    grads = list(torch.autograd.grad(sums.loss, params)) if train else []
    return sums, grads


def assert_close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert torch.allclose(a, b, atol=1e-5, rtol=1e-6), (a - b).abs().max()


@pytest.mark.parametrize("eps", [0.0, 0.1], ids=["plain", "smoothed"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "valid"])
@pytest.mark.parametrize(
    "head", [{}, {"lm_head.tied": False, "lm_head.softcap": 3.0}], ids=["tied", "capped"]
)
def test_the_token_loss_in_chunks_is_the_plain_one(head: dict[str, Any], train: bool, eps: float) -> None:
    net = model(**head).train()
    data = batch(4, 13, prompt=5)  # chat: the prompt's tokens masked
    plain, plain_grads = run(TokenCrossEntropy(label_smoothing=eps), net, data, train=train)
    chunked, chunked_grads = run(
        TokenCrossEntropy(label_smoothing=eps, chunk_tokens=7), net, data, train=train
    )  # 7 does not divide the 29 scored tokens
    assert chunked.logits is None and plain.logits is not None
    assert_close(chunked.loss, plain.loss)
    for a, b in zip(plain_grads, chunked_grads, strict=True):
        assert_close(a, b)


def test_a_batch_that_fits_one_chunk_is_computed_whole() -> None:
    net = model().train()
    data = batch(4, 13, prompt=5)
    scored = int((data.targets != IGNORE_INDEX).sum())
    whole, whole_grads = run(TokenCrossEntropy(chunk_tokens=scored), net, data, train=True)
    split, split_grads = run(TokenCrossEntropy(chunk_tokens=scored - 1), net, data, train=True)
    assert whole.logits is not None and split.logits is None  # logits only where no chunk was needed
    assert_close(whole.loss, split.loss)
    for a, b in zip(whole_grads, split_grads, strict=True):
        assert_close(a, b)


@pytest.mark.parametrize(("eps", "nll"), [(0.0, 0.0), (0.2, 0.5)], ids=["dpo", "cdpo+rpo"])
def test_dpo_in_chunks_is_the_plain_loss_with_its_rewards(eps: float, nll: float) -> None:
    policy = model(seed=0).train()
    reference = frozen(model(seed=1))  # a policy that has moved away from its reference
    data = batch(6, 12, prompt=4, seed=3)  # 3 pairs: the chosen rows, then the rejected ones
    settings = {"beta": 0.5, "label_smoothing": eps, "nll_coef": nll}
    plain, plain_grads = run(
        DirectPreference(reference, adapters=False, **settings), policy, data, train=True
    )
    chunked, chunked_grads = run(
        DirectPreference(reference, adapters=False, chunk_tokens=5, **settings), policy, data, train=True
    )
    assert_close(chunked.loss, plain.loss)
    assert plain.metrics.keys() == chunked.metrics.keys()
    for name, value in plain.metrics.items():
        assert_close(chunked.metrics[name], value)
    for a, b in zip(plain_grads, chunked_grads, strict=True):
        assert_close(a, b)


def _lines(tmp_path: Path) -> Path:
    path = tmp_path / "lm.txt"
    path.write_text("\n".join(["the cat sees the dog", "a dog eats the fish", "the bird sings"] * 20))
    return path


def lm_config(
    make_config: Callable[..., TrainConfig], tmp_path: Path, name: str, **overrides: Any
) -> TrainConfig:
    """gpt2-tiny on a few lines, 3 steps. Adam's eps 1e-6: the key bias's gradient is zero up to rounding,
    which Adam's default 1e-8 would blow up to steps of the learning rate's size."""
    lm = _lines(tmp_path)
    return make_config(
        model=copy.deepcopy(GPT),
        task="causal_lm",
        data={"train": str(lm), "valid": str(lm)},
        schedule={"kind": "constant", "lr": 3e-3, "warmup_steps": 0},
        max_steps=3,
        output_dir=str(tmp_path / name),
        **{"tokenizer.vocab_size": 100, "batch.max_tokens": 128, "optim.eps": 1e-6},
        **overrides,
    )


def test_a_run_in_chunks_trains_the_weights_of_a_plain_run(
    make_config: Callable[..., TrainConfig], tmp_path: Path
) -> None:
    plain = train(lm_config(make_config, tmp_path, "plain", **{"loss.chunk_tokens": None}))
    chunked = train(lm_config(make_config, tmp_path, "chunked", **{"loss.chunk_tokens": 3}))
    assert plain.final["val_loss"] == pytest.approx(chunked.final["val_loss"], abs=1e-5)
    for (name, a), (_, b) in zip(plain.model.state_dict().items(), chunked.model.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-5), name


def test_auto_chunks_decoder_tasks_and_never_the_others(
    make_config: Callable[..., TrainConfig], tmp_path: Path
) -> None:
    plain = Trainer(lm_config(make_config, tmp_path, "plain", **{"loss.chunk_tokens": None}), progress=False)
    try:
        assert plain.objective.chunk_tokens is None  # null: all logits at once
    finally:
        plain.close()
    trainer = Trainer(lm_config(make_config, tmp_path, "lm"), progress=False)  # auto: the default
    try:
        assert isinstance(trainer.objective, TokenCrossEntropy)
        assert trainer.objective.chunk_tokens == auto_chunk_tokens(trainer.spec.vocab_size)
    finally:
        trainer.close()
    translator = Trainer(
        make_config(max_steps=1, output_dir=str(tmp_path / "mt"), **{"loss.chunk_tokens": "auto"}),
        progress=False,
    )
    try:
        assert isinstance(translator.objective, TokenCrossEntropy)
        assert translator.objective.chunk_tokens is None  # seq2seq: auto is off
    finally:
        translator.close()


def test_a_chunk_size_for_a_task_that_cannot_chunk_is_refused(
    make_config: Callable[..., TrainConfig], tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"loss.chunk_tokens \(64\) is for causal_lm, chat and dpo"):
        Trainer(make_config(max_steps=1, **{"loss.chunk_tokens": 64}), progress=False)
    with pytest.raises(ConfigError, match="chunk_tokens"):
        make_config(**{"loss.chunk_tokens": 0})
