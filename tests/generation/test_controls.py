"""Generation controls on zoo's own models: a decoder prompt to continue, forced BOS / EOS, n results per
input (beam n-best, independent samples), banned words, and the checks that refuse bad settings up front."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.generation import GenerationConfig, stream_text
from zoo.generation.sampling import BadWords

SOURCE = torch.tensor([[5, 6, 7, 8, 9], [11, 12, 13, 0, 0]])
SOURCE_MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])


def _free(model: zoo.ZooModel, **settings) -> torch.Tensor:
    return model.generate(SOURCE, attention_mask=SOURCE_MASK, eos_token_id=[], **settings)


# -- decoder prompts ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("use_cache", [True, False])
def test_a_greedy_prefix_given_as_decoder_prompt_is_continued_the_same_way(encoder_decoder, use_cache):
    free = _free(encoder_decoder, max_new_tokens=8)  # (2, 9): start token, 8 new
    for cut in (1, 4):  # the start token alone; the start token and three tokens
        out = _free(
            encoder_decoder, max_new_tokens=8 - cut + 1, decoder_input_ids=free[:, :cut], use_cache=use_cache
        )
        assert torch.equal(out, free)


def test_a_decoder_prompt_without_the_start_token_is_given_it(encoder_decoder):
    free = _free(encoder_decoder, max_new_tokens=6)
    out = _free(encoder_decoder, max_new_tokens=3, decoder_input_ids=free[:, 1:4])
    assert torch.equal(out, free[:, :7])


@pytest.mark.parametrize("settings", [{}, {"num_beams": 3}])
def test_a_padded_decoder_prompt_row_decodes_as_it_would_alone(encoder_decoder, settings):
    """Ragged prompts, left-padded: positions count real tokens only, so the short row is unaffected."""
    start = encoder_decoder.spec.start_token_id
    prompt = torch.tensor([[start, 21, 22, 23], [0, 0, start, 31]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    both = _free(
        encoder_decoder, max_new_tokens=5, decoder_input_ids=prompt, decoder_attention_mask=mask, **settings
    )
    assert both.shape == (2, 4 + 5)
    for row, real in ((0, 4), (1, 2)):
        alone = encoder_decoder.generate(
            SOURCE[row : row + 1], attention_mask=SOURCE_MASK[row : row + 1], eos_token_id=[],
            max_new_tokens=5, decoder_input_ids=prompt[row : row + 1, -real:], **settings,
        )  # fmt: skip
        assert torch.equal(both[row, 4 - real :], alone[0]), (row, both, alone)


def test_ragged_prompts_without_the_start_token_get_it_before_their_first_real_token(tiny):
    model = tiny("bart-tiny")
    start = model.spec.start_token_id
    prompt, mask = torch.tensor([[21, 22, 23], [9, 9, 31]]), torch.tensor([[1, 1, 1], [0, 0, 1]])
    out = _free(model, max_new_tokens=2, decoder_input_ids=prompt, decoder_attention_mask=mask)
    assert out[0, :4].tolist() == [start, 21, 22, 23]
    assert out[1, 2:4].tolist() == [start, 31]
    empty = _free(
        model,
        max_new_tokens=2,
        decoder_input_ids=prompt,
        decoder_attention_mask=torch.zeros(2, 3, dtype=torch.long),
    )
    assert (empty[:, 3] == start).all()  # no real token: the start token alone, as without a prompt
    assert torch.equal(empty[:, 3:], _free(model, max_new_tokens=2))


# -- forced tokens -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("settings", [{}, {"num_beams": 3}, {"do_sample": True, "seed": 0}])
def test_forced_bos_is_the_first_generated_token(encoder_decoder, settings):
    out = _free(encoder_decoder, max_new_tokens=4, forced_bos_token_id=42, **settings)
    assert (out[:, 1] == 42).all()
    assert not (out[:, 2:] == 42).all()  # forced once, not at every step


def test_forced_bos_follows_transformers_only_on_a_one_token_sequence(tiny):
    model = tiny("gpt2-tiny")
    one = model.generate(torch.tensor([[5]]), max_new_tokens=2, forced_bos_token_id=42, eos_token_id=[])
    assert one[0, 1] == 42
    longer = torch.tensor([[5, 6]])
    assert torch.equal(
        model.generate(longer, max_new_tokens=2, forced_bos_token_id=42, eos_token_id=[]),
        model.generate(longer, max_new_tokens=2, eos_token_id=[]),
    )


@pytest.mark.parametrize("settings", [{}, {"num_beams": 2}])
def test_forced_eos_ends_every_row_that_reaches_max_new_tokens(tiny, settings):
    model = tiny("t5-tiny")
    free = _free(model, max_new_tokens=4, **settings)
    out = model.generate(
        SOURCE,
        attention_mask=SOURCE_MASK,
        max_new_tokens=4,
        eos_token_id=40,
        forced_eos_token_id=40,
        **settings,
    )
    assert (out[:, -1] == 40).all()
    if not settings:
        assert torch.equal(out[:, :-1], free[:, :-1])  # only the last step is forced


# -- n results per input -----------------------------------------------------------------------------------


def test_n_best_beams_come_grouped_best_first_and_the_first_is_the_one_best(encoder_decoder):
    one = _free(encoder_decoder, max_new_tokens=5, num_beams=4)
    out = _free(encoder_decoder, max_new_tokens=5, num_beams=4, num_return_sequences=3, return_scores=True)
    assert out.sequences.shape == (2 * 3, 6) and out.scores is not None
    assert torch.equal(out.sequences[::3], one)
    assert (out.scores.view(2, 3).diff(dim=1) <= 0).all()
    assert len({tuple(row) for row in out.sequences[:3].tolist()}) == 3  # distinct hypotheses


def test_n_best_scores_are_the_length_normalised_log_probabilities(tiny):
    model = tiny("transformer-tiny")
    out = _free(
        model, max_new_tokens=4, num_beams=3, num_return_sequences=3, length_penalty=0.5, return_scores=True
    )
    source = SOURCE.repeat_interleave(3, dim=0)
    mask = SOURCE_MASK.repeat_interleave(3, dim=0)
    with torch.no_grad():
        logits = model(source, attention_mask=mask, decoder_input_ids=out.sequences[:, :-1]).logits
    logp = logits.float().log_softmax(-1).gather(2, out.sequences[:, 1:, None]).squeeze(2).sum(-1)  # (6,)
    torch.testing.assert_close(out.scores, logp / 4**0.5, atol=1e-4, rtol=1e-4)


def test_n_samples_per_input_are_grouped_and_reproducible(any_model, prompts):
    ids, mask = prompts(any_model.spec.vocab_size, [5, 3])
    settings = dict(max_new_tokens=6, do_sample=True, num_return_sequences=3, eos_token_id=[], seed=7)
    out = any_model.generate(ids, attention_mask=mask, **settings)
    assert out.shape[0] == 2 * 3
    assert torch.equal(out, any_model.generate(ids, attention_mask=mask, **settings))
    # Row i * 3 + j is input i's sample j: the same draws as a batch of each input repeated three times.
    repeated = any_model.generate(
        ids.repeat_interleave(3, dim=0), attention_mask=mask.repeat_interleave(3, dim=0),
        **{**settings, "num_return_sequences": 1},
    )  # fmt: skip
    assert torch.equal(out, repeated)
    assert len({tuple(row) for row in out[:3].tolist()}) > 1  # independent samples


def test_greedy_and_sampling_have_no_scores(tiny):
    model = tiny("gpt2-tiny")
    assert model.generate(torch.tensor([[5, 6]]), max_new_tokens=2, return_scores=True).scores is None


def test_stream_text_gives_one_stream_per_sample_and_uses_the_decoder_prompt(tiny):
    class Ids:  # a tokenizer whose text is the ids themselves
        def decode(self, ids: list[int], *, skip_special_tokens: bool = True) -> str:
            return "".join(f" {i}" for i in ids)

    model = tiny("bart-tiny")
    settings = dict(max_new_tokens=4, do_sample=True, num_return_sequences=2, seed=1, eos_token_id=[])
    prompt = torch.tensor([[21, 22], [23, 24]])
    pieces = list(stream_text(model, Ids(), SOURCE, SOURCE_MASK, decoder_input_ids=prompt, **settings))
    texts = ["".join(step[row] for step in pieces) for row in range(4)]
    out = model.generate(SOURCE, attention_mask=SOURCE_MASK, decoder_input_ids=prompt, **settings)
    assert texts == [Ids().decode(row[3:]) for row in out.tolist()]


# -- banned words ------------------------------------------------------------------------------------------


def test_a_banned_token_never_appears_and_a_banned_pair_never_completes(tiny):
    model = tiny("gpt2-tiny")
    prompt = torch.tensor([[5, 6, 7]])
    free = model.generate(prompt, max_new_tokens=8, eos_token_id=[])[0, 3:].tolist()
    token, pair = free[2], free[4:6]
    out = model.generate(prompt, max_new_tokens=8, eos_token_id=[], bad_words_ids=[[token], pair])[
        0, 3:
    ].tolist()
    assert out[:2] == free[:2] and token not in out
    assert all(out[i : i + 2] != pair for i in range(len(out) - 1))


def test_bad_words_match_a_loop_over_rows_and_words():
    """The vectorised processor equals the plain reading of transformers' NoBadWordsLogitsProcessor."""
    g = torch.Generator().manual_seed(0)
    words = [[3], [4, 5], [5, 5], [1, 2, 6], [0, 1, 2, 3, 4, 5, 0, 1], [1] * 9, [2]]  # 2: an eos, kept alone
    L = 7
    ids = torch.randint(0, 6, (64, L), generator=g)
    valid = torch.ones_like(ids, dtype=torch.bool)
    valid[:8, :5] = False  # some rows left-padded
    scores = torch.randn(64, 12, generator=g)
    out = BadWords(words, eos_ids=(2,), device=torch.device("cpu"))(scores, ids, valid)
    expected = scores.clone()
    for row in range(64):
        for *prefix, last in words:
            n = len(prefix)
            if (not prefix and last == 2) or n > L:  # an eos alone; a prefix longer than the sequence
                continue
            if ids[row, L - n :].tolist() == prefix and valid[row, L - n :].all():  # n = 0: always
                expected[row, last] = float("-inf")
    assert torch.equal(out, expected)
    assert (out[:, 3] == float("-inf")).all() and (out[:, 2] > float("-inf")).all()


