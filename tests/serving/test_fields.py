"""Nothing a client sends is silently ignored: through the real `openai` client, every field is acted on
(the sampling extensions top_k, min_p, repetition_penalty, the penalties, logit_bias), accepted as a label
(user), or a 400 naming it (unknown keys, fields not supported yet)."""

from __future__ import annotations

from typing import Any

import openai
import pytest
import requests

import zoo
from tests.serving.conftest import MODEL_NAME
from zoo.generation.text import TextStream
from zoo.serving.server import Server

MESSAGES = [{"role": "user", "content": "the cat"}]


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


def _complete(server: Server, **fields: Any) -> str:
    extra = {k: fields.pop(k) for k in ("top_k", "min_p", "repetition_penalty") if k in fields}
    out = _client(server).completions.create(
        model=MODEL_NAME, prompt="the cat", extra_body=extra, **({"max_tokens": 8} | fields)
    )
    return out.choices[0].text


REFUSED = [  # (endpoint, fields, the param named)
    ("completions", {"max_tokns": 5}, "max_tokns"),
    ("completions", {"messages": MESSAGES}, "messages"),  # a chat field on the completions route
    ("completions", {"logprobs": 21}, "logprobs"),
    ("completions", {"logprobs": True}, "logprobs"),  # an integer, not a boolean
    ("completions", {"echo": True, "stream": True}, "echo"),
    ("completions", {"max_tokens": 0}, "max_tokens"),  # 0 only with echo
    ("completions", {"best_of": 2}, "best_of"),
    ("completions", {"min_tokens": 4}, "min_tokens"),
    ("completions", {"stream_options": {"include_usage": True}}, "stream_options"),  # without stream
    ("completions", {"stream": True, "stream_options": {"extra": 1}}, "stream_options.extra"),
    ("completions", {"top_p": 0.5}, "top_p"),  # at temperature 0: greedy search, no effect
    ("completions", {"top_k": 5}, "top_k"),
    ("completions", {"min_p": 0.1}, "min_p"),
    ("completions", {"logit_bias": {"cat": 3}}, "logit_bias"),
    ("completions", {"logit_bias": {"5": 101}}, "logit_bias"),
    ("completions", {"logit_bias": {"100000": 1}}, "logit_bias"),  # outside the vocabulary
    ("completions", {"presence_penalty": 2.5}, "presence_penalty"),
    ("completions", {"repetition_penalty": 0}, "repetition_penalty"),
    ("completions", {"stop_token_ids": [-1]}, "stop_token_ids"),
    ("completions", {"user": 7}, "user"),
    ("chat", {"max_tokens": 5, "max_completion_tokens": 6}, "max_completion_tokens"),
    ("chat", {"best_of": 2}, "best_of"),  # beam search's width: without use_beam_search
    ("completions", {"length_penalty": 0.6}, "length_penalty"),  # a beam setting without beams
    ("chat", {"use_beam_search": True, "early_stopping": True}, "early_stopping"),  # one beam: greedy
    ("completions", {"use_beam_search": True, "best_of": 2, "n": 3}, "n"),
    ("completions", {"use_beam_search": True, "best_of": 9}, "best_of"),  # more than the 8 slots
    ("completions", {"use_beam_search": True, "best_of": 2, "early_stopping": "soon"}, "early_stopping"),
    ("completions", {"use_beam_search": True, "best_of": 2, "temperature": 0.7}, "temperature"),
    ("completions", {"use_beam_search": True, "best_of": 2, "top_k": 5}, "top_k"),
    ("completions", {"use_beam_search": True, "best_of": 2, "stream": True}, "stream"),
    ("completions", {"use_beam_search": True, "best_of": 2, "logprobs": 1}, "logprobs"),
    ("chat", {"use_beam_search": True, "best_of": 2, "logprobs": True}, "logprobs"),
    ("completions", {"use_beam_search": True, "best_of": 2, "echo": True, "logprobs": 0}, "logprobs"),
    ("completions", {"use_beam_search": True, "best_of": 2, "stop": ["x"]}, "stop"),
    ("completions", {"use_beam_search": True, "best_of": 2, "presence_penalty": 1.0}, "presence_penalty"),
    ("completions", {"use_beam_search": True, "best_of": 2, "logit_bias": {"5": 1}}, "logit_bias"),
    ("chat", {"use_beam_search": True, "best_of": 2, "guided_choice": ["a", "b"]}, "guided_choice"),
    ("chat", {"logprobs": 1}, "logprobs"),  # a boolean
    ("chat", {"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
    ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("chat", {"echo": True}, "echo"),  # a completions field
    ("chat", {"response_format": {"type": "xml"}}, "response_format.type"),
    (
        "chat",
        {"response_format": {"type": "json_schema", "json_schema": {"schema": 3}}},
        "response_format.json_schema.schema",
    ),
    ("chat", {"response_format": {"type": "json_object"}, "guided_regex": "a+"}, "guided_regex"),
    ("completions", {"guided_choice": []}, "guided_choice"),
    ("chat", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ("chat", {"tool_choice": "auto"}, "tool_choice"),
    ("chat", {"parallel_tool_calls": False}, "parallel_tool_calls"),
    ("chat", {"functions": [{"name": "f"}]}, "functions"),
    ("chat", {"function_call": "auto"}, "function_call"),
    ("chat", {"metadata": {"a": "b"}}, "metadata"),
    ("chat", {"store": True}, "store"),
    ("chat", {"service_tier": "flex"}, "service_tier"),
    ("chat", {"modalities": ["text", "audio"]}, "modalities"),
    ("chat", {"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ("chat", {"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ("chat", {"reasoning_effort": "low"}, "reasoning_effort"),
    ("chat", {"web_search_options": {}}, "web_search_options"),
    ("chat", {"prompt_cache_key": "k"}, "prompt_cache_key"),
    ("chat", {"verbosity": "low"}, "verbosity"),
    ("chat", {"messages": [{"role": "user", "content": "x", "name": "ann"}]}, "messages[0].name"),
    ("chat", {"messages": [{"role": "assistant", "content": "x", "refusal": "no"}]}, "messages[0].refusal"),
    (
        "chat",
        {"messages": [{"role": "tool", "content": "4", "tool_call_id": "c1"}]},
        "messages[0].tool_call_id",
    ),
    ("chat", {"messages": [{"role": "user", "content": "x", "colour": "red"}]}, "messages[0].colour"),
]


@pytest.mark.parametrize(("endpoint", "fields", "param"), REFUSED, ids=[p for _, _, p in REFUSED])
def test_a_field_zoo_would_not_act_on_is_a_400_naming_it(
    server: Server, endpoint: str, fields: dict, param: str
) -> None:
    """Through the real client (``extra_body`` for what its signature lacks), as a user would send it."""
    client = _client(server)
    base: dict[str, Any] = {"model": MODEL_NAME, "temperature": 0}
    if endpoint == "completions":
        call = client.completions.create
        base |= {"prompt": "the cat", "max_tokens": 2}
    else:
        call = client.chat.completions.create  # type: ignore[assignment]
        base |= {"messages": fields.pop("messages", MESSAGES)}
        base |= {} if "max_completion_tokens" in fields else {"max_tokens": 2}
    with pytest.raises(openai.BadRequestError) as caught:
        call(**base, extra_body=fields)
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == param, error
    assert error["type"] == "invalid_request_error" and param.split(".")[-1].split("[")[0] in error["message"]
    assert server.engine._in_flight == 0  # nothing was queued


def test_an_unknown_field_suggests_the_known_one(server: Server) -> None:
    body = {"model": MODEL_NAME, "prompt": "the cat", "max_tokns": 5}
    error = requests.post(server.url + "/completions", json=body, timeout=30).json()["error"]
    assert error["message"] == "unknown field 'max_tokns' for /v1/completions (did you mean max_tokens?)"


@pytest.mark.parametrize(
    "fields",
    [
        {"user": "ann", "safety_identifier": "hash"},  # labels
        {"seed": 3, "top_p": 1.0, "top_k": 0, "min_p": 0.0},  # nothing to do at temperature 0
        {"logprobs": False, "store": False, "response_format": {"type": "text"}, "modalities": ["text"]},
        {"max_tokens": 8, "max_completion_tokens": 8, "tools": None, "presence_penalty": 0},
    ],
)
def test_labels_and_values_that_ask_for_nothing_are_accepted(server: Server, fields: dict) -> None:
    client = _client(server)
    plain = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=8, temperature=0)  # type: ignore[arg-type]
    base = {} if "max_tokens" in fields else {"max_tokens": 8}
    out = client.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,  # type: ignore[arg-type]
        temperature=0,
        extra_body=fields | base,
    )
    assert out.choices[0].message.content == plain.choices[0].message.content


def test_logit_bias_plus_100_makes_every_token_that_token(server: Server, pretrained: zoo.Pretrained) -> None:
    tok = pretrained.tokenizer
    prompt = tok.encode("the cat", add_bos=True, add_eos=False)
    token = tok.encode(" dog", add_bos=False, add_eos=False)[-1]
    text = TextStream(tok, prompt_ids=prompt)
    expected = "".join(text.push(t) for t in [token] * 8) + text.flush()
    for temperature in (0.0, 1.0):
        got = _complete(server, temperature=temperature, seed=0, logit_bias={str(token): 100})
        assert got == expected, temperature


def test_top_k_min_p_and_penalties_are_acted_on(server: Server) -> None:
    greedy = _complete(server, temperature=0)
    assert _complete(server, temperature=1.0, top_k=1, seed=1) == greedy  # top-k 1 is greedy search
    assert _complete(server, temperature=1.5, min_p=1.0, seed=2) == greedy  # only the best stays
    sampled = [_complete(server, temperature=1.0, top_k=40, min_p=0.05, seed=s) for s in (3, 3, 4)]
    assert sampled[0] == sampled[1] != sampled[2]
    long = _complete(server, temperature=0, max_tokens=40)  # long enough that greedy search repeats
    for penalty in (
        {"frequency_penalty": 2.0},
        {"presence_penalty": 2.0},
        {"repetition_penalty": 1.8},
    ):
        assert _complete(server, temperature=0, max_tokens=40, **penalty) != long, penalty
