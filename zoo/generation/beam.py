"""Beam search with Hugging Face's semantics (``transformers`` 4.50+ vectorised beam search).

Shapes: B sentences, N beams, V vocab, L = prompt length + max_new_tokens, K = candidates kept per step.

Each step scores every (beam, token) continuation by its running sum of log-probabilities and keeps the
top K = max(2, 1 + #eos) * N, so N beams can continue even if N candidates end the sentence. Candidates
among the top N that end with eos (or reach max length) become finished hypotheses, scored

    sum_logprobs / generated_length ** length_penalty        (generated_length counts the eos)

and the N best finished per sentence are kept. A sentence is done when it has N finished hypotheses and
either ``early_stopping`` is True or its best running beam can no longer beat the worst of them (with
``early_stopping=False`` judged at the current length, with ``"never"`` at the longest possible one).
The ``num_return_sequences`` best finished hypotheses of each sentence are returned, best first, with their
scores, padded with ``pad`` to the longest one returned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from zoo.generation.config import GenerationConfig
from zoo.generation.sampling import LogitsProcessors, check_finite
from zoo.generation.session import Session

_NEG = -1.0e9  # "impossible", as in Hugging Face (finite, so sums of it stay ordered)


def beam_search(
    session: Session,
    processors: LogitsProcessors,
    config: GenerationConfig,
    *,
    eos: torch.Tensor | None,
    pad: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Run beam search on a session expanded to B * N rows; return the n best sequences per sentence
    (B * n, ≤ L), n = ``config.num_return_sequences`` (`scored_beam_search` also returns their scores)."""
    return scored_beam_search(session, processors, config, eos=eos, pad=pad, generator=generator)[0]


