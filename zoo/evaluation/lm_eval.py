"""`ZooLM`: a zoo decoder and its tokenizer as an lm-evaluation-harness model, registered as ``"zoo"``.

    import zoo.evaluation.lm_eval                       # registers "zoo" with lm-eval's model registry
    lm_eval.simple_evaluate(model="zoo", model_args="pretrained=runs/gpt/final", tasks=["hellaswag"])
    lm_eval.simple_evaluate(model=ZooLM(model, tokenizer=tok, batch_size=16), tasks=[...])

The three request types, each batched (``batch_size`` rows per forward pass), longest first:

    loglikelihood          (context, continuation) -> (sum of the continuation's log-probs, is greedy);
                           requests whose inputs are identical (one-token answers to one question) share a
                           row; the LM head runs only at the scored positions (`zoo.evaluation.scoring`)
    loglikelihood_rolling  a whole text, cut into windows of ``max_length`` tokens with lm-eval's own
                           rolling-window functions (each token predicted once, the most context each);
                           all the windows of all the texts are scored together, sorted by length
    generate_until         prompts left-padded and cut to ``max_length - max_gen_toks`` tokens, continued
                           with the KV cache (greedy, or sampled from ``do_sample`` / ``temperature`` /
                           ``top_p`` / ``top_k``), stopped at the ``until`` strings (`zoo.evaluation.generating`)

Tokenisation follows lm-eval's ``hf`` model (HFLM) on the same folder, so that the scores agree: a context
and its continuation are encoded whole and split (trailing spaces of the context moved to the
continuation: lm-eval's ``TemplateLM``); an empty context is the ``prefix_token_id`` (bos, else eos). The
special tokens a text gets are those the tokenizer's post-processor puts *before* it (a Llama tokenizer's
bos; none for GPT-2's), as transformers' ``encode`` adds them; ``add_bos_token`` overrides that, as HFLM's
does. Deliberately unlike HFLM, tokens a post-processor puts *after* a text (a zoo-trained tokenizer saved
alone by ``save_pretrained``, framed ``[*ids, eos]``) are never added: an eos closing every context would be
scored as part of the continuation. A tokenizer with no post-processor at all (one zoo trained) gets its bos
first, as zoo's `causal_lm` training framed every document.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from zoo.devices import resolve_device, resolve_dtype
from zoo.evaluation import generating, scoring
from zoo.evaluation.errors import EvaluationError, LmEvalMissingError, missing_lm_eval
from zoo.io.pretrained import load_pretrained
from zoo.io.tokenizer import ChatTemplateError, Tokenizer

try:
    import lm_eval.models  # noqa: F401  (fills the registry with lm-eval's own names before "zoo" joins them)
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
except ModuleNotFoundError as error:
    if missing_lm_eval(error):
        raise LmEvalMissingError() from None
    raise

if TYPE_CHECKING:
    from lm_eval.api.instance import Instance

    from zoo.models.base import ZooModel

PathLike = str | os.PathLike[str]
DEFAULT_MAX_GEN_TOKS = 256  # HFLM's
# The generation settings a task's generation_kwargs may carry, besides until and the max-token aliases.
_SAMPLING = ("top_p", "top_k", "repetition_penalty", "min_new_tokens", "no_repeat_ngram_size")
_MAX_TOKENS = ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens")  # lm-eval's order


@register_model("zoo")
class ZooLM(TemplateLM):
    """A zoo decoder-only model and its tokenizer, as lm-eval's ``LM`` (see the module docstring).

    Args:
        pretrained: a folder `zoo.load_pretrained` reads (a zoo checkpoint or a Hugging Face folder, each with
            its tokenizer.json), or a loaded zoo decoder (then ``tokenizer`` is required).
        tokenizer: a `zoo.Tokenizer` or a tokenizer.json / folder; default: the folder's.
        batch_size: rows per forward pass (an int, or its string from ``model_args``).
        device: "auto" (the default: cuda when available), "cpu", "cuda", "cuda:N", "mps"; a loaded model is
            moved there only when given.
        dtype: the weights' dtype ("float32", "bfloat16", ...; "auto" or None keeps the stored one).
        max_length: the tokens a forward pass may hold; default the model's ``max_positions``.
        max_gen_toks: new tokens when a task's generation_kwargs do not say (default 256, as HFLM).
        add_bos_token: None follows the tokenizer (its post-processor's leading tokens); True puts the bos
            token first; False adds no special token.
        max_batch_size: accepted for lm-eval's interface (``simple_evaluate`` passes it); unused.
    """

    def __init__(
        self,
        pretrained: PathLike | ZooModel,
        tokenizer: Tokenizer | PathLike | None = None,
        *,
        batch_size: int | str = 1,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        max_length: int | None = None,
        max_gen_toks: int = DEFAULT_MAX_GEN_TOKS,
        add_bos_token: bool | None = None,
        max_batch_size: int | None = None,
    ) -> None:
        super().__init__()
        dtype = None if dtype == "auto" else resolve_dtype(dtype)
        if isinstance(pretrained, str | os.PathLike):
            loaded = load_pretrained(pretrained, device=resolve_device(device or "auto"), dtype=dtype)
            model, tok, self.source = loaded.model, loaded.tokenizer, str(pretrained)
        else:
            model, tok, self.source = pretrained, None, type(pretrained).__name__
            if device is not None or dtype is not None:
                model = model.to(device=resolve_device(device or "auto") if device else None, dtype=dtype)
        if tokenizer is not None:
            tok = tokenizer if isinstance(tokenizer, Tokenizer) else Tokenizer.from_file(tokenizer)
        if tok is None:
            raise EvaluationError(
                "ZooLM: a model object needs its tokenizer (tokenizer=zoo.Tokenizer or a path)"
            )
        spec = getattr(model, "spec", None)
        if spec is None or spec.family != "decoder" or getattr(model, "lm_head", None) is None:
            what = spec.family if spec is not None else type(model).__name__
            raise EvaluationError(
                f"ZooLM evaluates decoder-only language models (an LM head); got a {what} model"
            )
        self.model = model.eval()
        self.tokenizer = tok
        self.batch_size = _positive_int(batch_size, "batch_size")
        self._max_length = _positive_int(max_length or spec.max_positions, "max_length")
        self._max_gen_toks = _positive_int(max_gen_toks, "max_gen_toks")
        bos, eos = tok.bos_id, tok.eos_id
        if add_bos_token is not None and not isinstance(add_bos_token, bool):
            raise EvaluationError(f"add_bos_token must be true, false or unset; got {add_bos_token!r}")
        if add_bos_token and bos is None:
            raise EvaluationError(f"add_bos_token=True but {tok.source} has no bos token")
        self.add_bos_token = add_bos_token
        if bos is None and eos is None:
            raise EvaluationError(
                f"{tok.source}: the tokenizer has neither a bos nor an eos token; lm-eval conditions an empty "
                "context on one of them"
            )
        prefix = bos if bos is not None else eos
        assert prefix is not None  # checked above
        self._eos = eos
        self._prefix_id: int = prefix
        self._pad_id: int = tok.pad_id if tok.pad_id is not None else prefix
        # The special tokens the tokenizer's post-processor puts before a text (transformers' encode adds
        # them), found once from a probe; and the prefix's text, which a string may already start with.
        probe = tok.hf.encode("a", add_special_tokens=True)
        leading = next((i for i, special in enumerate(probe.special_tokens_mask) if not special), 0)
        self._frame = list(probe.ids[:leading])
        if tok.hf.post_processor is None and bos is not None:
            # A tokenizer zoo trained has no post-processor; zoo trains a causal LM on `bos text eos`
            # documents, so its model expects the bos first (without it, a model trained so scores as if
            # mid-document).
            self._frame = [bos]
        self._prefix_text = tok.decode([self._prefix_id], skip_special_tokens=False)

    # --- what lm-eval asks of a model -------------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        """The end-of-text id (eos; bos when the tokenizer has no eos)."""
        return self._eos if self._eos is not None else self._prefix_id

    @property
    def prefix_token_id(self) -> int:
        """What an empty context is: bos, else eos (as HFLM)."""
        return self._prefix_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def tokenizer_name(self) -> str:
        return str(self.tokenizer.source).replace("/", "__")

    # --- chat templates (lm-eval's --apply_chat_template) -------------------------------------------------------
    def chat_template(self, chat_template: bool | str = False) -> str | None:
        """The template lm-eval renders few-shot chats with (it records it in the results): the tokenizer's
        (a named one when ``chat_template`` names it), else zoo's default; None when disabled."""
        if chat_template is False or chat_template is None:
            return None
        tok = self.tokenizer
        if isinstance(chat_template, str) and chat_template in tok.chat_templates:
            return tok.chat_templates[chat_template]
        return tok.chat_template or tok.default_chat_template

    def apply_chat_template(
        self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """A few-shot chat as the prompt text, through the tokenizer's chat template (HFLM's way: the last
        assistant message is continued when no generation prompt is asked for; a template that refuses a
        system message is tried again without it)."""

        def render(history: list[dict[str, str]]) -> str:
            text = self.tokenizer.apply_chat_template(
                history,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=not add_generation_prompt,
                tokenize=False,
            )
            assert isinstance(text, str)
            return text

        try:
            return render(chat_history)
        except ChatTemplateError:
            return render([message for message in chat_history if message.get("role") != "system"])

    def get_model_info(self) -> dict[str, Any]:
        """What lm-eval records in its results' ``config``."""
        first = next(self.model.parameters())
        return {
            "model_source": self.source,
            "model_num_parameters": sum(p.numel() for p in self.model.parameters()),
            "model_dtype": str(first.dtype),
        }

    # --- tokenisation ---------------------------------------------------------------------------------------
    def _framing(self, text: str, add_special_tokens: bool | None) -> list[int]:
        """The special ids put before ``text``: HFLM's rules (see the module docstring)."""
        if add_special_tokens is None:
            if self._prefix_text and text.startswith(self._prefix_text):
                return []  # the text already starts with its bos
            add_special_tokens = self.add_bos_token
        if add_special_tokens is None:
            return self._frame
        if not add_special_tokens:
            return []
        return self._frame if self.add_bos_token is None else [self._prefix_id]

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        """The ids of ``string``, with the special tokens `_framing` says."""
        return self._encode([string], add_special_tokens)[0]

    def _encode(self, strings: Sequence[str], add_special_tokens: bool | None = None) -> list[list[int]]:
        """`tok_encode` for many strings (encoded in parallel by the Rust tokenizer)."""
        plain = self.tokenizer.encode_ids(list(strings))
        return [[*self._framing(s, add_special_tokens), *ids] for s, ids in zip(strings, plain, strict=True)]

    def tok_decode(self, tokens: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)

    # --- loglikelihood ----------------------------------------------------------------------------------------
    def loglikelihood(self, requests: list[Instance], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """(log-prob of the continuation, is greedy) per (context, continuation) request."""
        pairs = [req.args for req in requests]
        return self._loglikelihood_tokens(self._encode_pairs(pairs), disable_tqdm=disable_tqdm)

    def _encode_pairs(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[Any, list[int], list[int]]]:
        """TemplateLM's encoding of each (context, continuation), all strings encoded in one batch: the
        context's trailing spaces moved to the continuation, context + continuation encoded whole and split
        after the context's tokens; an empty context is the prefix token."""
        contexts, wholes, empty = [], [], []
        for context, continuation in pairs:
            if context:
                spaces = len(context) - len(context.rstrip())
                if spaces:
                    context, continuation = context[:-spaces], context[-spaces:] + continuation
                contexts.append(context)
                wholes.append(context + continuation)
            else:
                empty.append(continuation)
        context_ids = iter(self._encode(contexts))
        whole_ids = iter(self._encode(wholes))
        alone_ids = iter(self._encode(empty, add_special_tokens=False))
        out: list[tuple[Any, list[int], list[int]]] = []
        for pair in pairs:
            if pair[0]:
                context_enc, whole = next(context_ids), next(whole_ids)
                out.append((pair, context_enc, whole[len(context_enc) :]))
            else:
                alone = next(alone_ids)
                # A continuation that starts with the prefix token has it as its context.
                if alone and alone[0] == self.prefix_token_id:
                    out.append((pair, alone[:1], alone[1:]))
                else:
                    out.append((pair, [self.prefix_token_id], alone))
        return out

    def _loglikelihood_tokens(
        self, requests: list[tuple[Any, list[int], list[int]]], disable_tqdm: bool = False, **kwargs: Any
    ) -> list[tuple[float, bool]]:
        """Score (key, context ids, continuation ids) requests, `batch_size` distinct inputs a forward pass."""
        limit = self.max_length
        inputs: dict[tuple[int, ...], list[int]] = {}  # distinct model input -> the requests reading it
        for index, (_, context, continuation) in enumerate(requests):
            if not continuation:
                raise EvaluationError(
                    f"request {index}: the continuation has no tokens: there is nothing to score"
                )
            if len(continuation) > limit:
                raise EvaluationError(
                    f"request {index}: a continuation of {len(continuation)} tokens is longer than the "
                    f"{limit} a forward pass holds (max_length)"
                )
            # Cut from the left to fit; the last token is only predicted, never read.
            row = tuple((context + continuation)[-(limit + 1) : -1])
            inputs.setdefault(row, []).append(index)
        # Longest first: a batch too large for the device fails at once, not at the end.
        order = sorted(inputs, key=lambda row: (-len(row), row))
        results: list[tuple[float, bool]] = [(0.0, False)] * len(requests)
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            owners = [(u, index) for u, row in enumerate(rows) for index in inputs[row]]
            totals, greedy = scoring.score(
                self.model, rows, [(u, requests[i][2]) for u, i in owners], pad_id=self._pad_id
            )
            for (_, index), total, is_greedy in zip(owners, totals, greedy, strict=True):
                results[index] = (total, is_greedy)
                key = requests[index][0]
                if key is not None:  # rolling windows are cached per text, by the caller
                    self.cache_hook.add_partial("loglikelihood", key, results[index])
        return results

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False) -> list[float]:
        """The log-likelihood of each whole text: its windows of `max_length` tokens, scored together."""
        strings = [req.args[0] for req in requests]
        windows: list[tuple[Any, list[int], list[int]]] = []
        owner: list[int] = []
        for index, tokens in enumerate(self._encode(strings)):
            pieces = get_rolling_token_windows(
                token_list=tokens,
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            )
            for context, continuation in map(make_disjoint_window, pieces):
                windows.append((None, context, continuation))
                owner.append(index)
        totals = [0.0] * len(strings)
        for index, (logprob, _) in zip(owner, self._loglikelihood_tokens(windows), strict=True):
            totals[index] += logprob
        for string, total in zip(strings, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
        return totals

    # --- generation -------------------------------------------------------------------------------------------
    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        """Each (context, generation_kwargs) request's continuation, cut at its ``until`` strings."""
        results: list[str] = [""] * len(requests)
        groups: dict[str, list[int]] = {}  # one batch never mixes settings (greedy with sampling, ...)
        for index, req in enumerate(requests):
            groups.setdefault(repr(sorted(req.args[1].items(), key=str)), []).append(index)
        eos_text = self.tok_decode([self.eot_token_id], skip_special_tokens=False)
        for indices in groups.values():
            first = requests[indices[0]]
            stops, max_new, settings = _generation_settings(first.args[1], self.max_gen_toks, first.task_name)
            if eos_text and eos_text not in stops:
                stops.append(eos_text)
            room = self.max_length - max_new
            if room < 1:
                raise EvaluationError(
                    f"task {first.task_name}: max_gen_toks ({max_new}) leaves no room for a prompt in the "
                    f"model's {self.max_length} positions"
                )
            prompts = [ids[-room:] for ids in self._encode([requests[i].args[0] for i in indices])]
            order = sorted(range(len(indices)), key=lambda k: -len(prompts[k]))  # longest first
            for start in range(0, len(order), self.batch_size):
                batch = order[start : start + self.batch_size]
                texts = generating.generate_until(
                    self.model,
                    self.tokenizer,
                    [prompts[k] for k in batch],
                    stops=stops,
                    max_new_tokens=max_new,
                    eos_id=self._eos,
                    pad_id=self._pad_id,
                    settings=settings,
                )
                for k, text in zip(batch, texts, strict=True):
                    req = requests[indices[k]]
                    results[indices[k]] = text
                    self.cache_hook.add_partial("generate_until", req.args, text)
        return results


def _generation_settings(
    gen_kwargs: dict[str, Any], default_max: int, task: str | None
) -> tuple[list[str], int, dict[str, Any]]:
    """A task's generation_kwargs -> (stop strings, max new tokens, `GenerationConfig` fields), read as
    lm-eval reads them: ``until`` a string or a list; the first of ``max_gen_toks`` / ``max_new_tokens`` /
    ``max_tokens`` / ``max_completion_tokens``; sampling when ``do_sample``, or when unset and temperature > 0."""
    kwargs = dict(gen_kwargs)
    where = f"task {task}: generation_kwargs" if task else "generation_kwargs"
    until = kwargs.pop("until", None)
    stops = [until] if isinstance(until, str) else list(until) if isinstance(until, list | tuple) else None
    if until is not None and (stops is None or not all(isinstance(stop, str) for stop in stops)):
        raise EvaluationError(f"{where}: until must be a string or a list of strings; got {until!r}")
    stops = stops or []
    given = [kwargs.pop(name) for name in _MAX_TOKENS if name in kwargs]
    given = [value for value in given if value is not None]
    max_new = _positive_int(given[0] if given else default_max, f"{where}: max_gen_toks")
    given_temperature = kwargs.pop("temperature", None)
    temperature = float(given_temperature or 0.0)
    do_sample = kwargs.pop("do_sample", None)
    do_sample = temperature > 0 if do_sample is None else bool(do_sample)
    settings: dict[str, Any] = {"do_sample": do_sample}
    if do_sample and given_temperature is not None:  # 0 included: greedy search, zoo's rule everywhere
        settings["temperature"] = temperature
    for name in _SAMPLING:
        if name in kwargs:
            settings[name] = kwargs.pop(name)
    kwargs.pop("max_length", None)  # HF's prompt + new tokens: the prompt is cut to fit instead
    if kwargs:
        raise EvaluationError(
            f"{where}: {', '.join(sorted(kwargs))} not understood (zoo's generation takes until, do_sample, "
            f"temperature, {', '.join(_SAMPLING)} and max_gen_toks)"
        )
    return stops, max_new, settings


def _positive_int(value: object, name: str) -> int:
    """``value`` as an int >= 1 (model_args arrive as strings or ints); else an EvaluationError naming it."""
    if isinstance(value, bool):
        number = 0
    elif isinstance(value, int):
        number = value
    else:
        try:
            number = int(str(value))
        except ValueError:
            number = 0
    if number < 1:
        raise EvaluationError(f"{name} must be an int >= 1; got {value!r}")
    return number


__all__ = ["ZooLM"]
