"""`generate` and `stream`: greedy, sampling and beam search over a preallocated KV cache.

Hugging Face semantics throughout: a decoder-only model returns prompt + new tokens (B, T + new); an
encoder-decoder returns decoder ids that start with the decoder start token (B, 1 + new). A row that
produced an end-of-sequence token is finished and padded with ``pad_token_id`` from then on; the search
stops when every row is finished or after ``max_new_tokens``.

The per-step loop is kept lean (performance is measured against ``transformers.generate`` in bench/):
the model sees only the new token, logits are computed for the last position only, processors that a call
does not enable do not run, and the one host sync per step is the "all rows finished?" check, made only
when there is an end-of-sequence token to look for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from zoo.generation.beam import beam_search
from zoo.generation.compiled import compiled_decode_step
from zoo.generation.config import (
    GenerationConfig,
    check_beams,
    check_inputs,
    check_model,
    token_ids,
    validated,
)
from zoo.generation.protocol import GenerativeModel
from zoo.generation.sampling import LogitsProcessors, check_finite, sample
from zoo.generation.session import Session, StepFn, decode_step

Streamer = Callable[[torch.Tensor], Any]


@dataclass
class Run:
    """A validated generate call: settings, the ids they resolve to, the random generator, the step."""

    model: GenerativeModel
    input_ids: torch.Tensor  # (B, T), on the model's device
    attention_mask: torch.Tensor | None
    config: GenerationConfig
    eos: torch.Tensor | None  # (E,) end-of-sequence ids, None when there are none
    pad: int  # fills the rows that have ended
    generator: torch.Generator | None
    step: StepFn

    def session(self) -> Session:
        return Session(
            self.model,
            self.input_ids,
            self.attention_mask,
            max_new_tokens=self.config.max_new_tokens,
            num_beams=self.config.num_beams,
            use_cache=self.config.use_cache,
            step=self.step,
        )

    def processors(self, session: Session) -> LogitsProcessors:
        c = self.config
        processors = LogitsProcessors(
            vocab_size=self.model.spec.vocab_size,
            repetition_penalty=c.repetition_penalty,
            no_repeat_ngram_size=c.no_repeat_ngram_size,
            min_new_tokens=c.min_new_tokens,
            eos_ids=self.eos,
            do_sample=c.do_sample,
            temperature=c.temperature,
            top_k=c.top_k,
            top_p=c.top_p,
        )
        processors.start(session.sequences, session.valid)
        return processors


def generate(
    model: GenerativeModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    config: GenerationConfig | None = None,
    *,
    generator: torch.Generator | None = None,
    streamer: Streamer | None = None,
    compile: bool = False,
    **overrides: Any,
) -> torch.Tensor:
    """Generate token ids with greedy search, sampling or beam search (Hugging Face semantics).

    input_ids (B, T): the prompt (decoder-only, left-padded) or the source (encoder-decoder);
    attention_mask (B, T): 1 = token, 0 = padding. Returns (B, T + n) prompt + new tokens for a decoder,
    (B, 1 + n) decoder ids starting with ``spec.start_token_id`` for an encoder-decoder, n <= max_new_tokens.

    The settings are a `GenerationConfig` (``config``), and any of its fields given as keywords override it
    (``model.generate(ids, max_new_tokens=20, do_sample=True, seed=0)``); the merged whole is validated.
    What only exists at run time is a keyword of its own:

    Args:
        generator: the random source of sampling (not with ``seed``).
        streamer: called with each step's new tokens (B,) as they are produced (not with beam search).
        compile: run the decode step through ``torch.compile`` (`compiled_decode_step`).

    The model runs in eval mode (dropout off) under ``torch.no_grad``; its previous mode is restored.
    """
    run = prepare(model, input_ids, attention_mask, config, overrides, generator=generator, compile=compile)
    if streamer is not None and run.config.num_beams > 1:
        raise ValueError("generate: streamer works with greedy search and sampling, not with num_beams > 1")
    with _eval_mode(run.model), torch.no_grad():
        session = run.session()
        if run.config.num_beams > 1:
            return beam_search(
                session,
                run.processors(session),
                run.config,
                eos=run.eos,
                pad=run.pad,
                generator=run.generator,
            )
        for tokens in _steps(session, run):
            if streamer is not None:
                streamer(tokens)
        return session.sequences.clone()


def stream(
    model: GenerativeModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    config: GenerationConfig | None = None,
    *,
    generator: torch.Generator | None = None,
    compile: bool = False,
    **overrides: Any,
) -> Iterator[torch.Tensor]:
    """Like `generate` (same arguments, no beam search), but yield each step's new tokens (B,) as they come.

    >>> for tokens in zoo.generation.stream(model, prompt, max_new_tokens=20):
    ...     print(tokenizer.decode(tokens[:1]), end="", flush=True)

    Arguments are checked when `stream` is called, before the first token is computed.
    """
    return iterate(prepare_stream(model, input_ids, attention_mask, config, overrides, generator, compile))


def prepare_stream(
    model: GenerativeModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    config: GenerationConfig | None,
    overrides: dict[str, Any],
    generator: torch.Generator | None,
    compile: bool,
) -> Run:
    """`prepare` for `stream` and `zoo.generation.stream_text`: greedy search or sampling only."""
    if overrides.pop("streamer", None) is not None:
        raise ValueError("stream: pass no streamer; iterate over the returned tokens instead")
    run = prepare(model, input_ids, attention_mask, config, overrides, generator=generator, compile=compile)
    if run.config.num_beams != 1:
        raise ValueError("stream: beam search (num_beams > 1) has no stream; call generate")
    return run


@torch.no_grad()
def iterate(run: Run) -> Iterator[torch.Tensor]:
    """Greedy search or sampling for a prepared run, yielding each step's tokens (B,)."""
    # torch.no_grad on a generator function re-enters no-grad around every resume: it does not leak.
    with _eval_mode(run.model):
        yield from _steps(run.session(), run)