# -- validation --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(num_return_sequences=2), r"num_return_sequences \(2\) > 1 needs beam search .* or sampling"),
        (dict(num_return_sequences=3, num_beams=2), r"num_return_sequences \(3\) must be <= num_beams \(2\)"),
        (dict(num_return_sequences=0), r"num_return_sequences must be an int >= 1, got 0"),
        (dict(num_return_sequences=2000, do_sample=True), r"num_return_sequences \(2000\) is over the limit"),
        (dict(forced_bos_token_id=-1), r"forced_bos_token_id must be None or a token id"),
        (dict(forced_bos_token_id=True), r"forced_bos_token_id must be None or a token id"),
        (dict(forced_eos_token_id="2"), r"forced_eos_token_id must be a token id, a list of them, or None"),
        (dict(bad_words_ids=[]), r"bad_words_ids must be None or a non-empty list of non-empty lists"),
        (dict(bad_words_ids=[3, 4]), r"bad_words_ids must be None or a non-empty list"),
        (dict(bad_words_ids=[[3], []]), r"bad_words_ids must be None or a non-empty list"),
        (dict(bad_words_ids=[[3, -4]]), r"bad_words_ids must be None or a non-empty list"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(settings, message):
    with pytest.raises(ValueError, match=message):
        GenerationConfig(**settings)


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


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(forced_bos_token_id=512), r"forced_bos_token_id \(512\) must be token ids in \[0, 512\)"),
        (dict(forced_eos_token_id=[3, 600]), r"forced_eos_token_id \(\[3, 600\]\) must be token ids"),
        (dict(bad_words_ids=[[3], [4, 999]]), r"bad_words_ids \(\(4, 999\)\) must be token ids in \[0, 512\)"),
        (dict(decoder_input_ids=torch.tensor([5, 6])), r"decoder_input_ids must be a \(batch, length\) tensor"),
        (dict(decoder_input_ids=torch.tensor([[5.0]])), r"decoder_input_ids must hold integer token ids"),
        (dict(decoder_input_ids=torch.tensor([[5, 6]])), r"decoder_input_ids has shape \(1, 2\); expected \(2, "),
        (dict(decoder_input_ids=torch.tensor([[5], [512]])), r"decoder_input_ids contains token id 512"),
        (dict(decoder_attention_mask=torch.ones(2, 2)), r"decoder_attention_mask was given without"),
        (
            dict(decoder_input_ids=torch.ones(2, 3, dtype=torch.long), decoder_attention_mask=torch.ones(2, 2)),
            r"decoder_attention_mask has shape \(2, 2\), expected \(2, 3\)",
        ),
        (
            dict(decoder_input_ids=torch.ones(2, 2, dtype=torch.long), decoder_attention_mask=torch.ones(2, 2)),
            r"decoder_attention_mask must hold 1 \(token\) / 0 \(padding\)",
        ),
        (
            dict(decoder_input_ids=torch.ones(2, 2, dtype=torch.long), decoder_attention_mask=torch.tensor([[1, 1], [1, 0]])),
            r"decoder prompts must be left-padded",
        ),
        (dict(decoder_input_ids=torch.tensor([[0, 5], [6, 7]])), r"some rows of decoder_input_ids begin with the decoder start token \(0\)"),
        (
            dict(decoder_input_ids=torch.full((2, 120), 5), max_new_tokens=8),
            r"decoder prompt of 121 tokens \(start token included\) \+ max_new_tokens \(8\) = 129 exceeds",
        ),
    ],
)  # fmt: skip
def test_bad_controls_are_refused_before_any_compute(guarded, kwargs, message):
    model = guarded("t5-tiny")  # start token 0, vocabulary 512, 128 positions
    with pytest.raises(ValueError, match=message):
        model.generate(SOURCE, attention_mask=SOURCE_MASK, **kwargs)


