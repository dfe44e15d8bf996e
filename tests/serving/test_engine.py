"""The continuous-batching engine: greedy outputs under concurrency are token-equal to `model.generate` of
each prompt alone — requests joining at different steps, mixed lengths, more requests than slots, the cache
compacted and shifted on the way."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
import torch

import zoo
from tests.generation.conftest import liven
from tests.serving.conftest import tiny_decoder
from zoo.serving import Completion, Delta, Done, Engine, Failed, PromptTooLong, QueueFull, RequestError
from zoo.serving.requests import StopText
from zoo.serving.slots import SlotCache


class Digits:
    """A tokenizer stand-in: token i is the text " i"."""

    eos_id = None

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return "".join(f" {i}" for i in ids)


class Collect:
    """Events per request; ``wait`` until every request submitted through it is done."""

    def __init__(self) -> None:
        self.done: dict[int, Done] = {}
        self.deltas: dict[int, list[Delta]] = {}
        self.failed: list[Failed] = []
        self._all = threading.Condition()

    def request(self, index: int, prompt: Sequence[int], max_tokens: int, **kw: object) -> Completion:
        def emit(event: object) -> None:
            with self._all:
                if isinstance(event, Done):
                    self.done[index] = event
                elif isinstance(event, Delta):
                    self.deltas.setdefault(index, []).append(event)
                elif isinstance(event, Failed):
                    self.failed.append(event)
                self._all.notify_all()

        return Completion(prompt=list(prompt), max_tokens=max_tokens, emit=emit, **kw)  # type: ignore[arg-type]

    def wait(self, count: int, *, started: int | None = None, timeout: float = 60) -> None:
        """Until ``count`` requests are done (or, with ``started``, until that request emitted text)."""
        with self._all:
            ok = self._all.wait_for(
                lambda: len(self.done) >= count if started is None else started in self.deltas, timeout
            )
        assert ok and not self.failed, self.failed


def _prompts(vocab: int, lengths: Sequence[int], seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def _alone(model: zoo.ZooModel, prompt: Sequence[int], new: int) -> list[int]:
    return model.generate(torch.tensor([prompt]), max_new_tokens=new)[0, len(prompt) :].tolist()


@pytest.fixture
def moves(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ``by`` of every `SlotCache.shift` (negative: a compaction; positive: room for a long prompt)."""
    seen: list[int] = []
    original = SlotCache.shift

    def spy(self: SlotCache, start: int, by: int) -> None:
        seen.append(by)
        original(self, start, by)

    monkeypatch.setattr(SlotCache, "shift", spy)
    return seen


def _run_staggered(model: zoo.ZooModel, *, max_length: int, moves: list[int]) -> None:
    """Waves of requests joining a running batch: one short prompt first (a young cursor), then a long one
    (shifted right), then more requests than slots, until the cursor reaches max_length (compaction)."""
    V = model.spec.vocab_size
    lengths = [3, 30, 12, 5, 21, 1, 17, 9, 26, 4]
    news = [40, 20, 25, 7, 30, 18, 3, 28, 12, 35]
    prompts = _prompts(V, lengths)
    engine = Engine(model, Digits(), max_batch=3, max_length=max_length, prefill_tokens=16).start()
    got = Collect()
    try:
        engine.submit([got.request(0, prompts[0], news[0])])
        got.wait(0, started=0)  # the first is decoding
        engine.submit([got.request(1, prompts[1], news[1])])
        got.wait(0, started=1)
        engine.submit([got.request(i, prompts[i], news[i]) for i in range(2, 6)])  # more than the slots
        got.wait(2)
        engine.submit([got.request(i, prompts[i], news[i]) for i in range(6, 10)])
        got.wait(10)
    finally:
        engine.close()
    for i, (prompt, new) in enumerate(zip(prompts, news)):
        assert list(got.done[i].token_ids) == _alone(model, prompt, new), f"request {i}"
        assert got.done[i].finish_reason == "length"
        assert got.done[i].text == "".join(d.text for d in got.deltas[i])
    assert any(by > 0 for by in moves) and any(by < 0 for by in moves), moves


def test_greedy_under_concurrency_equals_generate_alone(moves: list[int]) -> None:
    _run_staggered(tiny_decoder(), max_length=72, moves=moves)


def test_a_yarn_model_with_no_rope_layers_batches_as_generate_alone(moves: list[int]) -> None:
    scaling = {
        "type": "yarn",
        "factor": 4.0,
        "original_max_positions": 8,
        "mscale": 0.8,
        "mscale_all_dim": 1.0,
    }
    model = tiny_decoder(position={"kind": "rotary", "scaling": scaling, "nope_layers": [0]})
    _run_staggered(model, max_length=72, moves=moves)


