"""Speculative decoding (`zoo.generation.speculative`): greedy output is plain greedy's token for token,
sampling keeps the target's distribution, and what it does not combine with is refused by name."""

from __future__ import annotations

import pytest
import torch

import zoo
from tests.generation.conftest import DECODERS, ENCODER_DECODERS, build_tiny, left_padded


def _draft_of(name: str) -> zoo.ZooModel:
    """Another model of the same shape with other weights: it drafts, and is often wrong."""
    torch.manual_seed(1)
    model = build_tiny(name)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p) * p.std().nan_to_num(0.0))
    return model


def _repeating(vocab: int, batch: int, length: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    motif = torch.randint(3, vocab, (batch, 5), generator=g)
    return motif.repeat(1, length // 5 + 1)[:, :length]


@pytest.mark.parametrize("name", list(DECODERS))
def test_assistant_greedy_equals_plain_greedy(name: str) -> None:
    target, draft = build_tiny(name), _draft_of(name)
    ids, mask = left_padded(target.spec.vocab_size, [7, 4, 9])
    plain = target.generate(ids, mask, max_new_tokens=12, eos_token_id=[])
    for schedule in ("constant", "heuristic"):
        fast = target.generate(
            ids,
            mask,
            max_new_tokens=12,
            eos_token_id=[],
            assistant_model=draft,
            num_assistant_tokens=3,
            num_assistant_tokens_schedule=schedule,
        )
        assert torch.equal(fast, plain), schedule
    itself = target.generate(ids, mask, max_new_tokens=12, eos_token_id=[], assistant_model=target)
    assert torch.equal(itself, plain)  # every draft accepted: the bonus-token path


@pytest.mark.parametrize("name", list(DECODERS))
def test_prompt_lookup_greedy_equals_plain_greedy(name: str) -> None:
    target = build_tiny(name)
    ids = _repeating(target.spec.vocab_size, 2, 12)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    plain = target.generate(ids, mask, max_new_tokens=14, eos_token_id=[])
    fast = target.generate(ids, mask, max_new_tokens=14, eos_token_id=[], prompt_lookup_num_tokens=4)
    assert torch.equal(fast, plain)


@pytest.mark.parametrize("name", list(ENCODER_DECODERS))
def test_encoder_decoder_target(name: str) -> None:
    target, draft = build_tiny(name), _draft_of(name)
    ids, mask = left_padded(target.input_vocab_size, [6, 4])
    plain = target.generate(ids, mask, max_new_tokens=10, eos_token_id=[])
    assert torch.equal(
        target.generate(ids, mask, max_new_tokens=10, eos_token_id=[], assistant_model=draft), plain
    )
    assert torch.equal(
        target.generate(ids, mask, max_new_tokens=10, eos_token_id=[], prompt_lookup_num_tokens=3), plain
    )


def test_eos_ends_rows_as_plain_greedy_does() -> None:
    target = build_tiny("gpt2-tiny")
    ids, mask = left_padded(target.spec.vocab_size, [5, 8, 3], seed=4)
    plain = target.generate(ids, mask, max_new_tokens=16, eos_token_id=[])
    eos = int(plain[0, 8 + 3])  # a token row 0 produces early: rows finish at different steps
    plain = target.generate(ids, mask, max_new_tokens=16, eos_token_id=eos)
    for extra in (
        {"assistant_model": target},
        {"assistant_model": _draft_of("gpt2-tiny")},
        {"prompt_lookup_num_tokens": 3},
    ):
        assert torch.equal(target.generate(ids, mask, max_new_tokens=16, eos_token_id=eos, **extra), plain)


def test_a_finished_row_does_not_hold_the_batch_back(monkeypatch) -> None:
    # drafts: plain greedy's next tokens for a live row, other tokens for a finished one. A finished row's
    # drafts are padded away, so the live row keeps all of them: 2 + 1 tokens a forward, not 1.
    target = build_tiny("gpt2-tiny")
    ids, mask = left_padded(target.spec.vocab_size, [5, 8], seed=4)
    width, new = ids.shape[1], 15
    free = target.generate(ids, mask, max_new_tokens=new, eos_token_id=[])
    eos = int(free[0, width + 1])  # row 0 ends at its second new token
    assert eos not in free[1, width:].tolist(), "pick a seed where row 1 runs to the end"
    plain = target.generate(ids, mask, max_new_tokens=new, eos_token_id=eos)

    def propose(self: object, session: object, k: int) -> tuple[torch.Tensor, None]:
        start = session.length  # type: ignore[attr-defined]
        drafts = free[:, start : start + k].clone()  # (B, k)
        drafts[0] = (drafts[0] + 1) % target.spec.vocab_size  # row 0 (finished after round 1) drafts wrong
        return drafts, None

    monkeypatch.setattr(zoo.generation.speculative.PromptLookup, "propose", propose)
    forwards = 0
    inner = target.all_token_logits

    def counted(*args: object) -> torch.Tensor:
        nonlocal forwards
        forwards += 1
        return inner(*args)

    monkeypatch.setattr(target, "all_token_logits", counted)
    out = target.generate(ids, mask, max_new_tokens=new, eos_token_id=eos, prompt_lookup_num_tokens=2)
    assert torch.equal(out, plain)
    assert forwards <= 2 + new // 3  # held back by row 0, it took `new` forwards


def _draft_widths(monkeypatch) -> list[tuple[int, int]]:
    """Spy on the assistant: each round's draft width and the width asked for (<= num_assistant_tokens)."""
    widths: list[tuple[int, int]] = []
    inner = zoo.generation.speculative.Assistant.propose

    def propose(self: object, session: object, k: int) -> object:
        out = inner(self, session, k)  # type: ignore[arg-type]
        widths.append((out[0].shape[1], k))  # type: ignore[index]
        return out

    monkeypatch.setattr(zoo.generation.speculative.Assistant, "propose", propose)
    return widths


def test_a_draft_stops_after_its_first_token_below_the_confidence_threshold(monkeypatch) -> None:
    # The target drafts for itself: its drafts are plain greedy's tokens, whose probabilities we know.
    target = build_tiny("gpt2-tiny")
    ids, _ = left_padded(target.spec.vocab_size, [6], seed=2)
    plain = target.generate(ids, max_new_tokens=12, eos_token_id=[])
    with torch.no_grad():
        probs = target(plain).logits[0, 5:-1].softmax(-1)  # (12, V): before each new token
    confidence = probs.gather(1, plain[0, 6:, None]).squeeze(1)[:4]  # (4,) of the first draft's tokens
    cut = int(confidence.argmin())  # the first token below a threshold just above its probability
    above = float(confidence[:cut].min()) if cut else 2 * float(confidence[cut])
    threshold = (float(confidence[cut]) + min(above, 1.0)) / 2
    widths = _draft_widths(monkeypatch)
    out = target.generate(
        ids,
        max_new_tokens=12,
        eos_token_id=[],
        assistant_model=target,
        num_assistant_tokens=4,
        assistant_confidence_threshold=threshold,
    )
    assert torch.equal(out, plain)
    assert widths[0] == (cut + 1, 4)  # the token below the threshold is drafted, then the draft stops
    widths.clear()
    target.generate(
        ids, max_new_tokens=12, eos_token_id=[], assistant_model=target, assistant_confidence_threshold=1
    )
    assert [w for w, _ in widths] == [
        1
    ] * 6  # every draft cut after one token: 6 rounds of a draft and the bonus token


def test_threshold_zero_drafts_every_token_as_before(monkeypatch) -> None:
    target, draft = build_tiny("llama-tiny"), _draft_of("llama-tiny")
    ids, mask = left_padded(target.spec.vocab_size, [7, 4])
    plain = target.generate(ids, mask, max_new_tokens=12, eos_token_id=[])
    widths = _draft_widths(monkeypatch)
    fast = target.generate(
        ids,
        mask,
        max_new_tokens=12,
        eos_token_id=[],
        assistant_model=draft,
        num_assistant_tokens=3,
        assistant_confidence_threshold=0,
    )
    assert torch.equal(fast, plain)
    assert len(widths) > 3 and all(w == k for w, k in widths)  # as many as asked, every round
    widths.clear()
    target.generate(
        ids, mask, max_new_tokens=12, eos_token_id=[], assistant_model=draft, num_assistant_tokens=3
    )
    assert len(widths) > 3 and all(w == k for w, k in widths)  # the default, 0: off
    widths.clear()
    target.generate(
        ids,
        mask,
        max_new_tokens=12,
        eos_token_id=[],
        assistant_model=draft,
        num_assistant_tokens=3,
        assistant_confidence_threshold=0.4,
    )
    assert any(w < k for w, k in widths)  # transformers' 0.4 cuts this untrained draft's guesses


def test_eos_stops_a_draft_per_row(monkeypatch) -> None:
    target = build_tiny("gpt2-tiny")
    ids, mask = left_padded(target.spec.vocab_size, [5, 8], seed=4)
    width = ids.shape[1]
    free = target.generate(ids, mask, max_new_tokens=10, eos_token_id=[])
    eos = int(free[0, width + 2])  # row 0's third new token
    assert eos not in free[1, width:].tolist() and eos not in free[0, width : width + 2].tolist()
    plain = target.generate(ids, mask, max_new_tokens=10, eos_token_id=eos)
    widths = _draft_widths(monkeypatch)
    kwargs = {"eos_token_id": eos, "assistant_model": target, "assistant_confidence_threshold": 0}
    alone = target.generate(ids[:1], mask[:1], max_new_tokens=10, eos_token_id=eos)
    assert torch.equal(target.generate(ids[:1], mask[:1], max_new_tokens=10, **kwargs), alone)
    assert widths == [(3, 9)]  # the draft ends with its eos, not at num_assistant_tokens (9 here)
    widths.clear()
    kwargs["num_assistant_tokens"] = 4
    assert torch.equal(target.generate(ids, mask, max_new_tokens=10, **kwargs), plain)
    assert widths[0] == (4, 4)  # row 0's eos stops its own draft, not row 1's


def test_stream_and_streamer_yield_the_same_tokens() -> None:
    target = build_tiny("llama-tiny")
    ids, _ = left_padded(target.spec.vocab_size, [6])
    plain = target.generate(ids, max_new_tokens=9, eos_token_id=[])
    got: list[torch.Tensor] = []
    out = target.generate(ids, max_new_tokens=9, eos_token_id=[], assistant_model=target, streamer=got.append)
    assert torch.equal(out, plain) and torch.equal(torch.stack(got, 1), plain[:, 6:])
    streamed = zoo.generation.stream(
        target, ids, max_new_tokens=9, eos_token_id=[], prompt_lookup_num_tokens=2
    )
    assert torch.equal(torch.stack(list(streamed), 1), plain[:, 6:])


@pytest.mark.parametrize("lookup, threshold", [(False, 0.4), (False, 0.0), (True, 0.4)])
def test_sampling_keeps_the_target_distribution(lookup: bool, threshold: float) -> None:
    """The second new token's empirical distribution over many seeds against the target's exact one."""
    spec = zoo.preset("gpt2-tiny").override(vocab_size=8, max_positions=32)
    torch.manual_seed(0)
    target = zoo.build(spec).eval()
    torch.manual_seed(5)
    draft = zoo.build(spec).eval()
    with torch.no_grad():
        for model, scale in ((target, 1.5), (draft, 1.5)):
            for p in model.parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, scale / p.shape[-1] ** 0.5)
    ids = torch.tensor([[1, 2, 3, 1, 2]])
    with torch.no_grad():  # the exact joint P(first, second) of the first two new tokens, (8, 8)
        first = target(ids).logits[0, -1].softmax(-1)  # (8,)
        after = torch.cat([ids.repeat(8, 1), torch.arange(8)[:, None]], 1)
        joint = first[:, None] * target(after).logits[:, -1].softmax(-1)
    n = 4000
    extra = (
        {"prompt_lookup_num_tokens": 2}
        if lookup
        else {
            "assistant_model": draft,
            "num_assistant_tokens": 2,
            "assistant_confidence_threshold": threshold,
        }
    )
    out = target.generate(
        ids.repeat(n, 1), max_new_tokens=3, do_sample=True, seed=0, eos_token_id=[], **extra
    )
    counts = torch.bincount(out[:, 5] * 8 + out[:, 6], minlength=64).float()
    expected = joint.flatten() * n
    big = expected >= 5  # cells expected under 5 times pooled into one, as a chi-square test needs
    observed = torch.cat([counts[big], counts[~big].sum()[None]])
    expected = torch.cat([expected[big], expected[~big].sum()[None]])
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    dof = int(big.sum())
    assert chi2 < dof + 6 * (2 * dof) ** 0.5, (chi2, dof)  # far in the tail (p ~ 1e-6) only if biased


def test_refused_by_name() -> None:
    target = build_tiny("gpt2-tiny")
    ids = torch.tensor([[5, 6, 7]])
    other = zoo.build(zoo.preset("gpt2-tiny").override(vocab_size=target.spec.vocab_size + 1))
    cases = [
        ({"assistant_model": other}, "vocab_size"),
        ({"assistant_model": target, "num_beams": 2}, "num_beams"),
        ({"prompt_lookup_num_tokens": 2, "repetition_penalty": 1.2}, "repetition_penalty"),
        ({"assistant_model": target, "prompt_lookup_num_tokens": 2}, "not both"),
        ({"prompt_lookup_num_tokens": 2, "use_cache": False}, "use_cache"),
        ({"prompt_lookup_num_tokens": 0}, "prompt_lookup_num_tokens"),
        (
            {"assistant_model": target, "assistant_confidence_threshold": 1.5},
            "assistant_confidence_threshold",
        ),
        ({"assistant_model": target, "compile": "cuda-graphs"}, "cuda-graphs"),
    ]
    for kwargs, words in cases:
        with pytest.raises(ValueError, match=words):
            target.generate(ids, max_new_tokens=4, **kwargs)


def test_cli_draft_and_prompt_lookup_print_plain_greedy_text(tmp_path, capsys) -> None:
    from zoo.cli import main
    from zoo.io.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(
        iter(["the cat sat on the mat", "a dog sat on a log"] * 5), kind="bpe", vocab_size=60
    )
    spec = zoo.preset("gpt2-tiny").override(vocab_size=64)
    folders = []
    for name, seed in (("gpt", 0), ("draft", 1)):
        torch.manual_seed(seed)
        zoo.save(zoo.build(spec).eval(), tmp_path / name, tokenizer=tokenizer)
        folders.append(str(tmp_path / name))
    base = ["generate", folders[0], "--prompt", "the cat sat on the", "--max-new-tokens", "10"]
    assert main(base) == 0
    plain = capsys.readouterr().out
    for extra in (["--draft", folders[1]], ["--prompt-lookup", "3"]):
        assert main(base + extra) == 0
        assert capsys.readouterr().out == plain
    assert main([*base, "--prompt-lookup", "3", "--beams", "2"]) != 0
    assert "num_beams" in capsys.readouterr().err


@pytest.mark.slow
def test_compiled_assistant_step_keeps_greedy_tokens() -> None:
    target, draft = build_tiny("llama-tiny"), _draft_of("llama-tiny")
    ids, mask = left_padded(target.spec.vocab_size, [6, 4])
    plain = target.generate(ids, mask, max_new_tokens=10, eos_token_id=[])
    fast = target.generate(ids, mask, max_new_tokens=10, eos_token_id=[], assistant_model=draft, compile=True)
    assert torch.equal(fast, plain)