def test_a_decoder_only_model_refuses_a_decoder_prompt(guarded):
    with pytest.raises(ValueError, match=r"decoder_input_ids is a prompt for an encoder-decoder"):
        guarded("gpt2-tiny").generate(torch.tensor([[5, 6]]), decoder_input_ids=torch.tensor([[5]]))


def test_a_stream_refuses_return_scores(tiny):
    with pytest.raises(ValueError, match="return_scores is for generate"):
        zoo.generation.stream(tiny("gpt2-tiny"), torch.tensor([[5, 6]]), return_scores=True)


# -- the command line --------------------------------------------------------------------------------------

CORPUS = ["the cat sat on the mat", "the dog sat on the log", "a cat and a dog met on the mat"] * 5


@pytest.fixture(scope="module")
def tokenizer():
    from zoo.io.tokenizer import train_tokenizer

    return train_tokenizer(iter(CORPUS), kind="bpe", vocab_size=60, min_frequency=1)


@pytest.fixture
def saved(tmp_path, tokenizer, lively):
    """``saved(preset)``: (directory, model) of a lively tiny model saved with the tokenizer."""

    def save(preset: str, seed: int = 0):
        torch.manual_seed(seed)
        spec = zoo.preset(preset).override(vocab_size=tokenizer.vocab_size, num_layers=2, max_positions=64)
        model = lively(zoo.build(spec).eval())
        zoo.save(model, tmp_path / preset, tokenizer=tokenizer)
        return str(tmp_path / preset), model

    return save


