"""Structured output in `generate` (`zoo.generation.constrain`): every sampled text validates against its
schema, at temperature 1 and several seeds, with both kinds of tokenizer; the mask leaves free rows alone."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from tests.grammar_support import PERSON, byte_level_tokenizer, decoder_for, metaspace_tokenizer, prompt
from zoo.generation import generate
from zoo.generation.constrain import Constraint, Grammar, GrammarError, constrain, vocabulary

TOKENIZERS = {"metaspace": metaspace_tokenizer, "byte_level": byte_level_tokenizer}


@pytest.fixture(scope="module", params=sorted(TOKENIZERS))
def setup(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    tokenizer = TOKENIZERS[request.param]()
    return tokenizer, decoder_for(tokenizer)


def _texts(tokenizer, model, ids: torch.Tensor, out: torch.Tensor) -> list[str]:  # type: ignore[no-untyped-def]
    eos = model.spec.eos_token_id
    rows = []
    for row in out[:, ids.shape[1] :].tolist():
        assert eos in row, "every row ends on its eos: the grammar completes well before max_new_tokens"
        rows.append(tokenizer.decode(row[: row.index(eos)]))
    return rows


def test_sampled_json_validates_against_its_schema(setup) -> None:  # type: ignore[no-untyped-def]
    tokenizer, model = setup
    ids = prompt(tokenizer).repeat(3, 1)
    for seed in range(3):  # 9 texts at temperature 1
        out = generate(
            model, ids, json_schema=PERSON, tokenizer=tokenizer, do_sample=True, seed=seed, max_new_tokens=80
        )
        for text in _texts(tokenizer, model, ids, out):
            jsonschema.validate(json.loads(text), PERSON)


def test_free_text_of_the_same_model_is_not_json(setup) -> None:  # type: ignore[no-untyped-def]
    tokenizer, model = setup  # the check above can fail: without the grammar the model writes no JSON
    out = generate(model, prompt(tokenizer), do_sample=True, seed=0, max_new_tokens=30)
    with pytest.raises(ValueError):
        json.loads(tokenizer.decode(out[0, prompt(tokenizer).shape[1] :].tolist()))


def test_enum_regex_and_choice(setup) -> None:  # type: ignore[no-untyped-def]
    tokenizer, model = setup
    ids = prompt(tokenizer)
    enum = {
        "type": "object",
        "properties": {"a": {"enum": [1, 2]}},
        "required": ["a"],
        "additionalProperties": False,
    }
    cases = [
        (Grammar.json_schema(enum), lambda t: json.loads(t) in ({"a": 1}, {"a": 2})),
        (
            Grammar.regex(r"[0-9]{2,3}(cat|dog)"),
            lambda t: re.fullmatch(r"[0-9]{2,3}(cat|dog)", t) is not None,
        ),
        (Grammar.choice(["cat", "dog", "mat 7"]), lambda t: t in ("cat", "dog", "mat 7")),
    ]
    for grammar, holds in cases:
        for seed in range(2):
            out = generate(
                model, ids, grammar=grammar, tokenizer=tokenizer, do_sample=True, seed=seed, max_new_tokens=60
            )
            (text,) = _texts(tokenizer, model, ids, out)
            assert holds(text), (grammar.kind, text)


def test_greedy_json_is_the_most_likely_allowed_token_each_step(setup) -> None:  # type: ignore[no-untyped-def]
    tokenizer, model = setup
    ids = prompt(tokenizer)
    out = generate(model, ids, json_schema=PERSON, tokenizer=tokenizer, max_new_tokens=80)
    new = out[0, ids.shape[1] :].tolist()
    check = Constraint(Grammar.json_schema(PERSON), vocabulary(tokenizer, model.spec.vocab_size), stop=[2])
    check.stop = (model.spec.eos_token_id,)
    for i, token in enumerate(new):  # the model's own logits, masked: the argmax is the token generate chose
        logits = model(out[:, : ids.shape[1] + i]).logits[:, -1].float()
        assert int(constrain(logits, [check]).argmax()) == token
        check.advance(token)
        if check.done and token == model.spec.eos_token_id:
            break


def test_json_object_takes_any_object_and_nothing_else(setup) -> None:  # type: ignore[no-untyped-def]
    tokenizer, model = setup
    vocab = vocabulary(tokenizer, model.spec.vocab_size)
    end = model.spec.eos_token_id
    whole = Constraint(Grammar.json_object(), vocab, stop=[end])
    for token in vocab.engine.tokenize_str('{"k": [1, {"x": null}], "a": "b"}'):  # as the grammar spells it
        assert not whole.done
        whole.advance(token)
    assert whole.done  # the object is closed: only the end token may follow
    bits = torch.empty((model.spec.vocab_size + 31) // 32, dtype=torch.int32)
    whole.fill(bits)
    assert constrain(torch.zeros(1, model.spec.vocab_size), [whole]).isfinite().nonzero()[:, 1].tolist() == [
        end
    ]
    array = Constraint(Grammar.json_object(), vocab, stop=[end])
    with pytest.raises(GrammarError):
        array.advance(tokenizer.token_to_id("["))  # a JSON array is not an object


def test_constrain_leaves_free_rows_untouched(setup) -> None:  # type: ignore[no-untyped-def]
    tokenizer, model = setup
    V = model.spec.vocab_size
    scores = torch.randn(3, V)
    held = Constraint(Grammar.json_schema(PERSON), vocabulary(tokenizer, V))
    masked = constrain(scores, [None, held, None])
    assert torch.equal(masked[[0, 2]], scores[[0, 2]])
    allowed = masked[1].isfinite().nonzero().flatten().tolist()
    assert all(tokenizer.decode([t]).strip().startswith("{") for t in allowed)  # JSON's first byte
    assert max(allowed) < tokenizer.vocab_size  # the padded ids past the tokenizer's are never allowed


def test_a_stop_token_whose_text_is_valid_json_is_allowed_only_where_the_text_may_end() -> None:
    """A model whose eos is an ordinary token ("a", say) must not end inside a string that "a" continues."""
    tokenizer = byte_level_tokenizer()  # its prefix below encodes as the grammar writes it
    V = decoder_for(tokenizer).spec.vocab_size
    vocab = vocabulary(tokenizer, V)
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    inside = Constraint(Grammar.json_schema(schema), vocab)
    for token in tokenizer.encode('{"name": "', add_bos=False, add_eos=False):
        inside.advance(token)
    bits = torch.zeros((V + 31) // 32, dtype=torch.int32)
    inside.fill(bits)
    letters = [
        t
        for t in range(V)
        if tokenizer.decode([t]).strip().isalpha() and (int(bits[t // 32]) >> (t % 32)) & 1
    ]
    assert letters, "letters continue the string"
    stop = letters[0]
    held = Constraint(Grammar.json_schema(schema), vocab, stop=(stop,))
    for token in tokenizer.encode('{"name": "', add_bos=False, add_eos=False):
        held.advance(token)
    masked = constrain(torch.zeros(1, V), [held])
    assert not masked[0, stop].isfinite()  # inside the string: the stop token may not be taken as text
    for token in tokenizer.encode('x"}', add_bos=False, add_eos=False):
        held.advance(token)
    assert held.accepting and constrain(torch.zeros(1, V), [held])[0, stop].isfinite()


def test_refusals_are_one_line() -> None:
    with pytest.raises(GrammarError, match=r"cannot be compiled: .*objectx"):
        Grammar.json_schema({"type": "objectx"})
    with pytest.raises(GrammarError, match="not valid JSON"):
        Grammar.json_schema("{nope")
    with pytest.raises(GrammarError, match="regex cannot be compiled"):
        Grammar.regex("a(b")
    tokenizer = metaspace_tokenizer()
    model = decoder_for(tokenizer)
    ids = prompt(tokenizer)
    with pytest.raises(ValueError, match="needs tokenizer="):
        generate(model, ids, json_schema=PERSON)
    with pytest.raises(ValueError, match="not beams"):
        generate(model, ids, json_schema=PERSON, tokenizer=tokenizer, num_beams=2)
    with pytest.raises(ValueError, match="needs an end-of-sequence token"):
        generate(decoder_for(tokenizer, eos_token_id=None), ids, json_schema=PERSON, tokenizer=tokenizer)
