"""Structured output through `zoo serve` (`zoo.serving.structured`): the real openai client's json_schema
answers at temperature 1 all validate; a constrained row beside a free one leaves the free one's greedy
text unchanged; a schema the engine cannot compile is a 400 naming it."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest

from tests.grammar_support import PERSON, byte_level_tokenizer, decoder_for
from zoo.generation.constrain import Grammar
from zoo.serving import Engine
from zoo.serving.requests import Completion, Done, Event
from zoo.serving.server import Server


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Any, Any, Server]]:
    tokenizer = byte_level_tokenizer()
    model = decoder_for(tokenizer)
    engine = Engine(model, tokenizer, max_batch=4, max_length=128)
    with Server(engine, tokenizer, model_name="tiny") as running:
        yield model, tokenizer, running


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=60)


def test_five_json_schema_answers_at_temperature_1_validate(served) -> None:  # type: ignore[no-untyped-def]
    _, _, server = served
    client = _client(server)
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    for seed in range(5):
        answer = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "a cat"}],
            response_format=fmt,  # type: ignore[arg-type]
            temperature=1.0,
            seed=seed,
            max_tokens=100,
        )
        choice = answer.choices[0]
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content or ""), PERSON)


def test_streamed_json_and_the_extensions(served) -> None:  # type: ignore[no-untyped-def]
    _, _, server = served
    client = _client(server)
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    chunks = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "a dog"}],
        response_format=fmt,  # type: ignore[arg-type]
        stream=True,
        seed=7,
        max_tokens=100,
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), PERSON)
    choice = client.completions.create(
        model="tiny", prompt="the cat", max_tokens=20, seed=1, extra_body={"guided_choice": ["cat", "dog"]}
    ).choices[0]
    assert choice.text in ("cat", "dog") and choice.finish_reason == "stop"
    regex = client.completions.create(
        model="tiny", prompt="the cat", max_tokens=20, seed=1, extra_body={"guided_regex": "[0-9]{2}(ab|cd)"}
    ).choices[0]
    assert len(regex.text) == 4 and regex.text[:2].isdigit() and regex.text[2:] in ("ab", "cd")


def test_a_schema_the_engine_cannot_compile_is_a_400_naming_it(served) -> None:  # type: ignore[no-untyped-def]
    _, _, server = served
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}
    with pytest.raises(openai.BadRequestError) as caught:
        _client(server).chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            response_format=fmt,  # type: ignore[arg-type]
        )
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == "response_format.json_schema.schema"
    assert "objectx" in error["message"]


def test_a_free_row_beside_constrained_ones_is_unchanged() -> None:
    tokenizer = byte_level_tokenizer()
    model = decoder_for(tokenizer)
    prompt = tokenizer.encode("the cat sat", add_eos=False)
    grammar = Grammar.json_schema(PERSON)

    def run(requests: list[tuple[str, dict[str, Any]]]) -> dict[str, Done]:
        engine = Engine(model, tokenizer, max_batch=4, max_length=128).start()
        finished: dict[str, Done] = {}
        left = threading.Semaphore(0)

        def emit(name: str) -> Any:
            def on(event: Event) -> None:
                if isinstance(event, Done):
                    finished[name] = event
                    left.release()

            return on

        engine.submit([Completion(prompt=prompt, emit=emit(n), **kw) for n, kw in requests])
        for _ in requests:
            assert left.acquire(timeout=60)
        engine.close()
        return finished

    free = {"max_tokens": 24, "ignore_eos": True}
    alone = run([("free", free)])["free"]
    mixed = run(
        [
            ("json0", {"max_tokens": 100, "grammar": grammar, "temperature": 1.0, "seed": 0}),
            ("free", free),
            ("json1", {"max_tokens": 100, "grammar": grammar}),
        ]
    )
    assert mixed["free"].token_ids == alone.token_ids
    for name in ("json0", "json1"):
        jsonschema.validate(json.loads(mixed[name].text), PERSON)


def test_a_grammar_failing_mid_answer_fails_its_request_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A grammar error inside the batched step (the engine cannot advance a row) fails that request only:
    the free request and the healthy constrained one beside it finish as they would alone."""
    from zoo.generation import constrain as module
    from zoo.generation.constrain import GrammarError
    from zoo.serving.requests import Failed

    tokenizer = byte_level_tokenizer()
    model = decoder_for(tokenizer)
    prompt = tokenizer.encode("the cat sat", add_eos=False)
    good, broken = Grammar.json_schema(PERSON), Grammar.json_schema(PERSON)
    init, advance = module.Constraint.__init__, module.Constraint.advance

    def tagged_init(self: Any, grammar: Grammar, *args: Any, **kwargs: Any) -> None:
        init(self, grammar, *args, **kwargs)
        self.steps, self.broken = 0, grammar is broken

    def failing_advance(self: Any, token: int) -> None:
        self.steps += 1
        if self.broken and self.steps == 3:
            raise GrammarError("structured output: token 7: the test's grammar broke")
        advance(self, token)

    monkeypatch.setattr(module.Constraint, "__init__", tagged_init)
    monkeypatch.setattr(module.Constraint, "advance", failing_advance)
    engine = Engine(model, tokenizer, max_batch=4, max_length=128).start()
    events: dict[str, Event] = {}
    left = threading.Semaphore(0)

    def emit(name: str) -> Any:
        def on(event: Event) -> None:
            if isinstance(event, Done | Failed):
                events[name] = event
                left.release()

        return on

    free = {"max_tokens": 24, "ignore_eos": True}
    engine.submit(
        [
            Completion(prompt=prompt, emit=emit("good"), max_tokens=100, grammar=good),
            Completion(prompt=prompt, emit=emit("broken"), max_tokens=100, grammar=broken),
            Completion(prompt=prompt, emit=emit("free"), **free),
        ]
    )
    for _ in range(3):
        assert left.acquire(timeout=60)
    engine.close()
    assert isinstance(events["broken"], Failed) and "the test's grammar broke" in events["broken"].message
    assert isinstance(events["good"], Done) and isinstance(events["free"], Done)
    jsonschema.validate(json.loads(events["good"].text), PERSON)