def _lines(out: str) -> list[str]:
    return [" ".join(line.split()) for line in out.strip().splitlines()]


def test_zoo_translate_prints_the_n_best_numbered_best_first_with_their_scores(saved, tokenizer, capsys):
    from zoo.cli import main

    directory, model = saved("transformer-tiny", seed=4)
    argv = ["translate", directory, "the cat sat", "--max-new-tokens", "5", "--beams", "3"]
    assert main([*argv, "--num-return-sequences", "3"]) == 0
    lines = _lines(capsys.readouterr().out)
    source = torch.tensor([tokenizer.encode("the cat sat", add_eos=True)])
    out = model.generate(source, max_new_tokens=5, num_beams=3, num_return_sequences=3, return_scores=True)
    assert len(lines) == 3
    for number, (line, row, score) in enumerate(zip(lines, out.sequences.tolist(), out.scores.tolist()), 1):
        new = (
            row[1:][: row[1:].index(model.spec.eos_token_id) + 1]
            if model.spec.eos_token_id in row[1:]
            else row[1:]
        )
        assert line == " ".join(f"[{number}] ({score:.4f}) {tokenizer.decode(new)}".split())


def test_zoo_generate_prints_n_samples_each_after_the_prompt(saved, tokenizer, capsys):
    from zoo.cli import main

    directory, model = saved("gpt2-tiny")
    argv = ["generate", directory, "--prompt", "the cat", "--max-new-tokens", "4", "--sample", "--seed", "3"]
    assert main([*argv, "--num-return-sequences", "2"]) == 0
    lines = _lines(capsys.readouterr().out)
    prompt = tokenizer.encode("the cat", add_bos=True, add_eos=False)
    out = model.generate(
        torch.tensor([prompt]), max_new_tokens=4, do_sample=True, seed=3, num_return_sequences=2
    )
    assert len(lines) == 2
    for number, (line, row) in enumerate(zip(lines, out.tolist()), 1):
        assert line.startswith(f"[{number}] the cat")
        assert line[len(f"[{number}] the cat") :].split() == tokenizer.decode(row[len(prompt) :]).split()


