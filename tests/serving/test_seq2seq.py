"""Encoder-decoders in the continuous-batching engine: greedy outputs under concurrency are token-equal to
`model.generate` of each source alone — T5 (relative bias), BART (learned positions), Marian (imported from
transformers) and the 2017 Transformer — with sources of very different lengths, one longer than a prefill
chunk, newcomers encoded together, more requests than slots, the decoder cache compacted and the source
columns grown on the way; and a served one answers completions and chats, concurrently, as alone."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import torch

import zoo
import zoo.serving.sources
from tests.generation.conftest import build_tiny, liven
from tests.serving.test_engine import Collect, Digits, _prompts
from zoo.io.tokenizer import train_tokenizer
from zoo.serving import Engine, RequestError
from zoo.serving.engine import _Prefill
from zoo.serving.server import Server
from zoo.serving.slots import SlotCache
from zoo.serving.sources import SourceSlots, like_lengths

transformers = pytest.importorskip("transformers")


def _marian(tmp_path_factory: pytest.TempPathFactory) -> zoo.ZooModel:
    """A tiny Marian model from transformers (sinusoidal positions, scaled embeddings), through `zoo.from_hf`."""
    torch.manual_seed(0)
    config = transformers.MarianConfig(
        vocab_size=128, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
        scale_embedding=True, pad_token_id=127, decoder_start_token_id=127, eos_token_id=0,
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("marian") / "hf"
    transformers.MarianMTModel(config).save_pretrained(folder)
    torch.manual_seed(0)
    return liven(zoo.from_hf(folder)).eval()


@pytest.fixture(scope="module", params=["t5-tiny", "bart-tiny", "marian", "transformer-tiny"])
def seq2seq(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> zoo.ZooModel:
    if request.param == "marian":
        return _marian(tmp_path_factory)
    return build_tiny(request.param)


def _alone(model: zoo.ZooModel, source: list[int], new: int, **settings: object) -> list[int]:
    return model.generate(torch.tensor([source]), max_new_tokens=new, **settings)[0, 1:].tolist()


@pytest.fixture
def spies(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[int]]:
    """The decoder cache's moves, the rows of each group encoded together, the source columns held, the
    slots moved down into holes (`Engine._move`: a request, its keys and its source)."""
    seen: dict[str, list[int]] = {"moves": [], "groups": [], "columns": [], "packed": []}
    shift, encode, allocate, move = SlotCache.shift, Engine._encode, SourceSlots._allocate, Engine._move

    def spy_shift(self: SlotCache, start: int, by: int) -> None:
        seen["moves"].append(by)
        shift(self, start, by)

    def spy_encode(self: Engine, run: _Prefill) -> torch.Tensor:
        assert run.source is not None
        seen["groups"].append(run.source.shape[0])
        return encode(self, run)

    def spy_allocate(self: SourceSlots, columns: int) -> None:
        seen["columns"].append(columns)
        allocate(self, columns)

    def spy_move(self: Engine, src: int, dst: int) -> None:
        seen["packed"].append(src - dst)
        move(self, src, dst)

    monkeypatch.setattr(Engine, "_move", spy_move)
    monkeypatch.setattr(SlotCache, "shift", spy_shift)
    monkeypatch.setattr(Engine, "_encode", spy_encode)
    monkeypatch.setattr(SourceSlots, "_allocate", spy_allocate)
    monkeypatch.setattr(zoo.serving.sources, "FIRST_WIDTH", 8)  # so that a long source grows the columns
    return seen


def test_greedy_under_concurrency_equals_generate_alone(
    seq2seq: zoo.ZooModel, spies: dict[str, list[int]]
) -> None:
    V = seq2seq.input_vocab_size
    lengths = [5, 60, 3, 12, 1, 9, 33, 4, 17, 2, 26, 7]  # 60 > the 24 padded tokens of a prefill chunk
    news = [30, 12, 25, 7, 20, 18, 3, 28, 12, 22, 9, 15]
    sources = _prompts(V, lengths)
    engine = Engine(seq2seq, Digits(), max_batch=4, max_length=40, prefill_tokens=24).start()
    got = Collect()
    try:
        engine.submit([got.request(0, sources[0], news[0])])
        got.wait(0, started=0)  # the first is decoding: the others join a running batch
        engine.submit([got.request(i, sources[i], news[i]) for i in range(1, 12)])
        got.wait(12)
    finally:
        engine.close()
    for i, (source, new) in enumerate(zip(sources, news)):
        assert list(got.done[i].token_ids) == _alone(seq2seq, source, new), f"request {i}"
        assert got.done[i].text == "".join(d.text for d in got.deltas[i])
        assert got.done[i].prompt_tokens == len(source)
    assert any(by < 0 for by in spies["moves"]), spies  # the decoder cache compacted
    assert any(k > 1 for k in spies["groups"]) and spies["columns"][-1] >= 60, spies  # batched; grown
    assert spies["packed"], spies  # a request moved down into a free slot mid-decode
    assert engine.sources is not None and engine.sources.lengths == [0] * 4  # every slot freed


def test_like_lengths_groups_alike_sources_within_the_slots_and_the_budget() -> None:
    # the first always; then, in order, those alike (shortest >= 0.75 x longest, or all <= 16)
    assert like_lengths([40, 8, 36, 12, 60, 31], [1] * 6, slots=8, budget=512) == [0, 2, 5]
    assert like_lengths([10, 3, 16, 17], [1] * 4, slots=8, budget=512) == [0, 1, 2]  # short: any length
    assert like_lengths([40, 38, 39, 36], [1] * 4, slots=8, budget=120) == [0, 1, 2]  # 3 x 40 padded tokens
    assert like_lengths([40, 38, 39, 36], [1, 4, 2, 1], slots=4, budget=512) == [0, 2, 3]  # a beam's 4 slots
    assert like_lengths([300, 290], [1, 1], slots=8, budget=256) == [0]  # the first even over the budget


def test_waiting_sources_of_like_length_are_encoded_together(spies: dict[str, list[int]]) -> None:
    """Arrival order 40, 8, 36, 12: the 40 and the 36 are encoded together, then the 8 and the 12 (padded
    to 12, not 40), and each output is still generate's alone."""
    model = build_tiny("t5-tiny")
    lengths = [40, 8, 36, 12]
    sources = _prompts(model.input_vocab_size, lengths)
    engine = Engine(model, Digits(), max_batch=4)
    got = Collect()
    engine.submit([got.request(i, source, 6) for i, source in enumerate(sources)])
    widths: list[int] = []
    encode = engine._encode
    engine._encode = lambda run: (widths.append(run.source.shape[1]), encode(run))[1]  # type: ignore[method-assign]
    engine.start()
    try:
        got.wait(4)
    finally:
        engine.close()
    assert spies["groups"] == [2, 2] and widths == [40, 12], (spies, widths)
    for i, source in enumerate(sources):
        assert list(got.done[i].token_ids) == _alone(model, source, 6), f"request {i}"


