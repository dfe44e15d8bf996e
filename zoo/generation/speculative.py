"""Speculative decoding: draft k tokens cheaply, verify them with one forward of the target model.

Shapes: B rows, k drafted tokens, V vocab.

    draft      an ``assistant_model`` (a smaller model with the target's vocabulary) run greedily — or
               sampled, when the target samples — over its own KV cache; or prompt lookup: the tokens that
               followed the last n-gram where it occurred before in the prompt and output (transformers'
               ``prompt_lookup_num_tokens``, n = ``max_matching_ngram_size`` down to 1), no model at all.
               The assistant's draft stops early, as transformers', once every row has drafted an eos or a
               token it gave a probability below ``assistant_confidence_threshold`` (default 0: off).
    verify     the target runs once over the uncached tokens and the k drafts: logits (B, k + 1, V).
    accept     greedy: the longest prefix where the target's argmax equals the draft, then the target's own
               next token, so the output is plain greedy's token for token. Sampling: draft i is accepted
               with probability min(1, p(d) / q(d)), the first rejected one resampled from
               norm(max(0, p - q)) (Leviathan et al. 2023, Chen et al. 2023), so each token is distributed as
               the target's; a prompt-lookup draft is deterministic (q is one-hot on it), as in transformers.
    roll back  both KV caches are cropped to the accepted length; rejected keys are overwritten next round.

Rows of a batch accept different lengths; every row advances by the shortest acceptance of the round (its
accepted drafts and the target's token after them), which keeps each row exact — a row that accepted more
simply re-verifies those drafts next round. Sliding-window layers keep a full cache under their window's
mask (a rolling slot cannot take back a rejected key). ``compile=True`` compiles the assistant's per-token
step; the target's verification forward of k + 1 tokens runs eagerly.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

import torch

from zoo.generation.cache import KVCache
from zoo.generation.config import GenerationConfig
from zoo.generation.protocol import GenerationState, GenerativeModel
from zoo.generation.sampling import LogitsProcessors, check_finite
from zoo.generation.session import Session, StepFn


class Run(Protocol):
    """What speculative decoding reads of a validated call (`zoo.generation.generate.Run`)."""

    model: GenerativeModel
    input_ids: torch.Tensor  # (B, T)
    attention_mask: torch.Tensor | None
    config: GenerationConfig
    eos: torch.Tensor | None  # (E,)
    pad: int
    generator: torch.Generator | None
    decoder_prompt: tuple[torch.Tensor, torch.Tensor | None] | None
    forced_bos: torch.Tensor | None
    forced_eos: torch.Tensor | None
    constraints: list[Any] | None


@runtime_checkable
class Verifier(Protocol):
    """A `GenerativeModel` that also returns the logits of every fed position (zoo's models do)."""

    def all_token_logits(
        self,
        ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        cache: KVCache | None,
        state: GenerationState,
        keep: int,
    ) -> torch.Tensor:
        """ids (R, t) -> logits (R, keep, V) of the last ``keep`` positions, writing the keys/values into
        ``cache`` (as `next_token_logits` does)."""
        ...


class Drafter(Protocol):
    """Proposes draft tokens after a session's sequences, and follows the tokens the target accepted."""

    def propose(self, session: Session, k: int) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """Up to k drafts (B, k') and their draft probabilities (B, k', V) or None (deterministic drafts);
        None when there is nothing to propose."""
        ...

    def accepted(self, session: Session, start: int) -> None:
        """The target's sequences now hold its accepted drafts up to column ``start``, its own tokens after."""
        ...

    def schedule(self, k: int, proposed: int, taken: int) -> int:
        """The next round's draft length after ``taken`` of ``proposed`` drafts were accepted."""
        ...


class PromptLookup:
    """Drafts by n-gram lookup in each row's own prompt and output (transformers' prompt lookup decoding)."""

    def __init__(self, num_tokens: int, max_ngram: int) -> None:
        self.num_tokens, self.max_ngram = num_tokens, max_ngram

    def propose(self, session: Session, k: int) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        rows = session.sequences.cpu()  # (B, n): one host copy per round; the search is small integer work
        drafts = [_lookup(row, self.max_ngram, k) for row in rows]
        longest = max(len(d) for d in drafts)
        if longest == 0:
            return None
        out = torch.zeros(
            len(drafts), longest, dtype=torch.long
        )  # a short row's filler is verified like any draft
        for i, d in enumerate(drafts):
            out[i, : len(d)] = d
        return out.to(session.tokens.device), None

    def accepted(self, session: Session, start: int) -> None:
        pass

    def schedule(self, k: int, proposed: int, taken: int) -> int:
        return k


def _lookup(row: torch.Tensor, max_ngram: int, k: int) -> torch.Tensor:
    """The up to k tokens after the earliest earlier occurrence of the row's last n-gram, longest n first."""
    length = row.shape[0]
    for n in range(min(max_ngram, length - 1), 0, -1):
        windows = row.unfold(0, n, 1)  # (length - n + 1, n)
        hits = (windows == row[-n:]).all(dim=1).nonzero().flatten().tolist()
        for start in hits:
            begin, end = start + n, min(start + n + k, length)
            if begin < end:
                return row[begin:end]
    return row[:0]


class Assistant:
    """Drafts with a smaller model over its own session (its own KV cache), kept in step with the target's."""

    def __init__(self, model: GenerativeModel, run: Run, step: StepFn) -> None:
        c = run.config
        self.model, self.config = model, c
        self.session = Session(
            model,
            run.input_ids,
            run.attention_mask,
            max_new_tokens=c.max_new_tokens,
            num_beams=c.rows_per_input,
            step=step,
            decoder_prompt=run.decoder_prompt,
            rolling=False,
        )
        # The assistant draws from the same warped distribution the target samples from (temperature, top-k/p).
        self.warp = LogitsProcessors(
            vocab_size=model.spec.vocab_size,
            do_sample=c.sampling,
            temperature=c.temperature,
            top_k=c.top_k,
            top_p=c.top_p,
        )
        self.generator = run.generator
        self.eos, self.threshold = run.eos, c.assistant_confidence_threshold
        # rows the target has finished (an eos among its new tokens): they no longer keep a draft going
        self.finished = torch.zeros(self.session.batch_size, dtype=torch.bool, device=run.input_ids.device)
        self.seen = self.session.length  # the target's new tokens before this column are in ``finished``

    def propose(self, session: Session, k: int) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        own = self.session
        drafts, probs = [], []
        going = ~self.finished  # (B,): rows whose draft has not stopped
        stops = self.eos is not None or self.threshold > 0
        for _ in range(k):
            scores = own.logits().float()  # (B, V)
            if self.config.sampling:
                p = self.warp(scores, own.sequences, own.valid, 0).softmax(dim=-1)  # (B, V)
                token = torch.multinomial(p, 1, generator=self.generator).squeeze(1)  # (B,)
                probs.append(p)
            else:
                p, token = scores, scores.argmax(dim=-1)  # (B, V) logits (softmaxed below), (B,)
            own.append(token)
            drafts.append(token)
            if not stops:
                continue
            # transformers' draft stopping: after an eos (EosTokenCriteria) or after a token the draft gave a
            # probability below the threshold (ConfidenceCriteria; the drafted token is kept). It reads row 0
            # (its assisted generation is batch 1); here a row stops alone, and the draft of the batch stops
            # once every row has (a stopped row's further drafts cost nothing more to verify and stay exact).
            if self.eos is not None:
                going = going & ~torch.isin(token, self.eos)
            if self.threshold > 0:
                confidence = p.gather(1, token[:, None]).squeeze(1)  # (B,)
                if not self.config.sampling:
                    confidence = confidence.sub(p.logsumexp(dim=-1)).exp()  # softmax at the argmax
                going = going & (confidence >= self.threshold)
            if not bool(going.any()):  # the draft's one host read per token, as transformers' criteria
                break
        return torch.stack(drafts, 1), torch.stack(probs, 1) if probs else None  # (B, k'), (B, k', V)

    def accepted(self, session: Session, start: int) -> None:
        own = self.session
        end = session.length
        if self.eos is not None:
            new = session.tokens[:, self.seen : end]  # (B, t): the target's tokens since the last round
            self.finished |= torch.isin(new, self.eos).any(dim=1)
            self.seen = end
        own.tokens[:, start:end] = session.tokens[:, start:end]
        assert own.cache is not None
        own.cache.crop(start)  # keys before ``start`` are the accepted drafts'; from it on, rejected ones
        own.length = end

    def schedule(self, k: int, proposed: int, taken: int) -> int:
        if self.config.num_assistant_tokens_schedule == "heuristic":
            return k + 2 if taken == proposed else max(1, k - 1)
        return k


def check_speculative(run: Run, assistant: GenerativeModel | None) -> None:
    """Refuse, by name, what speculative decoding does not combine with; before any compute."""
    c = run.config
    if assistant is not None and c.prompt_lookup_num_tokens is not None:
        raise ValueError("generate: give assistant_model or prompt_lookup_num_tokens, not both")
    what = "assistant_model" if assistant is not None else "prompt_lookup_num_tokens"
    if not isinstance(run.model, Verifier):
        raise ValueError(f"generate: {what} needs a model with all_token_logits (every position's logits)")
    refused = {
        "num_beams > 1": c.num_beams > 1,
        "use_cache=False": not c.use_cache,
        "repetition_penalty": c.repetition_penalty != 1.0,
        "no_repeat_ngram_size": c.no_repeat_ngram_size > 0,
        "bad_words_ids": bool(c.bad_words_ids),
        "min_new_tokens": c.min_new_tokens > 0,
        "forced_bos_token_id": run.forced_bos is not None,
        "forced_eos_token_id": run.forced_eos is not None,
        "json_schema / grammar": run.constraints is not None,
    }
    for name, used in refused.items():
        if used:
            raise ValueError(f"generate: {what} (speculative decoding) does not work with {name}")
    if assistant is None:
        return
    target = run.model
    if assistant.spec.vocab_size != target.spec.vocab_size:
        raise ValueError(
            f"generate: assistant_model has vocab_size {assistant.spec.vocab_size}, the model "
            f"{target.spec.vocab_size}; the draft must share the target's tokenizer"
        )
    if assistant.continues_input != target.continues_input or (
        assistant.decoder_start_token_id != target.decoder_start_token_id
    ):
        raise ValueError(
            "generate: assistant_model must be the same kind as the model (decoder-only or encoder-decoder, "
            "same decoder_start_token_id)"
        )
    needed = run.input_ids.shape[1] + c.max_new_tokens if target.continues_input else 1 + c.max_new_tokens
    if assistant.spec.max_positions < needed:
        raise ValueError(
            f"generate: assistant_model's max_positions ({assistant.spec.max_positions}) is shorter than the "
            f"{needed} positions this call needs"
        )


def speculative_steps(session: Session, run: Run, drafter: Drafter) -> Iterator[torch.Tensor]:
    """Greedy search or sampling by draft and verify: yield each accepted token (B,) in order."""
    config, eos, generator, model = run.config, run.eos, run.generator, run.model
    assert isinstance(model, Verifier)  # `check_speculative`
    if session.refill_column is not None:
        raise ValueError("generate: speculative decoding does not work with LongRoPE's table switch")
    cache = session.cache
    assert cache is not None  # use_cache=False is refused (`check_speculative`)
    warp = LogitsProcessors(
        vocab_size=model.spec.vocab_size,
        do_sample=config.sampling,
        temperature=config.temperature,
        top_k=config.top_k,
        top_p=config.top_p,
    )
    unfinished = (
        torch.ones(session.batch_size, dtype=torch.bool, device=session.tokens.device)
        if eos is not None
        else None
    )
    k = config.prompt_lookup_num_tokens or config.num_assistant_tokens
    done = 0
    while done < config.max_new_tokens:
        old, start = session.length, cache.length
        budget = config.max_new_tokens - done  # the round yields at most k + 1 tokens
        proposal = drafter.propose(session, min(k, budget - 1)) if budget > 1 else None
        if proposal is None:
            drafts, q = session.tokens[:, old:old], None  # (B, 0): a plain step
        else:
            drafts, q = proposal
        n = drafts.shape[1]
        session.tokens[:, old : old + n] = drafts
        end = old + n
        logits = model.all_token_logits(
            session.tokens[:, start:end],
            session.positions[:, start:end],
            session.mask[:, :end] if session.mask is not None else None,
            cache,
            session.state,
            n + 1,
        ).float()  # (B, n + 1, V): the target's scores after each accepted-so-far prefix
        B, V = logits.shape[0], logits.shape[2]
        if config.sampling:
            check_finite(logits, done)
            p = warp(logits.reshape(B * (n + 1), V), session.sequences, None, done).softmax(-1)
            p = p.view(B, n + 1, V)
            new = _rejection_sample(p, drafts, q, generator)  # (B, m + 1)
        else:
            best, target = logits.max(dim=-1)  # (B, n + 1)
            rows = (target[:, :n] == drafts).long().cumprod(dim=1).sum(dim=1)  # (B,) each row's accepted
            if unfinished is not None:  # a finished row's drafts are padded away: it holds no row back
                rows = torch.where(unfinished, rows, n)
            # the round's one host read: the shortest acceptance, and whether every score was finite
            taken, finite = torch.stack([rows.min(), (best < float("inf")).all().long()]).tolist()
            if not finite:
                check_finite(logits.new_full((1,), float("nan")), done)
            new = target[:, : taken + 1]  # the accepted drafts are the target's argmax too
        m = new.shape[1] - 1
        if unfinished is not None:  # a row that ends inside the round is padded from its eos on
            assert eos is not None
            ended = torch.isin(new, eos).long().cumsum(dim=1)  # (B, m + 1): eos seen up to and at i
            after = (ended - torch.isin(new, eos).long()) > 0  # strictly after the row's first eos
            new = torch.where(~unfinished[:, None] | after, run.pad, new)
            alive = unfinished[:, None] & (ended == 0)  # (B, m + 1): still going after column i
            # the first column after which no row goes on: the search ends there, as plain decoding's would
            stop = (~alive.any(dim=0)).long().cumsum(0)
            kept = int((stop == 0).sum()) + 1 if bool(stop[-1] > 0) else m + 1
            unfinished = alive[:, kept - 1]
        else:
            kept = m + 1
        session.tokens[:, old : old + kept] = new[:, :kept]
        session.length = old + kept
        cache.crop(old + kept - 1)  # the last token is fed next round
        for i in range(kept):
            yield new[:, i]
        done += kept
        if kept < m + 1 or (unfinished is not None and not bool(unfinished.any())):
            return
        drafter.accepted(session, old + m)
        k = drafter.schedule(k, n, m)


def _rejection_sample(
    p: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor | None, generator: torch.Generator | None
) -> torch.Tensor:
    """p (B, n + 1, V) the target's probabilities, drafts (B, n), q (B, n, V) the draft's or None (one-hot
    on the drafts) -> (B, m + 1): the first m drafts, accepted in every row, and each row's token m."""
    B, n = drafts.shape
    if n == 0:
        return torch.multinomial(p[:, 0], 1, generator=generator)  # (B, 1)
    p_d = p[:, :n].gather(2, drafts[..., None]).squeeze(2)  # (B, n)
    q_d = q.gather(2, drafts[..., None]).squeeze(2) if q is not None else torch.ones_like(p_d)
    u = torch.rand(B, n, generator=generator, device=p.device)
    ok = u * q_d < p_d  # accept with probability min(1, p / q)
    counts = ok.long().cumprod(dim=1).sum(dim=1)  # (B,)
    m = int(counts.min())
    if m == n:  # every draft accepted in every row: the bonus token from the target's last distribution
        last = torch.multinomial(p[:, n], 1, generator=generator).squeeze(1)
    else:
        one_hot = torch.zeros_like(p[:, m]).scatter_(1, drafts[:, m : m + 1], 1.0)  # (B, V)
        residual = (p[:, m] - (q[:, m] if q is not None else one_hot)).clamp(min=0)  # (B, V)
        empty = residual.sum(dim=1, keepdim=True) <= 0  # p == q there: never rejected, any fallback works
        residual = torch.where(empty, p[:, m], residual)
        resampled = torch.multinomial(residual, 1, generator=generator).squeeze(1)
        last = torch.where(counts > m, drafts[:, m], resampled)  # rows that accepted draft m keep it
    return torch.cat([drafts[:, :m], last[:, None]], dim=1)
