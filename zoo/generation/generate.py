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

import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from zoo.generation.beam import beam_search
from zoo.generation.config import GenerationConfig, check_inputs, token_ids
from zoo.generation.sampling import LogitsProcessors, sample
from zoo.generation.session import Session, StepFn, decode_step

Streamer = Callable[[torch.Tensor], Any]


@dataclass
class _Run:
    """A validated generate call: settings, processors, the random generator, and the model's side."""

    model: nn.Module
    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    config: GenerationConfig
    eos: torch.Tensor | None  # (E,) end-of-sequence ids, None when there are none
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
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    max_new_tokens: int = 32,
    min_new_tokens: int = 0,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    num_beams: int = 1,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    repetition_penalty: float = 1.0,
    no_repeat_ngram_size: int = 0,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    use_cache: bool = True,
    streamer: Streamer | None = None,
    compile: bool = False,
) -> torch.Tensor:
    """Generate token ids with greedy search, sampling or beam search (Hugging Face semantics).

    input_ids (B, T): the prompt (decoder-only, left-padded) or the source (encoder-decoder);
    attention_mask (B, T): 1 = token, 0 = padding. Returns (B, T + n) prompt + new tokens for a decoder,
    (B, 1 + n) decoder ids starting with ``spec.start_token_id`` for an encoder-decoder, n <= max_new_tokens.

    Args:
        max_new_tokens / min_new_tokens: bounds on the new tokens (eos is blocked before the minimum).
        do_sample, temperature, top_k, top_p: sample from the (warped) distribution instead of argmax.
        num_beams, length_penalty, early_stopping: beam search; a finished hypothesis scores
            sum(log p) / generated_length ** length_penalty.
        repetition_penalty, no_repeat_ngram_size: discourage / forbid repeats (as in Hugging Face).
        eos_token_id: an id or a list (default ``spec.eos_token_id``; ``[]`` for none); pad_token_id
            fills finished rows (default ``spec.pad_token_id``, else the first eos id).
        generator / seed: the random source of sampling, for reproducible draws.
        use_cache: False recomputes the whole sequence every step (the reference for the cached path).
        streamer: called with each step's new tokens (B,) as they are produced (not with beam search).
        compile: run the decode step through ``torch.compile``.

    The model runs in eval mode (dropout off) under ``torch.no_grad``; its previous mode is restored.
    """
    settings = locals()  # every argument above, by name (the first statement, so nothing else is in it)
    run = _prepare(
        model, input_ids, attention_mask, settings, generator=generator, seed=seed, compile=compile
    )
    if streamer is not None and run.config.num_beams > 1:
        raise ValueError("generate: streamer works with greedy search and sampling, not with num_beams > 1")
    with _eval_mode(model), torch.no_grad():
        session = run.session()
        if run.config.num_beams > 1:
            return beam_search(
                session, run.processors(session), run.config, eos=run.eos, generator=run.generator
            )
        for tokens in _steps(session, run):
            if streamer is not None:
                streamer(tokens)
        return session.sequences.clone()


def stream(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any
           ) -> Iterator[torch.Tensor]:  # fmt: skip
    """Like `generate` (same arguments, no beam search), but yield each step's new tokens (B,) as they come.

    >>> for tokens in zoo.generation.stream(model, prompt, max_new_tokens=20):
    ...     print(tokenizer.decode(tokens[:1]), end="", flush=True)

    Arguments are checked when `stream` is called, before the first token is computed.
    """
    if kwargs.get("streamer") is not None:
        raise ValueError("stream: pass no streamer; iterate over the returned tokens instead")
    if kwargs.get("num_beams", 1) != 1:
        raise ValueError("stream: beam search (num_beams > 1) has no stream; call generate")
    run = _prepare(
        model, input_ids, attention_mask, kwargs,
        generator=kwargs.get("generator"), seed=kwargs.get("seed"), compile=kwargs.get("compile", False),
    )  # fmt: skip
    return _stream(run)


@torch.no_grad()
def _stream(run: _Run) -> Iterator[torch.Tensor]:
    # torch.no_grad on a generator function re-enters no-grad around every resume: it does not leak.
    with _eval_mode(run.model):
        yield from _steps(run.session(), run)


def _steps(session: Session, run: _Run) -> Iterator[torch.Tensor]:
    """Greedy search or sampling: append one token per row per step and yield it (B,)."""
    config, eos, generator = run.config, run.eos, run.generator
    processors = run.processors(session)
    pad = config.pad_token_id
    unfinished = (
        torch.ones(session.batch_size, dtype=torch.bool, device=session.tokens.device)
        if eos is not None
        else None
    )
    for step in range(config.max_new_tokens):
        scores = session.logits().float()  # (B, V); float32 also makes argmax 4x faster than on bfloat16
        if processors.active:
            scores = processors(scores, session.sequences, session.valid, step)
        tokens = sample(scores, generator) if config.do_sample else scores.argmax(dim=-1)  # (B,)
        if unfinished is not None:
            tokens = torch.where(unfinished, tokens, pad)
            unfinished &= ~torch.isin(tokens, eos)
        session.append(tokens)
        processors.observe(tokens)
        yield tokens
        if unfinished is not None and not bool(unfinished.any()):
            return