def test_a_dynamic_ntk_model_is_refused_by_the_batching_engine() -> None:
    scaling = {"type": "dynamic", "factor": 2.0, "original_max_positions": 16}
    model = tiny_decoder(position={"kind": "rotary", "scaling": scaling})
    with pytest.raises(ValueError, match="dynamic-NTK rotary scaling cannot be batched"):
        Engine(model, Digits(), max_length=32)


@pytest.mark.parametrize(
    "options",
    [
        # OLMo 2: norms on each sub-layer's output, q/k norms over all heads
        {"norm.placement": "post_sublayer", "attention.qk_norm": True, "attention.qk_norm_scope": "all_heads"},
        # Cohere 2: one norm feeding parallel branches, scaled logits, a window
        {"norm.residual": "parallel_shared", "lm_head.scale": 0.5,
         "decoder": {"pattern": {"kind": "sliding_window", "window": 6}}},
    ],
    ids=["post-sublayer", "parallel-shared"],
)  # fmt: skip
def test_new_layer_wirings_batch_as_generate_alone(moves: list[int], options: dict) -> None:
    _run_staggered(tiny_decoder(**options), max_length=72, moves=moves)


def test_a_sliding_window_model_batches_through_a_full_cache(moves: list[int]) -> None:
    model = tiny_decoder(decoder={"pattern": {"kind": "sliding_window", "window": 6}})
    _run_staggered(model, max_length=72, moves=moves)


def test_a_gpt_oss_model_batches_with_its_sinks_windows_and_experts(moves: list[int]) -> None:
    """Attention sinks (zero keys, zero values added per step must not see the slots' padding), sliding and
    full layers alternating, biased experts with the clamped SwiGLU: the engine's tokens are generate's."""
    torch.manual_seed(0)
    spec = zoo.preset("gpt-oss-tiny", vocab_size=120, eos_token_id=None)
    model = liven(zoo.build(spec)).eval()
    with torch.no_grad():
        for layer in model.decoder.layers:
            layer.self_attn.sinks.normal_(0.0, 2.0)
    _run_staggered(model, max_length=72, moves=moves)


def test_a_llama4_model_batches_with_its_chunks_and_no_rope_temperature(moves: list[int]) -> None:
    """Chunked layers (chunks of 8, counted from each request's first token, through the full cache), a
    no-rope layer with temperature tuning by position, input-weighted experts: the engine's tokens are
    generate's."""
    torch.manual_seed(0)
    spec = zoo.preset("llama4-tiny", vocab_size=120, eos_token_id=None).override(
        **{"attention.temperature_tuning.count": "position"}
    )
    _run_staggered(liven(zoo.build(spec)).eval(), max_length=72, moves=moves)


def test_a_seeded_request_samples_the_same_text_alone_or_beside_others() -> None:
    model = tiny_decoder()
    prompt, others = _prompts(120, [6])[0], _prompts(120, [9, 4, 14], seed=2)
    engine = Engine(model, Digits(), max_batch=4, max_length=64).start()
    try:
        alone = Collect()
        engine.submit([alone.request(0, prompt, 20, temperature=0.9, top_p=0.9, seed=7)])
        alone.wait(1)
        crowd = Collect()
        engine.submit([crowd.request(i + 1, p, 20, temperature=1.0, seed=i) for i, p in enumerate(others)])
        engine.submit([crowd.request(0, prompt, 20, temperature=0.9, top_p=0.9, seed=7)])
        engine.submit([crowd.request(9, prompt, 20, temperature=0.9, top_p=0.9, seed=8)])
        crowd.wait(5)
    finally:
        engine.close()
    assert alone.done[0].token_ids == crowd.done[0].token_ids
    assert crowd.done[9].token_ids != crowd.done[0].token_ids  # another seed, another sample
    assert alone.done[0].token_ids != tuple(_alone(model, prompt, 20))  # it did sample


def test_stop_strings_cut_the_text_and_end_the_request() -> None:
    model = tiny_decoder()
    prompt = _prompts(120, [5])[0]
    reference = _alone(model, prompt, 30)
    stop = f" {reference[3]} {reference[4]}"  # the text of tokens 3 and 4
    engine = Engine(model, Digits(), max_batch=2, max_length=64).start()
    got = Collect()
    try:
        engine.submit([got.request(0, prompt, 30, stop=[stop, "never"])])
        got.wait(1)
    finally:
        engine.close()
    done = got.done[0]
    text = Digits().decode(reference)
    assert done.finish_reason == "stop" and done.text == text[: text.index(stop)]
    assert "".join(d.text for d in got.deltas.get(0, [])) == done.text  # nothing of the stop string leaked