def _steps(session: Session, run: Run) -> Iterator[torch.Tensor]:
    """Greedy search or sampling: append one token per row per step and yield it (B,)."""
    config, eos, generator = run.config, run.eos, run.generator
    processors = run.processors(session)
    unfinished = (
        torch.ones(session.batch_size, dtype=torch.bool, device=session.tokens.device)
        if eos is not None
        else None
    )
    for step in range(config.max_new_tokens):
        scores = session.logits().float()  # (B, V); float32 also makes argmax 4x faster than on bfloat16
        check_finite(scores, step)
        if processors.active:
            scores = processors(scores, session.sequences, session.valid, step)
        tokens = sample(scores, generator) if config.do_sample else scores.argmax(dim=-1)  # (B,)
        if unfinished is not None:
            assert eos is not None  # rows can finish only when there is an eos id (``unfinished`` above)
            tokens = torch.where(unfinished, tokens, run.pad)
            unfinished &= ~torch.isin(tokens, eos)
        session.append(tokens)
        processors.observe(tokens)
        yield tokens
        if unfinished is not None and not bool(unfinished.any()):
            return


def prepare(
    model: GenerativeModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    config: GenerationConfig | None,
    overrides: Mapping[str, Any],
    *,
    generator: torch.Generator | None,
    compile: bool,
) -> Run:
    """Validate the settings, resolve the model's defaults, and check the prompt, before any compute."""
    config = validated(config, overrides)
    model = check_model(model)
    spec = model.spec
    vocab = spec.vocab_size
    check_beams(config, vocab_size=vocab)
    eos_setting = config.eos_token_id
    eos = token_ids(
        eos_setting if eos_setting is not None else spec.eos_token_id, name="eos_token_id", vocab_size=vocab
    )
    pad = config.pad_token_id
    if pad is None and spec.pad_token_id is not None:
        pad = spec.pad_token_id
    if pad is None:  # as in Hugging Face, the first eos id; without eos no row finishes, so 0 is never used
        pad = eos[0] if eos else 0
    token_ids(pad, name="pad_token_id", vocab_size=vocab)
    if generator is not None and config.seed is not None:
        raise ValueError("generate: pass a generator or a seed, not both")
    device = _device_of(model)
    if isinstance(input_ids, torch.Tensor):
        input_ids = input_ids.to(device)
    if attention_mask is not None:
        attention_mask = attention_mask.to(device)
    check_inputs(model, input_ids, attention_mask, config)
    if config.seed is not None:
        generator = torch.Generator(device=device).manual_seed(config.seed)
    rows = input_ids.shape[0] * config.num_beams
    return Run(
        model=model,
        input_ids=input_ids,
        attention_mask=attention_mask,
        config=config,
        eos=torch.tensor(eos, dtype=torch.long, device=device) if eos else None,
        pad=pad,
        generator=generator,
        step=compiled_decode_step(model, rows=rows) if compile else decode_step,
    )


def _device_of(model: GenerativeModel) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    return torch.device("cpu")


@contextmanager
def _eval_mode(model: GenerativeModel) -> Iterator[None]:
    """Dropout off while generating; the model's previous train/eval mode is restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
