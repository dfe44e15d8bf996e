"""Beam requests in the batched engine (`zoo.serving.beams`): several beam requests mixed with greedy ones,
joining a running batch, give exactly the tokens each gives alone and exactly ``model.generate``'s beams
(``num_beams``, ``num_return_sequences``, ``length_penalty``, ``early_stopping``), for decoders and for
encoder-decoders (T5, BART, Marian, the 2017 Transformer); a served translator's ``use_beam_search`` request
equals ``zoo translate --beams``."""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import torch

import zoo
from tests.generation.conftest import liven
from tests.serving.conftest import MODEL_NAME, tiny_decoder
from tests.serving.test_engine import Collect, Digits, _prompts
from tests.serving.test_seq2seq import seq2seq, translator  # noqa: F401  (fixtures)
from zoo.cli import main
from zoo.serving import Completion, Done, Engine, RequestError
from zoo.serving.requests import BeamSettings
from zoo.serving.server import Server


class Beams(Collect):
    """`Collect`, keeping every `Done` of a request (a beam request's n hypotheses, by ``choice``)."""

    def __init__(self) -> None:
        super().__init__()
        self.choices: dict[int, dict[int, Done]] = {}

    def request(self, index: int, prompt: Sequence[int], max_tokens: int, **kw: object) -> Completion:
        completion = super().request(index, prompt, max_tokens, **kw)
        emit = completion.emit

        def keep(event: object) -> None:
            if isinstance(event, Done):
                self.choices.setdefault(index, {})[event.choice] = event
            emit(event)  # type: ignore[arg-type]

        completion.emit = keep
        return completion

    def hypotheses(self, index: int) -> list[list[int]]:
        done = self.choices[index]
        return [list(done[k].token_ids) for k in range(len(done))]


def _generate(model: zoo.ZooModel, prompt: list[int], new: int, beam: BeamSettings | None, **kw: object):
    """What ``generate`` gives the prompt alone: each returned row's new tokens, up to its first end token."""
    settings = {} if beam is None else dict(
        num_beams=beam.width, num_return_sequences=beam.n, length_penalty=beam.length_penalty,
        early_stopping=beam.early_stopping,
    )  # fmt: skip
    out = model.generate(torch.tensor([prompt]), max_new_tokens=new, **settings, **kw)  # type: ignore[arg-type]
    skip = len(prompt) if model.continues_input else 1
    eos = kw.get("eos_token_id", model.spec.eos_token_id)
    ends = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    rows = []
    for row in out[:, skip:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in ends), len(row))
        rows.append(row[:cut])
    return rows


BEAMS = [  # (width, n, length_penalty, early_stopping), None: greedy
    None,
    BeamSettings(3, 2),
    None,
    BeamSettings(4, 4, length_penalty=0.5, early_stopping=True),
    BeamSettings(2, 1, length_penalty=2.0, early_stopping="never"),
    None,
    BeamSettings(3, 1),
    None,
]


def _mixed(model: zoo.ZooModel, *, lengths: list[int], news: list[int], **engine: object) -> None:
    """A greedy request decoding, then beam and greedy requests joining it, more than the slots hold (a
    beam request waits for its best_of slots); each equals generate alone."""
    V = model.input_vocab_size
    prompts = _prompts(V, lengths)
    moved: list[int] = []
    engine_ = Engine(model, Digits(), max_batch=6, prefill_tokens=24, **engine).start()  # type: ignore[arg-type]
    move = engine_._move
    engine_._move = lambda src, dst: (moved.append(src), move(src, dst))  # type: ignore[method-assign]
    got = Beams()
    try:
        engine_.submit([got.request(0, prompts[0], news[0])])
        got.wait(0, started=0)  # decoding: the others join a running batch
        engine_.submit([got.request(i, prompts[i], news[i], beam=BEAMS[i]) for i in range(1, len(BEAMS))])
        got.wait(len(BEAMS))
    finally:
        engine_.close()
    for i, (prompt, new, beam) in enumerate(zip(prompts, news, BEAMS)):
        assert got.hypotheses(i) == _generate(model, prompt, new, beam), f"request {i}"
    assert moved  # slots moved down into holes on the way (a beam's slot among them)
    assert engine_._in_flight == 0 and not engine_.beams.groups and not any(engine_.slots)


LENGTHS = [5, 12, 3, 20, 7, 9, 4, 15]
NEWS = [30, 9, 12, 8, 6, 10, 14, 5]


@pytest.mark.parametrize("preset", ["llama-tiny", "gpt2-tiny"])
def test_beams_beside_greedy_requests_equal_generate_alone_for_a_decoder(preset: str) -> None:
    model = tiny_decoder() if preset == "llama-tiny" else _gpt2()
    _mixed(model, lengths=LENGTHS, news=NEWS, max_length=40)  # 40: the cache compacts on the way