def test_a_seeded_request_samples_the_same_alone_or_beside_others() -> None:
    model = build_tiny("t5-tiny")
    source, others = _prompts(120, [6])[0], _prompts(120, [19, 4, 40], seed=2)
    engine = Engine(model, Digits(), max_batch=4).start()
    packed = []
    move = engine._move
    engine._move = lambda src, dst: (packed.append(src), move(src, dst))  # type: ignore[method-assign]
    try:
        alone = Collect()
        engine.submit([alone.request(0, source, 20, temperature=0.9, top_p=0.9, seed=7)])
        alone.wait(1)
        crowd = Collect()
        shorter = [crowd.request(i + 1, p, 4 + 3 * i, temperature=1.0, seed=i) for i, p in enumerate(others)]
        engine.submit(shorter)  # they end first: the last slot's request moves down
        engine.submit([crowd.request(0, source, 20, temperature=0.9, top_p=0.9, seed=7)])
        crowd.wait(4)
    finally:
        engine.close()
    assert alone.done[0].token_ids == crowd.done[0].token_ids
    assert alone.done[0].token_ids != tuple(_alone(model, source, 20))  # it did sample
    assert packed  # and some request drew on after changing slots


def test_max_tokens_stop_tokens_and_stop_strings_end_a_request() -> None:
    model = build_tiny("bart-tiny")
    source = _prompts(120, [8])[0]
    greedy = _alone(model, source, 12)
    engine = Engine(model, Digits(), max_batch=3).start()
    got = Collect()
    try:
        engine.submit(
            [
                got.request(0, source, 4),
                got.request(1, source, 12, stop_token_ids=[greedy[5]]),
                got.request(2, source, 12, stop=[f" {greedy[3]}"]),
            ]
        )
        got.wait(3)
    finally:
        engine.close()
    assert got.done[0].token_ids == tuple(greedy[:4]) and got.done[0].finish_reason == "length"
    first = greedy.index(greedy[5])
    assert got.done[1].token_ids == tuple(greedy[: first + 1]) and got.done[1].finish_reason == "stop"
    cut = greedy.index(greedy[3])
    assert got.done[2].text == "".join(f" {t}" for t in greedy[:cut]) and got.done[2].finish_reason == "stop"