def scored_beam_search(
    session: Session,
    processors: LogitsProcessors,
    config: GenerationConfig,
    *,
    eos: torch.Tensor | None,
    pad: int,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Beam search on a session expanded to B * N rows -> the n best sequences of each sentence (B * n, ≤ L),
    grouped by sentence and best first, and their scores (B * n,): sum(log p) / length ** length_penalty
    (transformers' ``sequences_scores``).

    ``eos`` (E,) and ``pad`` are the resolved ids (`zoo.generation.generate.prepare`), not the config's.
    """
    N = config.num_beams
    search = BeamSearch(
        session.batch_size // N,
        N,
        prefix=session.prompt_length,
        max_new_tokens=config.max_new_tokens,
        eos=eos,
        pad=pad,
        length_penalty=config.length_penalty,
        early_stopping=config.early_stopping,
        device=session.tokens.device,
    )
    for step in range(config.max_new_tokens):
        log_probs = _log_probs(session, processors, step)  # (BN, V)
        rows, tokens, over = search.step(
            log_probs, session.sequences, sampling=config.sampling, generator=generator
        )
        session.reorder(rows)
        processors.reorder(rows)
        session.append(tokens)
        processors.observe(tokens)
        if over:
            break
    sequences, scores, _ = search.best(config.num_return_sequences)
    return sequences, scores


class BeamSearch:
    """The bookkeeping of beam search for B sentences of N beams each (the module docstring's rules): each
    `step` takes the running beams' next-token log-probabilities and says which beam each row continues,
    with which token; the caller moves its rows (keys/values, tokens) accordingly. `generate` runs it on a
    `Session`, the server on a beam request's slots (`zoo.serving.beams`).

    ``prefix``: the tokens each row's sequences hold before the first step (a decoder's prompt, an
    encoder-decoder's start token; 0 where only the new tokens are passed); the search ends after at most
    ``max_new_tokens`` steps.
    """

    def __init__(
        self,
        B: int,
        N: int,
        *,
        prefix: int,
        max_new_tokens: int,
        eos: torch.Tensor | None,
        pad: int,
        length_penalty: float,
        early_stopping: bool | Literal["never"],
        device: torch.device,
    ) -> None:
        self.N, self.prefix, self.max_new_tokens = N, prefix, max_new_tokens
        self.eos, self.lp, self.early = eos, length_penalty, early_stopping
        self.K = max(2, 1 + (eos.numel() if eos is not None else 0)) * N
        self.in_top_n = torch.arange(self.K, device=device) < N  # (K,): only the top N candidates may finish
        self.running_scores = torch.full((B, N), _NEG, device=device)  # (B, N)
        # all beams start equal: only the first may expand, or they would duplicate
        self.running_scores[:, 0] = 0.0
        self.done = _Finished.empty(B, N, prefix + max_new_tokens, pad=pad, device=device)
        self.improvable = torch.ones(B, 1, dtype=torch.bool, device=device)
        self.sentence_rows = torch.arange(B, device=device)[:, None] * N  # (B, 1): first row of each sentence
        self.steps = 0

    def step(
        self,
        log_probs: torch.Tensor,
        sequences: torch.Tensor,
        *,
        sampling: bool = False,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """log_probs (BN, V) float32 and the running beams' sequences (BN, prefix + steps so far) -> the row
        each row continues (BN,), the token it appends (BN,), and whether the search is over."""
        B, N = self.sentence_rows.shape[0], self.N
        V, cur_len = log_probs.shape[-1], sequences.shape[1]
        generated = self.steps + 1  # the candidates' generated length, their new token included
        lp, early, eos = self.lp, self.early, self.eos
        totals = (log_probs.view(B, N, V) + self.running_scores[:, :, None]).view(B, N * V)
        cand_scores, picked = _candidates(totals, self.K, sampling=sampling, generator=generator)  # (B, K)
        cand_beams, cand_tokens = picked // V, picked % V  # (B, K)
        last = generated >= self.max_new_tokens
        if eos is not None:
            hits = torch.isin(cand_tokens, eos) | last
        else:
            hits = torch.full_like(cand_tokens, last, dtype=torch.bool)

        # Finished hypotheses: merge the candidates that just ended into the N best so far.
        cand_seqs = sequences.view(B, N, cur_len).gather(1, cand_beams[:, :, None].expand(-1, -1, cur_len))
        # Each reason to refuse adds _NEG, exactly as in Hugging Face (so ties resolve the same way).
        scores = cand_scores / float(generated) ** lp
        done = self.done
        if early is True:  # a sentence with N finished hypotheses is done
            scores = scores + done.is_finished.all(dim=1, keepdim=True).float() * _NEG
        ended = hits & self.in_top_n
        scores = scores + (~self.improvable).float() * _NEG + (~ended).float() * _NEG
        done.merge(cand_seqs, cand_tokens, scores, ended, generated=generated)

        # Running beams: the N best candidates that did not end.
        open_scores = cand_scores + hits.float() * _NEG  # (B, K): an ended candidate cannot run on
        next_index = open_scores.topk(N, dim=1).indices  # (B, N)
        rows = (self.sentence_rows + cand_beams.gather(1, next_index)).view(B * N)
        tokens = cand_tokens.gather(1, next_index).view(B * N)
        self.running_scores = open_scores.gather(1, next_index)  # (B, N)

        # Can a running beam still beat the worst finished hypothesis?
        length = self.max_new_tokens if (early == "never" and lp > 0) else generated
        best_possible = self.running_scores[:, :1] / float(length) ** lp  # (B, 1)
        worst = torch.where(done.is_finished, done.scores.min(dim=1, keepdim=True).values, _NEG)
        self.improvable &= (best_possible > worst).any(dim=1, keepdim=True)
        self.steps = generated
        over = last or not bool(self.improvable.any()) or (early is True and bool(done.is_finished.all()))
        return rows, tokens, over

    def best(self, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The n best finished hypotheses of each sentence, best first: their sequences (B * n, prefix + the
        longest one's generated length), padded; their scores (B * n,); their generated lengths (B * n,),
        an end token included."""
        # Finished hypotheses are kept sorted, best first (``topk``): the n best are the first n.
        done = self.done
        B = done.sequences.shape[0]
        out_len = self.prefix + int(done.lengths[:, :n].max())
        sequences = done.sequences[:, :n, :out_len].reshape(B * n, out_len).contiguous()  # (B * n, out_len)
        return sequences, done.scores[:, :n].reshape(B * n), done.lengths[:, :n].reshape(B * n)


def _log_probs(session: Session, processors: LogitsProcessors, step: int) -> torch.Tensor:
    """The next token's log-probabilities (BN, V), float32, through the logits processors."""
    logits = session.logits().float()  # (BN, V)
    check_finite(logits, step)
    log_probs = logits.log_softmax(dim=-1)
    if processors.active:
        log_probs = processors(log_probs, session.sequences, session.valid, step)
    return log_probs


def _candidates(
    totals: torch.Tensor, K: int, *, sampling: bool, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The K candidates of each sentence from its (B, N * V) running totals: (scores, flat indices), (B, K)
    each; the top K, or K drawn from the totals' softmax when sampling."""
    if sampling:
        picked = torch.multinomial(totals.softmax(dim=-1), K, generator=generator)  # (B, K)
        return totals.gather(1, picked), picked
    return totals.topk(K, dim=-1)


@dataclass
class _Finished:
    """The N best finished hypotheses of each sentence so far, kept sorted best first."""

    sequences: torch.Tensor  # (B, N, L) prompt + generated tokens, padded
    scores: torch.Tensor  # (B, N) sum(log p) / generated_length ** length_penalty; _NEG while empty
    lengths: torch.Tensor  # (B, N) generated tokens, eos included
    is_finished: torch.Tensor  # (B, N) bool: a real hypothesis, not an empty place
    pad: int  # the id after a hypothesis's end

    @classmethod
    def empty(cls, B: int, N: int, L: int, *, pad: int, device: torch.device) -> _Finished:
        return cls(
            sequences=torch.full((B, N, L), pad, dtype=torch.long, device=device),
            scores=torch.full((B, N), _NEG, device=device),
            lengths=torch.zeros(B, N, dtype=torch.long, device=device),
            is_finished=torch.zeros(B, N, dtype=torch.bool, device=device),
            pad=pad,
        )

    def merge(
        self,
        cand_seqs: torch.Tensor,
        cand_tokens: torch.Tensor,
        scores: torch.Tensor,
        ended: torch.Tensor,
        *,
        generated: int,
    ) -> None:
        """Keep the N best of the finished and the K candidates: ``cand_seqs`` (B, K, cur_len) their
        sequences so far, ``cand_tokens`` (B, K) the token each adds, ``scores`` (B, K) their scores (_NEG
        added for each reason one may not finish), ``ended`` (B, K) which did; ``generated``: their length."""
        B, N, L = self.sequences.shape
        cur_len = cand_seqs.shape[2]
        merged_scores = torch.cat([self.scores, scores], dim=1)  # (B, N + K)
        best = merged_scores.topk(N, dim=1).indices  # (B, N)
        from_candidates = best >= N
        cand_index = (best - N).clamp(min=0)
        new_seqs = torch.full((B, N, L), self.pad, dtype=torch.long, device=cand_seqs.device)
        new_seqs[:, :, :cur_len] = cand_seqs.gather(1, cand_index[:, :, None].expand(-1, -1, cur_len))
        new_seqs[:, :, cur_len] = cand_tokens.gather(1, cand_index)
        keep = self.sequences.gather(1, best.clamp(max=N - 1)[:, :, None].expand(-1, -1, L))
        self.sequences = torch.where(from_candidates[:, :, None], new_seqs, keep)
        self.lengths = torch.where(from_candidates, generated, self.lengths.gather(1, best.clamp(max=N - 1)))
        self.is_finished = torch.cat([self.is_finished, ended], dim=1).gather(1, best)
        self.scores = merged_scores.gather(1, best)
