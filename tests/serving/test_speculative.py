"""Speculative decoding in the engine (`zoo.serving.speculative`): greedy outputs under concurrency equal
each prompt's plain greedy alone, sampling keeps the target's distribution, requests the path cannot honour
take plain steps with the same result, and what it cannot serve is refused by name."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

import zoo
from tests.serving.conftest import tiny_decoder
from tests.serving.test_engine import Collect, Digits, _alone, _prompts
from zoo.serving import BeamSettings, Engine, RequestError, Speculation
from zoo.serving import speculative as module


def _other_draft() -> zoo.ZooModel:
    """A 1-layer model with other weights: it drafts, and is mostly wrong."""
    torch.manual_seed(5)
    spec = zoo.preset("llama-tiny", dropout=0.0, vocab_size=120, eos_token_id=None, num_layers=1)
    return zoo.build(spec).eval()


@pytest.fixture
def squeezes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The cursor after every compaction of a slot cache (target or draft)."""
    seen: list[int] = []
    original = module.squeeze

    def spy(cache: module.SlotCache, slots: list[int]) -> list[int]:
        firsts = original(cache, slots)
        seen.append(cache.length)
        return firsts

    monkeypatch.setattr(module, "squeeze", spy)
    return seen


def _staggered(model: zoo.ZooModel, speculation: Speculation) -> tuple[Collect, list[list[int]], list[int]]:
    """Waves of requests joining a running batch of 3 slots (`test_engine._run_staggered`), each prompt a
    motif repeated three times, so that prompt lookup finds drafts."""
    lengths = [3, 30, 12, 5, 21, 1, 17, 9, 26, 4]
    news = [40, 20, 25, 7, 30, 18, 3, 28, 12, 35]
    prompts = [p * 3 for p in _prompts(model.spec.vocab_size, lengths)]
    engine = Engine(
        model, Digits(), max_batch=3, max_length=150, prefill_tokens=16, speculative=speculation
    ).start()
    got = Collect()
    try:
        engine.submit([got.request(0, prompts[0], news[0])])
        got.wait(0, started=0)
        engine.submit([got.request(1, prompts[1], news[1])])
        got.wait(0, started=1)
        engine.submit([got.request(i, prompts[i], news[i]) for i in range(2, 6)])
        got.wait(2)
        engine.submit([got.request(i, prompts[i], news[i]) for i in range(6, 10)])
        got.wait(10)
    finally:
        engine.close()
    step = engine.speculative
    assert step is not None
    return got, prompts, [step.proposed, step.taken, *news]


@pytest.mark.parametrize("drafter", ["lookup", "itself", "other"])
def test_greedy_under_concurrency_equals_generate_alone(drafter: str, squeezes: list[int]) -> None:
    model = tiny_decoder()
    draft = {"lookup": None, "itself": model, "other": _other_draft()}[drafter]
    speculation = Speculation(lookup=True, tokens=3) if draft is None else Speculation(draft=draft, tokens=3)
    got, prompts, (proposed, taken, *news) = _staggered(model, speculation)
    for i, (prompt, new) in enumerate(zip(prompts, news)):
        assert list(got.done[i].token_ids) == _alone(model, prompt, new), f"request {i}"
        assert got.done[i].finish_reason == "length"
        assert got.done[i].text == "".join(d.text for d in got.deltas[i])
    assert squeezes, "the cache was never compacted"
    assert proposed > 100
    if drafter == "itself":  # the target drafting for itself: every draft is taken
        assert taken == proposed
    else:
        assert 0 < taken < proposed


def _run(engine: Engine, requests: Sequence[dict], new: int = 12) -> Collect:
    got = Collect()
    try:
        engine.start()
        engine.submit([got.request(i, r.pop("prompt"), new, **r) for i, r in enumerate(requests)])
        got.wait(len(requests))
    finally:
        engine.close()
    return got


def test_requests_it_cannot_honour_take_plain_steps_beside_drafting_ones() -> None:
    """Penalties, logit_bias and logprobs beside plain greedy rows: each request's tokens (and
    log-probabilities) are those of an engine without speculative decoding."""
    model = tiny_decoder()
    prompts = [p * 3 for p in _prompts(120, [4, 7, 5, 6])]

    def requests() -> list[dict]:
        return [
            {"prompt": prompts[0], "repetition_penalty": 1.3},
            {"prompt": prompts[1], "logprobs": 2},
            {"prompt": prompts[2], "logit_bias": {5: 3.0}, "frequency_penalty": 0.5},
            {"prompt": prompts[3]},
        ]

    plain = _run(Engine(model, Digits(), max_batch=4, max_length=64), requests())
    fast = _run(
        Engine(model, Digits(), max_batch=4, max_length=64, speculative=Speculation(draft=model)), requests()
    )
    for i in range(4):
        assert fast.done[i].token_ids == plain.done[i].token_ids, f"request {i}"
    for ours, theirs in zip(fast.done[1].logprobs, plain.done[1].logprobs):
        assert ours.token == theirs.token and ours.logprob == pytest.approx(theirs.logprob, abs=1e-4)
        assert [t for t, _ in ours.top] == [t for t, _ in theirs.top]
    assert len(fast.done[1].logprobs) == 12


