"""`generate` and `stream`: greedy, sampling and beam search over a preallocated KV cache.

Hugging Face semantics throughout: a decoder-only model returns prompt + new tokens (B, T + new); an
encoder-decoder returns decoder ids that start with the decoder start token (B, 1 + new), or with its
decoder prompt (``decoder_input_ids``, `zoo.generation.prompt`). A row that produced an end-of-sequence
token is finished and padded with ``pad_token_id`` from then on; the search stops when every row is
finished or after ``max_new_tokens``. With ``num_return_sequences`` = n there are n rows per input, the
n of an input next to each other (B * n, ...), as in transformers.

The per-step loop is kept lean (performance is measured against ``transformers.generate`` in bench/):
the model sees only the new token, logits are computed for the last position only, processors that a call
does not enable do not run, and the one host sync per step is the "all rows finished?" check, made only
when there is an end-of-sequence token to look for.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, overload

import torch

from zoo.generation.beam import scored_beam_search
from zoo.generation.compiled import compiled_decode_step
from zoo.generation.config import (
    GenerationConfig,
    check_beams,
    check_devices,
    check_inputs,
    check_model,
    token_ids,
    validated,
)
from zoo.generation.constrain import Constraint, Grammar, constrain, vocabulary
from zoo.generation.graphs import CudaGraphStep
from zoo.generation.prompt import Prompt, decoder_prompt
from zoo.generation.protocol import GenerativeModel
from zoo.generation.sampling import BadWords, LogitsProcessors, check_finite, sample
from zoo.generation.session import Session, StepFn, decode_step
from zoo.generation.speculative import Assistant, PromptLookup, check_speculative, speculative_steps
from zoo.generation.weight_layout import use_decoding_layout

Streamer = Callable[[torch.Tensor], Any]
# False: eager; True: torch.compile (`compiled_decode_step`); "cuda-graphs": one CUDA graph replayed per token
Compile = bool | Literal["cuda-graphs"]


@dataclass(frozen=True)
class GenerationOutput:
    """What ``generate(..., return_scores=True)`` returns."""

    sequences: torch.Tensor  # (B * n, L): as `generate` returns them, n = num_return_sequences
    scores: torch.Tensor | None  # (B * n,) beam search's hypothesis scores (transformers' sequences_scores),
    # sum(log p) / generated_length ** length_penalty; None for greedy search and sampling


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
    decoder_prompt: Prompt | None = (
        None  # an encoder-decoder's decoder ids (B, P) and mask, start token first
    )
    bad_words: BadWords | None = None
    forced_bos: torch.Tensor | None = None  # (1,)
    forced_eos: torch.Tensor | None = None  # (E,)
    suppress: torch.Tensor | None = None  # (S,) ids never produced
    begin_suppress: torch.Tensor | None = None  # (S',) ids not produced first
    constraints: list[Constraint] | None = None  # one per row: the grammar its text follows
    assistant: GenerativeModel | None = (
        None  # speculative decoding's draft model (`zoo.generation.speculative`)
    )
    assistant_step: StepFn = decode_step  # the assistant's per-token step (compiled with ``compile=True``)

    @property
    def speculative(self) -> bool:
        return self.assistant is not None or self.config.prompt_lookup_num_tokens is not None

    def session(self) -> Session:
        return Session(
            self.model,
            self.input_ids,
            self.attention_mask,
            max_new_tokens=self.config.max_new_tokens,
            num_beams=self.config.rows_per_input,
            use_cache=self.config.use_cache,
            step=self.step,
            decoder_prompt=self.decoder_prompt,
            rolling=not self.speculative,  # a rolling slot cannot take back a rejected draft's key
        )

    def processors(self, session: Session) -> LogitsProcessors:
        c = self.config
        processors = LogitsProcessors(
            vocab_size=self.model.spec.vocab_size,
            repetition_penalty=c.repetition_penalty,
            no_repeat_ngram_size=c.no_repeat_ngram_size,
            bad_words=self.bad_words,
            min_new_tokens=c.min_new_tokens,
            eos_ids=self.eos,
            forced_bos=self.forced_bos,
            forced_eos=self.forced_eos,
            max_new_tokens=c.max_new_tokens,
            do_sample=c.sampling,
            temperature=c.temperature,
            top_k=c.top_k,
            top_p=c.top_p,
            suppress=self.suppress,
            begin_suppress=self.begin_suppress,
        )
        processors.start(session.sequences, session.valid)
        return processors


@overload
def generate(
    model: GenerativeModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = ...,
    config: GenerationConfig | None = ...,
    *,
    decoder_input_ids: torch.Tensor | None = ...,
    decoder_attention_mask: torch.Tensor | None = ...,
    generator: torch.Generator | None = ...,
    streamer: Streamer | None = ...,
    compile: Compile = ...,
    json_schema: Mapping[str, Any] | str | None = ...,
    grammar: Grammar | None = ...,
    tokenizer: Any = ...,
    assistant_model: GenerativeModel | None = ...,
    return_scores: Literal[False] = ...,
    **overrides: Any,
) -> torch.Tensor: ...
@overload
def generate(
    model: GenerativeModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = ...,
    config: GenerationConfig | None = ...,
    *,
    decoder_input_ids: torch.Tensor | None = ...,
    decoder_attention_mask: torch.Tensor | None = ...,
    generator: torch.Generator | None = ...,
    streamer: Streamer | None = ...,
    compile: Compile = ...,
    json_schema: Mapping[str, Any] | str | None = ...,
    grammar: Grammar | None = ...,
    tokenizer: Any = ...,
    assistant_model: GenerativeModel | None = ...,
    return_scores: Literal[True],
    **overrides: Any,
) -> GenerationOutput: ...
def generate(
    model: GenerativeModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    config: GenerationConfig | None = None,
    *,
    decoder_input_ids: torch.Tensor | None = None,
    decoder_attention_mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    streamer: Streamer | None = None,
    compile: Compile = False,
    json_schema: Mapping[str, Any] | str | None = None,
    grammar: Grammar | None = None,
    tokenizer: Any = None,
    assistant_model: GenerativeModel | None = None,
    return_scores: bool = False,
    **overrides: Any,
) -> torch.Tensor | GenerationOutput:
    """Generate token ids with greedy search, sampling or beam search (Hugging Face semantics).

    input_ids (B, T): the prompt (decoder-only, left-padded) or the source (encoder-decoder);
    attention_mask (B, T): 1 = token, 0 = padding. Returns (B, T + n) prompt + new tokens for a decoder,
    (B, 1 + n) decoder ids starting with ``spec.start_token_id`` for an encoder-decoder, n <= max_new_tokens
    — or (B * r, ...) with ``num_return_sequences`` = r, the r rows of an input together.

    The settings are a `GenerationConfig` (``config``), and any of its fields given as keywords override it
    (``model.generate(ids, max_new_tokens=20, do_sample=True, seed=0)``); the merged whole is validated.
    What only exists at run time is a keyword of its own:

    Args:
        decoder_input_ids: (B, P) an encoder-decoder's decoder prompt, continued (its rows begin with the
            start token, or all are given it; `zoo.generation.prompt`); the output is (B, P' + n).
        decoder_attention_mask: (B, P) 1 = token, 0 = left padding of ``decoder_input_ids``.
        generator: the random source of sampling (not with ``seed``).
        streamer: called with each step's new tokens (B,) as they are produced (not with beam search).
        compile: True runs the decode step through ``torch.compile`` (`compiled_decode_step`);
            ``"cuda-graphs"`` captures the per-token step as a CUDA graph once per run and replays it
            (`zoo.generation.graphs`; on CPU the same static-shape step runs uncaptured).
        json_schema: structured output: every row's new text is JSON that this JSON Schema (a dict, or its
            JSON text) validates, at any temperature (`zoo.generation.constrain`; the ``grammar`` extra);
            needs ``tokenizer`` and an end-of-sequence token, which ends a row where its text is complete.
            Greedy search and sampling. A row cut by ``max_new_tokens`` may be incomplete.
        grammar: the same with any `zoo.generation.constrain.Grammar` (a regex, a choice, a Lark grammar).
        tokenizer: the model's tokenizer, whose tokens a grammar reads as text.
        assistant_model: speculative decoding (transformers' assisted generation): a smaller model with the
            same vocabulary drafts ``num_assistant_tokens`` tokens that the model verifies in one forward;
            greedy output is plain greedy's, sampling keeps the model's distribution
            (`zoo.generation.speculative`). ``prompt_lookup_num_tokens=`` drafts from the text itself.
        return_scores: return a `GenerationOutput` (sequences and beam scores) instead of the ids alone.

    The model runs in eval mode (dropout off) under ``torch.no_grad``; its previous mode is restored.
    """
    run = prepare(
        model,
        input_ids,
        attention_mask,
        config,
        overrides,
        generator=generator,
        compile=compile,
        decoder_input_ids=decoder_input_ids,
        decoder_attention_mask=decoder_attention_mask,
        grammar=resolve_grammar(json_schema, grammar, tokenizer),
        tokenizer=tokenizer,
        assistant_model=assistant_model,
    )
    if streamer is not None and run.config.num_beams > 1:
        raise ValueError("generate: streamer works with greedy search and sampling, not with num_beams > 1")
    with _eval_mode(run.model), torch.no_grad():
        session = run.session()
        scores = None
        if run.config.num_beams > 1:
            sequences, scores = scored_beam_search(
                session,
                run.processors(session),
                run.config,
                eos=run.eos,
                pad=run.pad,
                generator=run.generator,
            )
        else:
            for tokens in _steps(session, run):
                if streamer is not None:
                    streamer(tokens)
            sequences = session.sequences.clone()
    return GenerationOutput(sequences, scores) if return_scores else sequences


def stream(
    model: GenerativeModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    config: GenerationConfig | None = None,
    *,
    decoder_input_ids: torch.Tensor | None = None,
    decoder_attention_mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    compile: Compile = False,
    json_schema: Mapping[str, Any] | str | None = None,
    grammar: Grammar | None = None,
    tokenizer: Any = None,
    assistant_model: GenerativeModel | None = None,
    **overrides: Any,
) -> Iterator[torch.Tensor]:
    """Like `generate` (same arguments, no beam search), but yield each step's new tokens (B,) as they come.

    >>> for tokens in zoo.generation.stream(model, prompt, max_new_tokens=20):
    ...     print(tokenizer.decode(tokens[:1]), end="", flush=True)

    Arguments are checked when `stream` is called, before the first token is computed.
    """
    run = prepare_stream(
        model,
        input_ids,
        attention_mask,
        config,
        overrides,
        generator,
        compile,
        decoder_input_ids=decoder_input_ids,
        decoder_attention_mask=decoder_attention_mask,
        grammar=resolve_grammar(json_schema, grammar, tokenizer),
        tokenizer=tokenizer,
        assistant_model=assistant_model,
    )
    return iterate(run)


def prepare_stream(
    model: GenerativeModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    config: GenerationConfig | None,
    overrides: dict[str, Any],
    generator: torch.Generator | None,
    compile: Compile,
    *,
    decoder_input_ids: torch.Tensor | None = None,
    decoder_attention_mask: torch.Tensor | None = None,
    grammar: Grammar | None = None,
    tokenizer: Any = None,
    assistant_model: GenerativeModel | None = None,
) -> Run:
    """`prepare` for `stream` and `zoo.generation.stream_text`: greedy search or sampling only."""
    if overrides.pop("streamer", None) is not None:
        raise ValueError("stream: pass no streamer; iterate over the returned tokens instead")
    if overrides.pop("return_scores", False):
        raise ValueError("stream: return_scores is for generate (beam scores); a stream yields tokens")
    run = prepare(
        model,
        input_ids,
        attention_mask,
        config,
        overrides,
        generator=generator,
        compile=compile,
        decoder_input_ids=decoder_input_ids,
        decoder_attention_mask=decoder_attention_mask,
        grammar=grammar,
        tokenizer=tokenizer,
        assistant_model=assistant_model,
    )
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
    if run.speculative:
        yield from _speculative(session, run)
        return
    config, eos, generator = run.config, run.eos, run.generator
    processors = run.processors(session)
    unfinished = (
        torch.ones(session.batch_size, dtype=torch.bool, device=session.tokens.device)
        if eos is not None
        else None
    )
    checked = torch.ones(
        (), dtype=torch.bool, device=session.tokens.device
    )  # sampling checks before it draws
    for step in range(config.max_new_tokens):
        scores = session.logits().float()  # (B, V); float32 also makes argmax 4x faster than on bfloat16
        if run.constraints is not None:  # -inf where a row's grammar forbids the token
            scores = constrain(scores, run.constraints)
        if config.sampling:  # sampling from NaN fails inside torch (a device assert on CUDA): check first
            check_finite(scores, step)
        if processors.active:
            scores = processors(scores, session.sequences, session.valid, step)
        if config.sampling:
            tokens, finite = sample(scores, generator), checked  # (B,), ()
        else:  # NaN / +inf would be picked silently; a row's max is NaN or +inf exactly then (-inf is a ban)
            best, tokens = scores.max(dim=-1)  # (B,) each: the argmax and its score, in one pass
            finite = (best < math.inf).all()
        if unfinished is not None:
            assert eos is not None  # rows can finish only when there is an eos id (``unfinished`` above)
            tokens = torch.where(unfinished, tokens, run.pad)
            unfinished &= ~torch.isin(tokens, eos)
            # One host read a step, for both questions (on a GPU each read waits for the queue to drain).
            finite_now, going = torch.stack([finite, unfinished.any()]).tolist()
        else:
            finite_now, going = config.sampling or bool(finite), True
        if not finite_now:
            check_finite(scores.new_full((1,), math.nan), step)  # raises, naming the step
        session.append(tokens)
        processors.observe(tokens)
        if run.constraints is not None:
            for constraint, token in zip(run.constraints, tokens.tolist()):
                constraint.advance(token)  # a row that has ended (its pad tokens) ignores it
        yield tokens
        if not going:
            return


def prepare(
    model: GenerativeModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    config: GenerationConfig | None,
    overrides: Mapping[str, Any],
    *,
    generator: torch.Generator | None,
    compile: Compile,
    decoder_input_ids: torch.Tensor | None = None,
    decoder_attention_mask: torch.Tensor | None = None,
    grammar: Grammar | None = None,
    tokenizer: Any = None,
    assistant_model: GenerativeModel | None = None,
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
    forced_bos = token_ids(config.forced_bos_token_id, name="forced_bos_token_id", vocab_size=vocab)
    forced_eos = token_ids(config.forced_eos_token_id, name="forced_eos_token_id", vocab_size=vocab)
    for word in config.bad_words_ids or ():
        token_ids(word, name="bad_words_ids", vocab_size=vocab)
    suppress = token_ids(config.suppress_tokens, name="suppress_tokens", vocab_size=vocab)
    begin_suppress = token_ids(config.begin_suppress_tokens, name="begin_suppress_tokens", vocab_size=vocab)
    pad = config.pad_token_id
    if pad is None and spec.pad_token_id is not None:
        pad = spec.pad_token_id
    if pad is None:  # as in Hugging Face, the first eos id; without eos no row finishes, so 0 is never used
        pad = eos[0] if eos else 0
    token_ids(pad, name="pad_token_id", vocab_size=vocab)
    if generator is not None and config.seed is not None:
        raise ValueError("generate: pass a generator or a seed, not both")
    device = _device_of(model)
    check_devices(
        device,
        input_ids=input_ids,
        attention_mask=attention_mask,
        decoder_input_ids=decoder_input_ids,
        decoder_attention_mask=decoder_attention_mask,
    )
    if isinstance(input_ids, torch.Tensor):
        input_ids = input_ids.to(device)
    if attention_mask is not None:
        attention_mask = attention_mask.to(device)
    check_inputs(model, input_ids, attention_mask, config)
    if config.decoder_prompt_ids is not None:
        decoder_input_ids = _fixed_decoder_prompt(
            model, config.decoder_prompt_ids, decoder_input_ids, rows=len(input_ids), device=device
        )
    prompt = decoder_prompt(
        model,
        decoder_input_ids.to(device) if isinstance(decoder_input_ids, torch.Tensor) else decoder_input_ids,
        decoder_attention_mask.to(device)
        if isinstance(decoder_attention_mask, torch.Tensor)
        else decoder_attention_mask,
        batch_size=input_ids.shape[0],
        max_new_tokens=config.max_new_tokens,
    )
    if config.seed is not None:
        generator = torch.Generator(device=device).manual_seed(config.seed)
    rows = input_ids.shape[0] * config.rows_per_input
    constraints = None
    if grammar is not None:
        if config.num_beams > 1:
            raise ValueError(
                "generate: json_schema (a grammar) works with greedy search and sampling, not beams"
            )
        if not eos:
            raise ValueError(
                "generate: json_schema (a grammar) needs an end-of-sequence token to end a row where its text is "
                "complete: the model has none; give eos_token_id="
            )
        vocab_of = vocabulary(tokenizer, vocab)
        constraints = [Constraint(grammar, vocab_of, stop=eos) for _ in range(rows)]
    if not model.training:  # a training loop's sample leaves the weights as training wants them
        use_decoding_layout(model, rows=rows)
    if assistant_model is not None:
        assistant_model = check_model(assistant_model)
        if _device_of(assistant_model) != device:
            raise ValueError(
                f"generate: assistant_model is on {_device_of(assistant_model)}, the model on {device}"
            )
        if compile == "cuda-graphs":
            raise ValueError("generate: assistant_model does not work with compile='cuda-graphs'; use True")
        if not assistant_model.training:
            use_decoding_layout(assistant_model, rows=rows)
    run = Run(
        model=model,
        input_ids=input_ids,
        attention_mask=attention_mask,
        config=config,
        eos=_ids_tensor(eos, device),
        pad=pad,
        generator=generator,
        step=_decode_step(model, rows=rows, compile=compile),
        decoder_prompt=prompt,
        bad_words=BadWords(config.bad_words_ids, eos_ids=eos, device=device)
        if config.bad_words_ids
        else None,
        forced_bos=_ids_tensor(forced_bos, device),
        forced_eos=_ids_tensor(forced_eos, device),
        suppress=_ids_tensor(suppress, device),
        begin_suppress=_ids_tensor(begin_suppress, device),
        constraints=constraints,
        assistant=assistant_model,
        assistant_step=_decode_step(assistant_model, rows=rows, compile=compile)
        if assistant_model is not None
        else decode_step,
    )
    if run.speculative:
        check_speculative(run, assistant_model)
    return run


def _speculative(session: Session, run: Run) -> Iterator[torch.Tensor]:
    """Speculative decoding (`zoo.generation.speculative`), the assistant in eval mode meanwhile."""
    if run.assistant is None:
        c = run.config
        assert c.prompt_lookup_num_tokens is not None
        yield from speculative_steps(
            session, run, PromptLookup(c.prompt_lookup_num_tokens, c.max_matching_ngram_size)
        )
        return
    with _eval_mode(run.assistant):
        yield from speculative_steps(session, run, Assistant(run.assistant, run, run.assistant_step))


def resolve_grammar(
    json_schema: Mapping[str, Any] | str | None, grammar: Grammar | None, tokenizer: Any
) -> Grammar | None:
    """The grammar a call asks for (``json_schema`` or ``grammar``, not both), checked before any compute."""
    if json_schema is not None and grammar is not None:
        raise ValueError("generate: give json_schema or grammar, not both")
    if json_schema is not None:
        grammar = Grammar.json_schema(json_schema)
    if grammar is not None and tokenizer is None:
        raise ValueError(
            "generate: json_schema (a grammar) needs tokenizer=, to read the model's tokens as text"
        )
    return grammar


def _decode_step(model: GenerativeModel, *, rows: int, compile: Compile) -> StepFn:
    """The per-token step a run uses (a fresh one per run for CUDA graphs: the graph records its buffers)."""
    if compile == "cuda-graphs":
        return CudaGraphStep()
    if compile is True:
        return compiled_decode_step(model, rows=rows)
    if compile is False:
        return decode_step
    raise ValueError(f"generate: compile must be True, False or 'cuda-graphs', got {compile!r}")


def _fixed_decoder_prompt(
    model: GenerativeModel,
    prompt_ids: tuple[int, ...],
    decoder_input_ids: torch.Tensor | None,
    *,
    rows: int,
    device: torch.device,
) -> torch.Tensor:
    """``decoder_prompt_ids`` as ``decoder_input_ids`` (rows, 1 + P): the start token, then the ids, every row."""
    start = model.decoder_start_token_id
    if model.continues_input or start is None:
        raise ValueError("generate: decoder_prompt_ids is for an encoder-decoder's decoder")
    if decoder_input_ids is not None:
        raise ValueError("generate: give decoder_prompt_ids or decoder_input_ids, not both")
    token_ids(prompt_ids, name="decoder_prompt_ids", vocab_size=model.spec.vocab_size)
    return torch.tensor([[start, *prompt_ids]] * rows, dtype=torch.long, device=device)  # (rows, 1 + P)


def _ids_tensor(ids: tuple[int, ...], device: torch.device) -> torch.Tensor | None:
    """Token ids as a (E,) tensor on the model's device, made once per run; None for none."""
    return torch.tensor(ids, dtype=torch.long, device=device) if ids else None


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