def test_a_stop_token_ends_the_request_and_is_not_text() -> None:
    """``stop_token_ids`` (a chat template's end-of-turn token): the first one generated ends the request, as
    the model's eos would, its text left out."""
    model = tiny_decoder()
    prompt = _prompts(120, [5])[0]
    reference = _alone(model, prompt, 30)
    stop_at = next(i for i in range(2, 30) if reference[i] not in reference[:i])  # a token's first appearance
    engine = Engine(model, Digits(), max_batch=2, max_length=64).start()
    got = Collect()
    try:
        engine.submit([got.request(0, prompt, 30, stop_token_ids=(reference[stop_at],))])
        got.wait(1)
    finally:
        engine.close()
    done = got.done[0]
    assert done.finish_reason == "stop" and list(done.token_ids) == reference[: stop_at + 1]
    assert done.text == Digits().decode(reference[:stop_at])


def test_stop_text_holds_back_a_possible_stop_string() -> None:
    text = StopText(["END", "xy"])
    assert text.add("abc E") == ("abc ", False)  # "E" may begin "END"
    assert text.add("N") == ("", False)
    assert text.add("Dzz") == ("", True) and text.text == "abc "
    other = StopText(["END"])
    assert other.add("E") == ("", False) and other.add("x") == ("Ex", False) and other.rest() == ""


def test_a_cancelled_request_frees_its_slot_for_a_waiting_one() -> None:
    model = tiny_decoder()
    engine = Engine(model, Digits(), max_batch=1, max_queue=1, max_length=96).start()
    got = Collect()
    try:
        long = got.request(0, [5, 6, 7], 90)
        engine.submit([long])
        got.wait(0, started=0)
        engine.submit([got.request(1, [8, 9], 5)])  # waits for the only slot
        with pytest.raises(QueueFull, match="busy"):
            engine.submit([got.request(2, [8, 9], 5)])
        long.cancel()
        got.wait(1)
    finally:
        engine.close()
    assert 0 not in got.done and got.done[1].token_ids == tuple(_alone(model, [8, 9], 5))


def test_bad_requests_are_refused_with_the_parameter_named() -> None:
    engine = Engine(tiny_decoder(), Digits(), max_length=32)
    with pytest.raises(PromptTooLong, match="at most 31"):
        engine.submit([Completion(prompt=[5] * 32, max_tokens=1, emit=print)])
    with pytest.raises(RequestError, match="token ids must lie in") as error:
        engine.submit([Completion(prompt=[500], max_tokens=1, emit=print)])
    assert error.value.param == "prompt"
    with pytest.raises(RequestError) as error:
        engine.submit([Completion(prompt=[5], max_tokens=1, emit=print, top_p=0.0)])
    assert error.value.param == "top_p"


def test_a_sequence_ends_with_length_at_the_models_max_positions() -> None:
    model = tiny_decoder(max_positions=24)
    engine = Engine(model, Digits(), max_batch=2).start()
    got = Collect()
    try:
        engine.submit([got.request(0, [5] * 20, 100)])
        got.wait(1)
    finally:
        engine.close()
    assert got.done[0].finish_reason == "length" and len(got.done[0].token_ids) == 4


def test_an_encoder_decoder_is_served_one_request_at_a_time() -> None:
    torch.manual_seed(0)
    model = zoo.build(zoo.preset("t5-tiny", dropout=0.0)).eval()
    sources = _prompts(model.spec.vocab_size, [7, 3])
    engine = Engine(model, Digits(), max_batch=4).start()
    got = Collect()
    try:
        engine.submit([got.request(i, s, 6) for i, s in enumerate(sources)])
        got.wait(2)
    finally:
        engine.close()
    for i, source in enumerate(sources):
        expected = model.generate(torch.tensor([source]), max_new_tokens=6)[0, 1:].tolist()
        assert list(got.done[i].token_ids) == expected[: len(got.done[i].token_ids)]


@pytest.mark.slow  # torch.compile of the decode step: tens of seconds on a small CPU
def test_a_compiled_engine_gives_the_tokens_of_generate_alone(moves: list[int]) -> None:
    """``zoo serve --compile``: the decode step compiled (dynamic shapes) over the packed busy slots, requests joining
    and leaving as without it, the cache shifted and compacted: the same greedy tokens."""
    model = tiny_decoder()
    V = model.spec.vocab_size
    lengths, news = [3, 20, 7, 12, 5], [30, 12, 25, 8, 18]
    prompts = _prompts(V, lengths)
    engine = Engine(model, Digits(), max_batch=3, max_length=56, prefill_tokens=16, compile=True).start()
    got = Collect()
    try:
        engine.submit([got.request(0, prompts[0], news[0])])
        got.wait(0, started=0)
        engine.submit([got.request(i, prompts[i], news[i]) for i in range(1, 5)])
        got.wait(5)
    finally:
        engine.close()
    for i, (prompt, new) in enumerate(zip(prompts, news)):
        assert list(got.done[i].token_ids) == _alone(model, prompt, new), f"request {i}"
    assert any(by > 0 for by in moves) or any(by < 0 for by in moves), moves
