"""Per-request logits processors inside the batched step: each row's settings act on its row alone (a crowd
of requests with different settings gives each the tokens it gets alone), with OpenAI's semantics for the
presence and frequency penalties and logit_bias, and generate's (transformers') for the repetition penalty,
temperature, top-k and top-p."""

from __future__ import annotations

import torch

from tests.serving.conftest import tiny_decoder
from tests.serving.test_engine import Collect, Digits, _prompts
from zoo.generation.sampling import LogitsProcessors, min_p_filter
from zoo.serving import Completion, Engine
from zoo.serving.sampling import RowSampling

V = 120


def _reference(model: torch.nn.Module, prompt: list[int], new: int, **settings: object) -> list[int]:
    """Greedy search with OpenAI's penalties and biases, one full forward a token (no cache, no batch)."""
    presence = float(settings.get("presence_penalty", 0.0))  # type: ignore[arg-type]
    frequency = float(settings.get("frequency_penalty", 0.0))  # type: ignore[arg-type]
    bias = settings.get("logit_bias", {})
    ids, out = list(prompt), []
    for _ in range(new):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].float()  # (V,)
        counts = torch.bincount(torch.tensor(out, dtype=torch.long), minlength=logits.shape[0]).float()
        logits = logits - frequency * counts - presence * (counts > 0).float()
        for token, value in bias.items():  # type: ignore[attr-defined]
            logits[token] += value
        out.append(int(logits.argmax()))
        ids.append(out[-1])
    return out


SETTINGS: list[dict[str, object]] = [
    {"frequency_penalty": 2.0},
    {"presence_penalty": 2.0, "frequency_penalty": -0.5},
    {"logit_bias": {7: 100.0}},
    {"logit_bias": {3: 4.0, 9: -100.0}, "presence_penalty": 1.0},
    {},
]


def test_penalties_and_biases_per_row_equal_openai_semantics_alone_and_in_a_crowd() -> None:
    model = tiny_decoder()
    prompts = _prompts(V, [6, 9, 4, 12, 7], seed=3)
    expected = [_reference(model, p, 12, **s) for p, s in zip(prompts, SETTINGS)]
    assert expected[2] == [7] * 12  # +100 on one token: every token is that token
    assert expected[0] != _reference(model, prompts[0], 12)  # the penalty acted
    assert len(set(expected[0])) > 6  # and a large frequency penalty stops the repeats
    engine = Engine(model, Digits(), max_batch=3, max_length=40).start()  # 5 requests, 3 slots
    try:
        crowd = Collect()
        engine.submit([crowd.request(i, p, 12, **s) for i, (p, s) in enumerate(zip(prompts, SETTINGS))])
        crowd.wait(5)
        sampled = Collect()  # a +100 bias wins when sampling too; seeded sampled rows beside penalized ones
        engine.submit([sampled.request(0, prompts[0], 8, temperature=1.0, seed=1, logit_bias={5: 100.0})])
        sampled.wait(1)
    finally:
        engine.close()
    assert [list(crowd.done[i].token_ids) for i in range(5)] == expected
    assert list(sampled.done[0].token_ids) == [5] * 8


def test_greedy_with_a_repetition_penalty_equals_generate() -> None:
    model = tiny_decoder()
    prompts = _prompts(V, [5, 11], seed=4)
    engine = Engine(model, Digits(), max_batch=2, max_length=40).start()
    try:
        got = Collect()
        engine.submit([got.request(0, prompts[0], 10, repetition_penalty=1.8)])
        engine.submit([got.request(1, prompts[1], 10)])  # beside it, unpenalized
        got.wait(2)
    finally:
        engine.close()
    for i, penalty in ((0, 1.8), (1, 1.0)):
        prompt = torch.tensor([prompts[i]])
        ids = model.generate(prompt, max_new_tokens=10, repetition_penalty=penalty)[0, prompt.shape[1] :]
        assert list(got.done[i].token_ids) == ids.tolist()


def _request(prompt: list[int], **settings: object) -> Completion:
    return Completion(prompt=prompt, max_tokens=1, emit=lambda event: None, **settings)  # type: ignore[arg-type]


def test_each_rows_warped_distribution_equals_generates_processors() -> None:
    """Rows with different temperature, top-k, top-p and repetition penalty, warped in one batched call, equal
    generate's `LogitsProcessors` run on each row alone (transformers' order and semantics)."""
    torch.manual_seed(0)
    logits = torch.randn(4, V) * 3  # (R, V)
    prompts = _prompts(V, [5, 8, 3, 6], seed=5)
    settings: list[dict[str, float | int]] = [
        {"temperature": 0.7, "top_k": 5},
        {"temperature": 1.3, "top_p": 0.8, "repetition_penalty": 1.5},
        {"temperature": 1.0},
        {"temperature": 0.5, "top_k": 20, "top_p": 0.9, "repetition_penalty": 0.7},
    ]
    rows = RowSampling(6, V, torch.device("cpu"))
    slots = torch.tensor([4, 0, 2, 5])  # any slots, in any order
    requests = [_request(p, **s) for p, s in zip(prompts, settings)]  # type: ignore[arg-type]
    for slot, request in zip(slots.tolist(), requests):
        rows.set(slot, request)
    warped = rows.warp(rows.penalize(logits, slots, requests), slots, requests)  # (R, V)
    for i, (prompt, s) in enumerate(zip(prompts, settings)):
        alone = LogitsProcessors(
            vocab_size=V,
            repetition_penalty=float(s.get("repetition_penalty", 1.0)),
            do_sample=True,
            temperature=float(s["temperature"]),
            top_k=int(s.get("top_k", 0)) or None,
            top_p=float(s.get("top_p", 1.0)),
        )
        alone.start(torch.tensor([prompt]), None)
        expected = alone(logits[i : i + 1].clone(), torch.tensor([prompt]), None, 0)[0]
        assert torch.equal(warped[i].isinf(), expected.isinf()), i
        torch.testing.assert_close(warped[i][expected.isfinite()], expected[expected.isfinite()])


def test_min_p_keeps_the_tokens_at_least_min_p_times_as_likely_as_the_best() -> None:
    scores = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.4, 0.3, 0.2, 0.1]]))
    kept = min_p_filter(scores, torch.tensor([0.5, 0.0])).isfinite()
    assert kept.tolist() == [[True, True, False, False], [True, True, True, True]]
