"""Log-probabilities: completions ``logprobs`` with ``echo`` (``max_tokens`` 0 too) and chat ``logprobs`` +
``top_logprobs``, through the real `openai` client and the engine itself, equal to the model's own
log-softmax (``model(ids)`` in float32) within 1e-4, whatever is prefilled beside them or however the
prompt is chunked."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import torch

import zoo
from tests.serving.conftest import MODEL_NAME
from zoo.serving import Engine
from zoo.serving.requests import Completion, Done, Event
from zoo.serving.server import Server

TOL = 1e-4


@pytest.fixture(scope="module")
def chunked(pretrained: zoo.Pretrained) -> Iterator[Server]:
    """A server whose prefill runs 6 padded tokens a chunk: a prompt's scores span several chunks."""
    engine = Engine(pretrained.model, pretrained.tokenizer, max_batch=4, max_length=96, prefill_tokens=6)
    with Server(engine, pretrained.tokenizer, model_name=MODEL_NAME) as running:
        yield running


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


def _reference(model: Any, ids: list[int]) -> torch.Tensor:
    """(len(ids) - 1, V): the log-probabilities of the tokens after each position, from a plain forward."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].float(), dim=-1)


def _greedy(model: Any, ids: list[int], count: int) -> list[int]:
    """``ids`` and ``count`` greedy tokens after them (the engine's greedy output equals generate's)."""
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=count, do_sample=False)
    return [int(i) for i in out[0]]


def _prompt(pretrained: zoo.Pretrained, text: str) -> list[int]:
    return pretrained.tokenizer.encode(text, add_bos=True, add_eos=False)


def test_echo_logprobs_equal_the_models_log_softmax(chunked: Server, pretrained: zoo.Pretrained) -> None:
    text = "the cat number 12 sat on the mat 84 and the dog ran off"
    ids = _prompt(pretrained, text)
    assert len(ids) > 12  # several 6-token chunks
    out = _client(chunked).completions.create(
        model=MODEL_NAME, prompt=text, echo=True, logprobs=3, max_tokens=4, temperature=0
    )
    choice = out.choices[0]
    lp = choice.logprobs
    assert lp is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    assert choice.text.startswith(text) and len(lp.token_logprobs) == len(ids) + 4
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    generated = out.usage is not None and out.usage.completion_tokens
    assert generated == 4
    whole = _greedy(pretrained.model, ids, 4)
    ref = _reference(pretrained.model, whole)
    expected = ref.gather(1, torch.tensor(whole[1:])[:, None]).squeeze(1)
    assert torch.allclose(torch.tensor(lp.token_logprobs[1:]), expected, atol=TOL)
    for position, top in enumerate(lp.top_logprobs[1:]):
        assert top is not None and 3 <= len(top) <= 4  # the 3 best and the chosen token
        best = ref[position].topk(3).values
        assert sorted(top.values(), reverse=True)[:3] == pytest.approx(best.tolist(), abs=TOL)
    assert lp.text_offset is not None and lp.text_offset[0] == 0


def test_max_tokens_0_with_echo_scores_the_prompt_only(chunked: Server, pretrained: zoo.Pretrained) -> None:
    ids = _prompt(pretrained, "the dog ran off the mat 7 and the cat sat")
    out = _client(chunked).completions.create(
        model=MODEL_NAME, prompt=[ids], echo=True, logprobs=1, max_tokens=0, temperature=0
    )
    lp = out.choices[0].logprobs
    assert lp is not None and lp.token_logprobs is not None
    assert out.usage is not None and out.usage.completion_tokens == 0
    assert len(lp.token_logprobs) == len(ids) and out.choices[0].finish_reason == "length"
    ref = _reference(pretrained.model, ids)
    expected = ref.gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)
    assert torch.allclose(torch.tensor(lp.token_logprobs[1:]), expected, atol=TOL)


def test_prompts_prefilled_together_are_each_scored_as_alone(pretrained: zoo.Pretrained) -> None:
    """Left padding and chunk edges: prompts of different lengths in one prefill group, through the engine."""
    engine = Engine(pretrained.model, pretrained.tokenizer, max_batch=4, max_length=96, prefill_tokens=64)
    prompts = [_prompt(pretrained, t) for t in ("the cat", "the dog ran off the mat 9", "the mat 3 and")]
    done: dict[int, Done] = {}
    finished = threading.Event()

    def emit(i: int) -> Any:
        def put(event: Event) -> None:
            if isinstance(event, Done):
                done[i] = event
                if len(done) == len(prompts):
                    finished.set()

        return put

    engine.start()
    try:
        engine.submit(
            [
                Completion(prompt=p, max_tokens=3, emit=emit(i), logprobs=2, echo=True)
                for i, p in enumerate(prompts)
            ]
        )
        assert finished.wait(60)
    finally:
        engine.close()
    for i, ids in enumerate(prompts):
        d = done[i]
        assert [e.token for e in d.prompt_logprobs] == ids and d.prompt_logprobs[0].logprob is None
        whole = [*ids, *d.token_ids]
        ref = _reference(pretrained.model, whole)
        got = [e.logprob for e in (*d.prompt_logprobs[1:], *d.logprobs)]
        expected = ref.gather(1, torch.tensor(whole[1:])[:, None]).squeeze(1)
        assert torch.allclose(torch.tensor(got), expected, atol=TOL)
        for e, row in zip((*d.prompt_logprobs[1:], *d.logprobs), ref, strict=True):
            assert [t for t, _ in e.top] == row.topk(2).indices.tolist()


def test_chat_top_logprobs_are_sorted_and_are_the_models(server: Server, pretrained: zoo.Pretrained) -> None:
    messages = [{"role": "user", "content": "the cat"}]
    client = _client(server)
    out = client.chat.completions.create(
        model=MODEL_NAME,
        messages=messages,  # type: ignore[arg-type]
        logprobs=True,
        top_logprobs=5,
        max_tokens=6,
        temperature=0,
    )
    content = out.choices[0].logprobs and out.choices[0].logprobs.content
    assert content is not None and len(content) == 6
    prompt = pretrained.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    whole = _greedy(pretrained.model, list(prompt), 6)
    generated = whole[len(prompt) :]
    ref = _reference(pretrained.model, whole)[len(prompt) - 1 :]
    for item, row, token in zip(content, ref, generated, strict=True):
        values = [t.logprob for t in item.top_logprobs]
        assert len(values) == 5 and values == sorted(values, reverse=True)
        assert values == pytest.approx(row.topk(5).values.tolist(), abs=TOL)
        assert item.logprob == pytest.approx(float(row[token]), abs=TOL)
        assert item.top_logprobs[0].token == item.token  # greedy: the chosen token is the best one
        assert item.bytes == list(item.token.encode())
    # streamed: the same entries, spread over the chunks
    chunks = client.chat.completions.create(
        model=MODEL_NAME,
        messages=messages,  # type: ignore[arg-type]
        logprobs=True,
        top_logprobs=5,
        max_tokens=6,
        temperature=0,
        stream=True,
    )
    streamed = [
        item
        for c in chunks
        for choice in c.choices
        if choice.logprobs
        for item in choice.logprobs.content or []
    ]
    assert [i.token for i in streamed] == [i.token for i in content]
    assert [i.logprob for i in streamed] == pytest.approx([i.logprob for i in content], abs=TOL)


def test_logprobs_do_not_change_the_text(server: Server) -> None:
    client = _client(server)
    plain = client.completions.create(model=MODEL_NAME, prompt="the cat", max_tokens=8, temperature=0)
    scored = client.completions.create(
        model=MODEL_NAME, prompt="the cat", max_tokens=8, temperature=0, logprobs=0, echo=True
    )
    assert scored.choices[0].text == "the cat" + plain.choices[0].text
    lp = scored.choices[0].logprobs
    assert lp is not None and lp.top_logprobs is not None
    assert all(top is None or len(top) == 1 for top in lp.top_logprobs)  # logprobs 0: the chosen token