def _gpt2() -> zoo.ZooModel:
    torch.manual_seed(0)
    return liven(zoo.build(zoo.preset("gpt2-tiny", dropout=0.0, vocab_size=120, eos_token_id=None))).eval()


def test_beams_beside_greedy_requests_equal_generate_alone_for_an_encoder_decoder(
    seq2seq: zoo.ZooModel,  # noqa: F811
) -> None:
    _mixed(seq2seq, lengths=[5, 30, 3, 12, 1, 9, 40, 4], news=NEWS, max_length=40)


def test_a_hypothesis_ends_at_a_stop_token_as_at_eos() -> None:
    """``stop_token_ids`` end hypotheses as generate's eos_token_id does: finished ones are kept and scored
    by their own length, "stop" is their finish reason; ``max_tokens`` 1 ends the search at its first step."""
    model = tiny_decoder()
    prompt = _prompts(120, [6])[0]
    free = _generate(model, prompt, 8, BeamSettings(4, 4))
    stop = free[0][2]  # a token the best beam writes early: hypotheses end on it
    engine = Engine(model, Digits(), max_batch=4).start()
    got = Beams()
    try:
        beam = BeamSettings(4, 3, length_penalty=0.8)
        engine.submit([got.request(0, prompt, 8, beam=beam, stop_token_ids=[stop])])
        engine.submit([got.request(1, prompt, 1, beam=BeamSettings(3, 2))])
        got.wait(2)
    finally:
        engine.close()
    assert got.hypotheses(0) == _generate(model, prompt, 8, beam, eos_token_id=[stop])
    reasons = [got.choices[0][k].finish_reason for k in range(3)]
    assert reasons == ["stop" if h[-1] == stop else "length" for h in got.hypotheses(0)] and "stop" in reasons
    assert got.choices[0][0].text == "".join(f" {t}" for t in got.hypotheses(0)[0] if t != stop)
    assert got.hypotheses(1) == _generate(model, prompt, 1, BeamSettings(3, 2))


def test_a_beam_request_reads_its_prompts_cached_prefix_as_generate_alone() -> None:
    model = tiny_decoder()
    shared = _prompts(120, [40])[0]  # two whole blocks of 16 cached by the first request
    prompts = [shared + tail for tail in _prompts(120, [3, 7, 5], seed=3)]
    beams = [BeamSettings(3, 2), BeamSettings(4, 3), None]
    engine = Engine(model, Digits(), max_batch=8, max_length=96).start()
    got = Beams()
    try:
        engine.submit([got.request(0, prompts[0], 10, beam=beams[0])])
        got.wait(1)
        engine.submit([got.request(i, prompts[i], 10, beam=beams[i]) for i in (1, 2)])
        got.wait(3)
    finally:
        engine.close()
    assert engine.prefix is not None and engine.prefix.hit_tokens >= 32
    for i, (prompt, beam) in enumerate(zip(prompts, beams)):
        assert got.hypotheses(i) == _generate(model, prompt, 10, beam), f"request {i}"


@pytest.mark.slow  # torch.compile of the decode step: tens of seconds on a small CPU
def test_a_compiled_engine_runs_beam_groups_as_generate_alone() -> None:
    """``zoo serve --compile``: the compiled step over the packed busy slots, beam groups' rows among them."""
    model = tiny_decoder()
    prompts, beams = (
        _prompts(120, [5, 9, 13]),
        [BeamSettings(3, 2), None, BeamSettings(2, 2, early_stopping=True)],
    )
    engine = Engine(model, Digits(), max_batch=6, max_length=64, compile=True).start()
    got = Beams()
    try:
        engine.submit([got.request(i, p, 12, beam=b) for i, (p, b) in enumerate(zip(prompts, beams))])
        got.wait(3, timeout=600)
    finally:
        engine.close()
    for i, (prompt, beam) in enumerate(zip(prompts, beams)):
        assert got.hypotheses(i) == _generate(model, prompt, 12, beam), f"request {i}"


def test_a_cancelled_beam_request_frees_its_slots_for_a_waiting_one() -> None:
    model = tiny_decoder()
    engine = Engine(model, Digits(), max_batch=3, max_queue=3).start()
    got = Beams()
    first, short = _prompts(120, [8, 4])
    try:
        running = got.request(0, first, 60, beam=BeamSettings(3))
        engine.submit([running])
        deadline = time.monotonic() + 60
        while not engine.beams.groups and time.monotonic() < deadline:  # until it joins its three slots
            time.sleep(0.01)
        engine.submit([got.request(1, short, 6)])  # waits for a slot
        running.cancel()
        got.wait(1)
    finally:
        engine.close()
    assert 0 not in got.choices and got.hypotheses(1) == _generate(model, short, 6, None)
    assert engine._in_flight == 0 and not engine.beams.groups