def _prepare(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    settings: dict[str, Any],
    *,
    generator: torch.Generator | None,
    seed: int | None,
    compile: bool,
) -> _Run:
    """Resolve defaults from the spec and validate everything, before any compute."""
    known = {f for f in GenerationConfig.__dataclass_fields__}
    extra = (
        set(settings)
        - known
        - {"model", "input_ids", "attention_mask", "generator", "seed", "streamer", "compile"}
    )
    if extra:
        raise TypeError(f"generate got unexpected arguments: {', '.join(sorted(extra))}")
    spec = getattr(model, "spec", None)
    if spec is None:
        raise ValueError(f"generate needs a zoo model (with .spec), got {type(model).__name__}")
    vocab = spec.vocab_size
    eos_arg = settings.get("eos_token_id")
    eos = token_ids(
        eos_arg if eos_arg is not None else spec.eos_token_id, name="eos_token_id", vocab_size=vocab
    )
    pad = settings.get("pad_token_id")
    if pad is None and spec.pad_token_id is not None:
        pad = spec.pad_token_id
    if pad is None:  # as in Hugging Face, the first eos id; without eos no row finishes, so 0 is never used
        pad = eos[0] if eos else 0
    token_ids(pad, name="pad_token_id", vocab_size=vocab)
    values = {k: v for k, v in settings.items() if k in known and k not in ("eos_token_id", "pad_token_id")}
    config = GenerationConfig(**values, eos_token_id=eos, pad_token_id=pad)
    config.check()
    if generator is not None and seed is not None:
        raise ValueError("generate: pass a generator or a seed, not both")
    device = _device_of(model)
    if isinstance(input_ids, torch.Tensor):
        input_ids = input_ids.to(device)
    if attention_mask is not None:
        attention_mask = attention_mask.to(device)
    check_inputs(model, input_ids, attention_mask, config)
    if seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
    return _Run(
        model=model,
        input_ids=input_ids,
        attention_mask=attention_mask,
        config=config,
        eos=torch.tensor(eos, dtype=torch.long, device=device) if eos else None,
        generator=generator,
        step=compiled_decode_step(model, rows=input_ids.shape[0] * config.num_beams)
        if compile
        else decode_step,
    )


def _device_of(model: nn.Module) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    return torch.device("cpu")


_COMPILED: dict[bool, StepFn] = {}
_FROZEN_WEIGHTS: weakref.WeakKeyDictionary[nn.Module, tuple[int, ...]] = weakref.WeakKeyDictionary()


def compiled_decode_step(model: nn.Module, *, rows: int) -> StepFn:
    """`decode_step` through ``torch.compile`` (dynamic shapes: the attended length grows every step).

    Half-precision models are compiled with Inductor's weight *freezing*: the weights become constants of
    the compiled graph, prepacked for oneDNN, which is where most of the speed comes from on CPU (bf16 decode
    ~1.4x faster than compiling without it). Constants go stale if the weights change, so the weights'
    versions are recorded and any in-place update since (an optimizer step, ``load_state_dict``) resets
    torch.compile's caches and compiles anew. float32 is frozen only for a single row: prepacked float32
    weights beat the default kernels at batch 1 (8.6 vs 10.9 ms/token on the bench's GPT shape) but lose at
    batch 8 (18.1 vs 15.8 ms).
    """
    freeze = next(model.parameters()).dtype in (torch.bfloat16, torch.float16) or rows == 1
    if freeze:
        versions = tuple(p._version for p in model.parameters())
        if model in _FROZEN_WEIGHTS and _FROZEN_WEIGHTS[model] != versions:
            torch._dynamo.reset()  # the frozen constants are stale: drop every compiled graph
            _COMPILED.clear()
        _FROZEN_WEIGHTS[model] = versions
    if freeze not in _COMPILED:
        from torch._inductor import config as inductor_config  # heavy: only when compiling

        compiled = torch.compile(decode_step, dynamic=True)

        def step(*args: Any) -> torch.Tensor:
            # Compilation is lazy (first call, and any recompile), so the setting must hold around the call.
            with inductor_config.patch(freezing=freeze):
                return compiled(*args)

        _COMPILED[freeze] = step
    return _COMPILED[freeze]


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """Dropout off while generating; the model's previous train/eval mode is restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