@pytest.mark.parametrize("lookup", [pytest.param(False, marks=pytest.mark.slow), True])  # ~5 s, ~3 s
def test_sampling_keeps_the_target_distribution(lookup: bool) -> None:
    """The first two new tokens' empirical joint distribution over many seeded requests against the
    target's exact one (`tests/generation/test_speculative.py`, through the engine's per-request draws)."""
    spec = zoo.preset("gpt2-tiny").override(vocab_size=8, max_positions=32, eos_token_id=None)
    torch.manual_seed(0)
    target = zoo.build(spec).eval()
    torch.manual_seed(5)
    draft = zoo.build(spec).eval()
    with torch.no_grad():
        for model in (target, draft):
            for p in model.parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, 1.5 / p.shape[-1] ** 0.5)
    prompt = [1, 2, 3, 1, 2]
    ids = torch.tensor([prompt])
    with torch.no_grad():  # the exact joint P(first, second) of the first two new tokens, (8, 8)
        first = target(ids).logits[0, -1].softmax(-1)  # (8,)
        after = torch.cat([ids.repeat(8, 1), torch.arange(8)[:, None]], 1)
        joint = first[:, None] * target(after).logits[:, -1].softmax(-1)
    n = 2000
    speculation = Speculation(lookup=True, tokens=2) if lookup else Speculation(draft=draft, tokens=2)
    engine = Engine(target, Digits(), max_batch=32, max_queue=n, speculative=speculation)
    got = _run(engine, [{"prompt": prompt, "temperature": 1.0, "seed": i} for i in range(n)], new=3)
    assert engine.speculative is not None and engine.speculative.taken > 0
    pairs = torch.tensor([got.done[i].token_ids[:2] for i in range(n)])
    counts = torch.bincount(pairs[:, 0] * 8 + pairs[:, 1], minlength=64).float()
    expected = joint.flatten() * n
    big = expected >= 5  # cells expected under 5 times pooled into one, as a chi-square test needs
    observed = torch.cat([counts[big], counts[~big].sum()[None]])
    expected = torch.cat([expected[big], expected[~big].sum()[None]])
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    dof = int(big.sum())
    assert chi2 < dof + 6 * (2 * dof) ** 0.5, (chi2, dof)  # far in the tail (p ~ 1e-6) only if biased


def test_what_it_cannot_serve_is_refused_by_name() -> None:
    model = tiny_decoder()
    window = tiny_decoder(decoder={"pattern": {"kind": "sliding_window", "window": 6}})
    with pytest.raises(ValueError, match="sliding_window"):
        Engine(window, Digits(), speculative=Speculation(lookup=True))
    with pytest.raises(ValueError, match="--compile"):
        Engine(model, Digits(), compile=True, speculative=Speculation(lookup=True))
    with pytest.raises(ValueError, match="vocab_size"):
        Engine(model, Digits(), speculative=Speculation(draft=tiny_decoder(vocab_size=64)))
    with pytest.raises(ValueError, match="one of them"):
        Speculation(draft=model, lookup=True)
    engine = Engine(model, Digits(), max_batch=4, speculative=Speculation(lookup=True))
    with pytest.raises(RequestError, match="speculative decoding") as error:  # no search in a draft round
        engine.submit([Collect().request(0, [5, 6], 4, beam=BeamSettings(2, 1))])
    assert error.value.param == "use_beam_search"


def test_zoo_serve_draft_and_prompt_lookup_set_up_the_engine(
    saved: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import zoo.serving.server as server
    from zoo.cli import main

    engines: list[Engine] = []
    monkeypatch.setattr(server, "serve", lambda engine, *args, **kwargs: engines.append(engine))
    assert main(["serve", str(saved), "--port", "0", "--prompt-lookup", "3"]) == 0
    assert main(["serve", str(saved), "--port", "0", "--draft", str(saved), "--draft-tokens", "2"]) == 0
    lookup, draft = (engine.speculative for engine in engines)
    assert lookup is not None and isinstance(lookup.drafter, module.Lookup) and lookup.k == 3
    assert draft is not None and isinstance(draft.drafter, module.DraftModel) and draft.k == 2
    capsys.readouterr()
    assert main(["serve", str(saved), "--port", "0", "--draft", str(saved), "--prompt-lookup", "3"]) == 2
    assert capsys.readouterr().err.strip() == "error: zoo serve: give --draft or --prompt-lookup, not both"


@pytest.mark.parametrize("drafter", ["lookup", "other"])
def test_a_seeded_request_samples_the_same_text_alone_or_beside_others(drafter: str) -> None:
    """Its uniform numbers come from its own generator, one per draft of its own, whatever the other slots
    drafted in the same rounds."""
    model = tiny_decoder()
    prompt = _prompts(120, [6])[0] * 3
    others = [p * 2 for p in _prompts(120, [9, 4, 14], seed=2)]

    def engine() -> Engine:
        draft = None if drafter == "lookup" else _other_draft()
        speculation = (
            Speculation(lookup=True, tokens=3) if draft is None else Speculation(draft=draft, tokens=3)
        )
        return Engine(model, Digits(), max_batch=4, max_length=96, speculative=speculation)

    alone = _run(engine(), [{"prompt": prompt, "temperature": 0.9, "top_p": 0.9, "seed": 7}], new=20)
    crowd = _run(
        engine(),
        [
            *({"prompt": p, "temperature": 1.0, "seed": i} for i, p in enumerate(others)),
            {"prompt": prompt, "temperature": 0.9, "top_p": 0.9, "seed": 7},
        ],
        new=20,
    )
    assert alone.done[0].token_ids == crowd.done[3].token_ids
    assert alone.done[0].token_ids != tuple(_alone(model, prompt, 20))  # it did sample