def test_beam_requests_the_engine_cannot_run_are_refused_naming_the_field() -> None:
    engine = Engine(tiny_decoder(), Digits(), max_batch=4)
    got = Collect()
    cases = [
        (dict(beam=BeamSettings(5)), "best_of"),  # more beams than slots
        (dict(beam=BeamSettings(3, 4)), "n"),
        (dict(beam=BeamSettings(2), temperature=0.7), "temperature"),
        (dict(beam=BeamSettings(2), logprobs=1), "logprobs"),
        (dict(beam=BeamSettings(2), stop=["x"]), "stop"),
        (dict(beam=BeamSettings(2), repetition_penalty=1.3), "repetition_penalty"),
        (dict(beam=BeamSettings(2, early_stopping="soon")), "early_stopping"),  # type: ignore[arg-type]
    ]
    for fields, param in cases:
        with pytest.raises(RequestError) as error:
            engine.submit([got.request(0, [5, 6], 4, **fields)])
        assert error.value.param == param, fields
    assert engine._in_flight == 0


# ---- served ----


def test_a_served_translators_beam_request_equals_zoo_translate_beams(
    translator: tuple[Path, zoo.Pretrained],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The acceptance check: ``use_beam_search`` with ``best_of: 4`` is ``zoo translate --beams 4``; sent
    concurrently with greedy and other beam requests, every answer is its own alone."""
    folder, pretrained = translator
    tok, model = pretrained.tokenizer, pretrained.model
    sentence = "the cat number 3 sat on the mat"
    assert main(["translate", str(folder), sentence, "--beams", "4", "--max-new-tokens", "16"]) == 0
    printed = capsys.readouterr().out.strip()
    prompts = [" ".join(f"the dog number {i} sat on the mat {i * 7}".split()[: 3 + i % 6]) for i in range(8)]
    bodies = [
        {"prompt": p, "max_tokens": 16, "temperature": 0}
        if i % 2
        else {"prompt": p, "max_tokens": 16, "use_beam_search": True, "best_of": 3, "n": 2}
        for i, p in enumerate(prompts)
    ]
    engine = Engine(model, tok, max_batch=8)
    with Server(engine, tok, model_name="tiny") as server:

        def complete(body: dict) -> list[str]:
            answer = requests.post(f"{server.url}/completions", json={"model": "tiny", **body}, timeout=60)
            assert answer.status_code == 200, answer.text
            return [choice["text"] for choice in answer.json()["choices"]]

        beam4 = complete({"prompt": sentence, "max_tokens": 16, "use_beam_search": True, "best_of": 4})
        with ThreadPoolExecutor(8) as pool:
            together = list(pool.map(complete, bodies))
        chat = requests.post(
            f"{server.url}/chat/completions",
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": sentence}],
                "max_tokens": 16,
                "use_beam_search": True,
                "best_of": 4,
            },
            timeout=60,
        ).json()
    assert beam4 == [printed] and len(printed) > 3
    assert chat["choices"][0]["message"]["content"] == printed
    for body, texts in zip(bodies, together):
        source = tok.encode(body["prompt"], add_eos=True)
        beam = BeamSettings(3, 2) if body.get("use_beam_search") else None
        rows = _generate(model, source, 16, beam)
        assert texts == [tok.decode([t for t in row if t != model.spec.eos_token_id]) for row in rows]


def test_a_served_decoders_beam_chat_is_generates_beams_of_the_rendered_prompt(
    server: Server, pretrained: zoo.Pretrained
) -> None:
    """A decoder's chat through the template, its end of turn (here the eos) as generate's eos_token_id: the n
    choices are generate's num_return_sequences, best first, each with its finish reason and tokens counted."""
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the cat"}]
    body = {"model": MODEL_NAME, "messages": messages, "max_tokens": 12, "use_beam_search": True}
    answer = requests.post(f"{server.url}/chat/completions", json=body | {"best_of": 3, "n": 2}, timeout=60)
    assert answer.status_code == 200, answer.text
    choices = answer.json()["choices"]
    tok, model = pretrained.tokenizer, pretrained.model
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True)
    rows = _generate(model, prompt, 12, BeamSettings(3, 2), eos_token_id=[tok.eos_id])
    assert [c["message"]["content"] for c in choices] == [
        tok.decode([t for t in r if t != tok.eos_id]) for r in rows
    ]
    assert [c["finish_reason"] for c in choices] == [
        "stop" if r[-1] == tok.eos_id else "length" for r in rows
    ]
    assert [c["index"] for c in choices] == [0, 1] and answer.json()["usage"]["completion_tokens"] == sum(
        map(len, rows)
    )