def test_a_cancelled_request_frees_its_slot_and_source_for_a_waiting_one() -> None:
    model = build_tiny("transformer-tiny")
    engine = Engine(model, Digits(), max_batch=1, max_queue=1).start()
    got = Collect()
    long, short = _prompts(600, [50, 4])
    try:
        running = got.request(0, long, 200)
        engine.submit([running])
        got.wait(0, started=0)
        engine.submit([got.request(1, short, 6)])  # waits for the only slot
        running.cancel()
        got.wait(1)
    finally:
        engine.close()
    assert 0 not in got.done and got.done[1].token_ids == tuple(_alone(model, short, 6))
    assert engine.sources is not None and engine.sources.lengths == [0] and engine.sources.width == 1


def test_penalties_and_logprobs_act_on_an_encoder_decoder_row() -> None:
    model = build_tiny("t5-tiny")
    source = _prompts(120, [9])[0]
    engine = Engine(model, Digits(), max_batch=2).start()
    got = Collect()
    try:
        engine.submit(
            [got.request(0, source, 15, repetition_penalty=1.5), got.request(1, source, 5, logprobs=2)]
        )
        got.wait(2)
    finally:
        engine.close()
    assert list(got.done[0].token_ids) == _alone(model, source, 15, repetition_penalty=1.5)
    assert len(got.done[1].logprobs) == 5 and all(e.logprob <= 0 for e in got.done[1].logprobs)
    with pytest.raises(RequestError, match="echo is not supported for encoder-decoder") as error:
        engine.check(got.request(2, source, 1, echo=True, logprobs=1))
    assert error.value.param == "echo"


# ---- served ----

LINES = [f"the cat number {i} sat on the mat {i * 7} and the dog ran off" for i in range(200)]


@pytest.fixture(scope="module")
def translator(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, zoo.Pretrained]:
    tok = train_tokenizer(iter(LINES), kind="bpe", vocab_size=300)
    ids = tok.special_ids()
    spec = zoo.preset("transformer-tiny").override(
        num_layers=2, vocab_size=tok.vocab_size, pad_token_id=ids["pad"], eos_token_id=ids["eos"]
    )
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("serve") / "translator"
    zoo.save(liven(zoo.build(spec)).eval(), folder, tokenizer=tok)
    return folder, zoo.load_pretrained(folder)


def test_a_served_encoder_decoder_answers_concurrent_completions_and_chats_as_alone(
    translator: tuple[Path, zoo.Pretrained],
) -> None:
    _, pretrained = translator
    tok, model = pretrained.tokenizer, pretrained.model
    prompts = [" ".join(LINES[i].split()[: 2 + i % 9]) for i in range(12)]
    expected = []
    for prompt in prompts:
        ids = _alone(model, tok.encode(prompt, add_eos=True), 16)
        expected.append(tok.decode([t for t in ids if t != model.spec.eos_token_id]))
    engine = Engine(model, tok, max_batch=12)
    with Server(engine, tok, model_name="tiny") as server:

        def complete(prompt: str) -> str:
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 16, "temperature": 0}
            answer = requests.post(f"{server.url}/completions", json=body, timeout=60).json()
            return answer["choices"][0]["text"]

        def chat(prompt: str) -> str:
            messages = [{"role": "user", "content": "ignored"}, {"role": "user", "content": prompt}]
            body = {"model": "tiny", "messages": messages, "max_tokens": 16, "temperature": 0}
            answer = requests.post(f"{server.url}/chat/completions", json=body, timeout=60).json()
            return answer["choices"][0]["message"]["content"]

        with ThreadPoolExecutor(12) as pool:
            together = list(pool.map(complete, prompts))
        chats = [chat(p) for p in prompts[:3]]  # a chat reads the last message as the source
    assert together == expected
    assert chats == expected[:3]


@pytest.mark.slow  # torch.compile of the decode step: tens of seconds on a small CPU
def test_a_compiled_engine_serves_an_encoder_decoder_as_generate_alone() -> None:
    """``zoo serve --compile``: the compiled step over the packed busy slots, the sources' columns grown."""
    model = build_tiny("t5-tiny")
    sources, news = _prompts(120, [5, 17, 9, 30]), [12, 6, 20, 9]
    engine = Engine(model, Digits(), max_batch=3, max_length=40, compile=True).start()
    got = Collect()
    try:
        engine.submit([got.request(i, s, n) for i, (s, n) in enumerate(zip(sources, news))])
        got.wait(4, timeout=600)
    finally:
        engine.close()
    for i, (source, new) in enumerate(zip(sources, news)):
        assert list(got.done[i].token_ids) == _alone(model, source, new), f"request {i}"
