"""Bad calls fail with a ValueError that names the problem, before the model computes anything."""

from __future__ import annotations

import warnings

import pytest
import torch

import zoo
from zoo.generation import stream


@pytest.fixture
def guarded(tiny):
    """``guarded(name)``: a tiny model whose every forward fails the test (so errors must come first)."""

    def build(name: str) -> zoo.ZooModel:
        model = tiny(name)

        def refuse(*_):
            raise AssertionError("the model ran before the arguments were validated")

        for module in (model.embed, model.decoder, getattr(model, "encoder", None)):
            if module is not None:
                module.register_forward_pre_hook(refuse)
        return model

    return build


OK = torch.tensor([[5, 6, 7]])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            dict(input_ids=torch.randint(3, 500, (1, 129))),
            r"prompt has 129 tokens, more than .*max_positions \(128\)",
        ),
        (
            dict(input_ids=torch.randint(3, 500, (1, 100)), max_new_tokens=40),
            r"100 prompt tokens \+ max_new_tokens \(40\) = 140 exceeds .*max_positions \(128\)",
        ),
        (dict(input_ids=torch.zeros(1, 0, dtype=torch.long)), r"empty prompt"),
        (dict(input_ids=torch.zeros(0, 4, dtype=torch.long)), r"empty prompt"),
        (dict(input_ids=torch.tensor([[5, 512]])), r"token id 512, outside the vocabulary \[0, 512\)"),
        (dict(input_ids=torch.tensor([[-1, 5]])), r"token id -1, outside the vocabulary"),
        (dict(input_ids=torch.tensor([5, 6])), r"input_ids must be a \(batch, length\) tensor, got \(2,\)"),
        (dict(input_ids=torch.tensor([[0.5]])), r"integer token ids"),
        (dict(num_beams=0), r"num_beams must be an int >= 1, got 0"),
        (dict(num_beams=1025), r"num_beams \(1025\) is over the limit of 1024: each beam copies"),
        (dict(num_beams=10**6), r"num_beams \(1000000\) is over the limit of 1024"),
        (
            dict(num_beams=600, max_new_tokens=1),
            r"num_beams \(600\) is more than the vocab_size \*\* max_new_tokens = 512 \*\* 1 = 512 different",
        ),
        (dict(top_p=0.0, do_sample=True), r"top_p must be in \(0, 1\], got 0.0"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\], got 1.5"),
        (dict(top_k=-1), r"top_k must be None or an int >= 0"),
        (dict(temperature=-0.5), r"temperature must be a finite number >= 0 \(0: greedy search\)"),
        (dict(temperature=float("nan")), r"temperature must be a finite number >= 0"),
        (dict(max_new_tokens=0), r"max_new_tokens must be an int >= 1, got 0"),
        (dict(min_new_tokens=-2), r"min_new_tokens must be an int >= 0"),
        (dict(repetition_penalty=0.0), r"repetition_penalty must be > 0"),
        (dict(no_repeat_ngram_size=-1), r"no_repeat_ngram_size must be an int >= 0"),
        (dict(early_stopping="soon"), r"early_stopping must be True, False or 'never'"),
        (dict(eos_token_id=600), r"eos_token_id \(600\) must be token ids in \[0, 512\)"),
        (dict(eos_token_id=[2, -1]), r"eos_token_id \(\[2, -1\]\) must be token ids"),
        (dict(pad_token_id=512), r"pad_token_id \(512\) must be token ids"),
        (dict(attention_mask=torch.ones(1, 4)), r"attention_mask has shape \(1, 4\), expected \(1, 3\)"),
        (dict(attention_mask=torch.tensor([[0, 0, 0]])), r"row of attention_mask has no tokens"),
        (dict(attention_mask=torch.tensor([[1, 1, 0]])), r"must be left-padded"),
        (dict(seed=1, generator=torch.Generator()), r"a generator or a seed, not both"),
        (dict(num_beams=2, streamer=print), r"streamer works with greedy search and sampling"),
    ],
)
def test_bad_decoder_calls_raise_before_any_compute(guarded, kwargs, message):
    model = guarded("gpt2-tiny")
    input_ids = kwargs.pop("input_ids", OK)
    with pytest.raises(ValueError, match=message):
        model.generate(input_ids, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            dict(input_ids=torch.randint(3, 500, (2, 130))),
            r"source has 130 tokens, more than .*max_positions \(128\)",
        ),
        (dict(max_new_tokens=128), r"1 start token \+ max_new_tokens \(128\) = 129 exceeds"),
        (dict(input_ids=torch.zeros(2, 0, dtype=torch.long)), r"empty source"),
        (dict(input_ids=torch.tensor([[3, 999]])), r"token id 999, outside the vocabulary \[0, 512\)"),
    ],
)
def test_bad_encoder_decoder_calls_raise_before_any_compute(guarded, kwargs, message):
    model = guarded("t5-tiny")
    input_ids = kwargs.pop("input_ids", OK)
    with pytest.raises(ValueError, match=message):
        model.generate(input_ids, **kwargs)


# -- temperature 0 is greedy search; sampling settings without sampling are a warning ---------------------