def test_zoo_translate_continues_a_decoder_prompt_and_forces_and_bans_tokens(saved, tokenizer, capsys):
    from zoo.cli import main

    directory, model = saved("transformer-tiny", seed=3)  # a seed whose translation is "log log log ..."
    source = torch.tensor([tokenizer.encode("the cat sat", add_eos=True)])
    argv = ["translate", directory, "the cat sat", "--max-new-tokens", "4"]

    assert main([*argv, "--decoder-prompt", "the dog"]) == 0
    prefix = tokenizer.encode("the dog", add_bos=False, add_eos=False)
    out = model.generate(source, max_new_tokens=4, decoder_input_ids=torch.tensor([prefix]))[0].tolist()
    printed = capsys.readouterr().out
    assert printed.startswith("the dog") and len(out) == 1 + len(prefix) + 4
    assert _lines(printed) == [" ".join(tokenizer.decode(out).split())]

    log = tokenizer.encode("log", add_eos=False)
    assert model.generate(source, max_new_tokens=4)[0, 1:].tolist() == log * 4
    mat = tokenizer.encode("mat", add_eos=False)[-1]
    forced = ["--forced-bos-token", tokenizer.id_to_token(mat)]  # the vocabulary's spelling, as __de__
    assert main([*argv, *forced, "--bad-words", "log", "--bad-words", "on the"]) == 0
    bad = [log, tokenizer.encode("on the", add_eos=False)]
    out = model.generate(source, max_new_tokens=4, forced_bos_token_id=mat, bad_words_ids=bad)[0, 1:].tolist()
    assert out[0] == mat and log[0] not in out
    assert _lines(capsys.readouterr().out) == [" ".join(tokenizer.decode(out).split())]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--num-return-sequences", "2"], "num_return_sequences (2) > 1 needs beam search"),
        (["--forced-bos-token", "zebra"], "--forced-bos-token: 'zebra' is not a token of the tokenizer"),
        (["--forced-bos-token-id", "999"], "forced_bos_token_id (999) must be token ids in [0, 40)"),
    ],
)
def test_zoo_translate_refuses_bad_controls_in_one_line(saved, capsys, argv, message):
    from zoo.cli import main

    directory, _ = saved("transformer-tiny")
    assert main(["translate", directory, "the cat", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and message in " ".join(err.split()) and len(err.strip().splitlines()) == 1