@pytest.mark.parametrize("name", ["gpt2-tiny", "t5-tiny"])
def test_sampling_at_temperature_zero_is_greedy_search(tiny, name):
    """As in the OpenAI API and vLLM (and zoo serve): temperature 0 takes the argmax."""
    model = tiny(name)
    greedy = model.generate(OK, max_new_tokens=6, eos_token_id=[])
    zero = model.generate(OK, max_new_tokens=6, eos_token_id=[], do_sample=True, temperature=0, seed=1)
    assert torch.equal(zero, greedy)
    beams = model.generate(OK, max_new_tokens=4, num_beams=2, eos_token_id=[])
    assert torch.equal(
        model.generate(OK, max_new_tokens=4, num_beams=2, eos_token_id=[], do_sample=True, temperature=0.0),
        beams,
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(temperature=0.7), r"^generate: temperature=0.7 has no effect: do_sample is False"),
        (
            dict(temperature=0.7, top_p=0.9),
            r"^generate: temperature=0.7, top_p=0.9 have no effect: do_sample",
        ),
        (
            dict(top_k=5, num_beams=2),
            r"^generate: top_k=5 has no effect: do_sample is False \(greedy or beam",
        ),
        (
            dict(do_sample=True, temperature=0, top_p=0.8),
            r"^generate: top_p=0.8 has no effect: temperature 0 is",
        ),
    ],
)
def test_sampling_settings_that_change_nothing_are_a_warning_naming_them(tiny, kwargs, message):
    """As transformers warns: the search runs as it would without them."""
    model = tiny("gpt2-tiny")
    plain = {k: v for k, v in kwargs.items() if k == "num_beams"}
    with pytest.warns(UserWarning, match=message):
        out = model.generate(OK, max_new_tokens=4, eos_token_id=[], **kwargs)
    assert torch.equal(out, model.generate(OK, max_new_tokens=4, eos_token_id=[], **plain))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),
        dict(temperature=0),  # greedy, as asked
        dict(temperature=1.0, top_k=0, top_p=1.0),  # their "off" values
        dict(do_sample=True, temperature=0.7, top_k=5, top_p=0.9, seed=0),
    ],
)
def test_settings_that_all_act_give_no_warning(tiny, kwargs):
    model = tiny("gpt2-tiny")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.generate(OK, max_new_tokens=2, **kwargs)


def test_right_padded_sources_are_fine_for_an_encoder_decoder(tiny):
    model = tiny("t5-tiny")
    out = model.generate(
        torch.tensor([[5, 6, 0]]), attention_mask=torch.tensor([[1, 1, 0]]), max_new_tokens=3
    )
    assert out.shape[0] == 1


def test_a_prompt_that_exactly_fills_max_positions_is_accepted(tiny):
    model = tiny("gpt2-tiny")
    out = model.generate(torch.randint(3, 500, (1, 120)), max_new_tokens=8, eos_token_id=[])
    assert out.shape == (1, 128)


def test_models_without_an_lm_head_cannot_generate():
    with pytest.raises(
        ValueError, match="decoder or encoder-decoder model with an LM head; got family 'encoder'"
    ):
        zoo.generation.generate(zoo.build("bert-tiny"), OK)
    with pytest.raises(ValueError, match="lm_head: null"):
        zoo.generation.generate(zoo.build(zoo.preset("gpt2-tiny").override(lm_head=None)), OK)


def test_stream_checks_its_arguments_when_called_not_when_iterated(guarded):
    model = guarded("gpt2-tiny")
    with pytest.raises(ValueError, match="top_p"):
        stream(model, OK, top_p=2.0)
    with pytest.raises(ValueError, match="beam search"):
        stream(model, OK, num_beams=2)
    with pytest.raises(TypeError, match="unexpected arguments: beams"):
        stream(model, OK, beams=2)


def test_beams_are_bounded_by_the_continuations_the_vocabulary_allows(guarded):
    model = guarded("gpt2-tiny")
    with pytest.raises(ValueError, match=r"vocab_size \*\* max_new_tokens = 512 \*\* 1 = 512"):
        model.generate(OK, num_beams=513, max_new_tokens=1)
    tiny_vocab = zoo.build(zoo.preset("gpt2-tiny").override(vocab_size=6))
    with pytest.raises(ValueError, match=r"6 \*\* 2 = 36 different continuations"):
        tiny_vocab.generate(torch.tensor([[3, 4]]), num_beams=37, max_new_tokens=2, eos_token_id=[])
    assert tiny_vocab.generate(
        torch.tensor([[3, 4]]), num_beams=36, max_new_tokens=2, eos_token_id=[]
    ).shape == (1, 4)


def test_a_bad_value_is_quoted_briefly_however_large_it_is(guarded):
    model = guarded("gpt2-tiny")
    with pytest.raises(ValueError) as error:
        model.generate(OK, top_k=[[1] * 1000] * 1000)
    assert "top_k must be None or an int >= 0" in str(error.value) and len(str(error.value)) < 300


@pytest.mark.parametrize("settings", [{}, {"do_sample": True, "seed": 0}, {"num_beams": 2}])
def test_nan_logits_stop_generation_naming_the_step(settings) -> None:
    model = zoo.build("gpt2-tiny").eval()
    with torch.no_grad():
        model.decoder.final_norm.weight.fill_(float("nan"))  # every logit NaN from the first step
    with pytest.raises(ValueError, match=r"NaN/inf logits at step 1"):
        model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=3, **settings)


def test_generate_refuses_a_float_mask_and_a_seed_torch_cannot_take() -> None:
    model = zoo.build("gpt2-tiny").eval()
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match=r"attention_mask must hold 1 \(token\) / 0 \(padding\)"):
        model.generate(ids, attention_mask=torch.ones(1, 3), max_new_tokens=2)
    with pytest.raises(ValueError, match=r"seed must be None or an int in \[0, 2\*\*64\)"):
        model.generate(ids, do_sample=True, seed=2**80, max_new_tokens=2)
