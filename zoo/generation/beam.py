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
    BN, prompt_len = session.batch_size, session.prompt_length
    B, L = BN // N, session.tokens.shape[1]
    device = session.tokens.device
    K = max(2, 1 + (eos.numel() if eos is not None else 0)) * N
    in_top_n = torch.arange(K, device=device) < N  # (K,): only the top N candidates may finish
    lp, early = config.length_penalty, config.early_stopping

    running_scores = torch.full((B, N), _NEG, device=device)  # (B, N)
    running_scores[:, 0] = 0.0  # all beams start equal: only the first may expand, or they would duplicate
    finished = torch.full((B, N, L), pad, dtype=torch.long, device=device)
    finished_scores = torch.full((B, N), _NEG, device=device)
    finished_lengths = torch.zeros(B, N, dtype=torch.long, device=device)  # generated tokens, eos included
    is_finished = torch.zeros(B, N, dtype=torch.bool, device=device)
    improvable = torch.ones(B, 1, dtype=torch.bool, device=device)
    sentence_rows = torch.arange(B, device=device)[:, None] * N  # (B, 1): first row of each sentence

    for step in range(config.max_new_tokens):
        cur_len = prompt_len + step
        logits = session.logits().float()  # (BN, V)
        check_finite(logits, step)
        log_probs = logits.log_softmax(dim=-1)
        if processors.active:
            log_probs = processors(log_probs, session.sequences, session.valid, step)
        V = log_probs.shape[-1]
        totals = (log_probs.view(B, N, V) + running_scores[:, :, None]).view(B, N * V)
        if config.sampling:
            picked = torch.multinomial(totals.softmax(dim=-1), K, generator=generator)  # (B, K)
            cand_scores = totals.gather(1, picked)
        else:
            cand_scores, picked = totals.topk(K, dim=-1)  # (B, K)
        cand_beams, cand_tokens = picked // V, picked % V  # (B, K)

        last = cur_len + 1 >= L
        if eos is not None:
            hits = torch.isin(cand_tokens, eos) | last
        else:
            hits = torch.full_like(cand_tokens, last, dtype=torch.bool)

        # Finished hypotheses: merge the candidates that just ended into the N best so far.
        cand_seqs = session.sequences.view(B, N, -1).gather(1, cand_beams[:, :, None].expand(-1, -1, cur_len))
        ended = hits & in_top_n
        # Each reason to refuse adds _NEG, exactly as in Hugging Face (so ties resolve the same way).
        scores = cand_scores / float(cur_len + 1 - prompt_len) ** lp
        if early is True:
            scores = scores + is_finished.all(dim=1, keepdim=True).float() * _NEG  # this sentence is done
        scores = scores + (~improvable).float() * _NEG + (~ended).float() * _NEG
        merged_scores = torch.cat([finished_scores, scores], dim=1)  # (B, N + K)
        best = merged_scores.topk(N, dim=1).indices  # (B, N)
        from_candidates = best >= N
        cand_index = (best - N).clamp(min=0)
        new_seqs = torch.full((B, N, L), pad, dtype=torch.long, device=device)
        new_seqs[:, :, :cur_len] = cand_seqs.gather(1, cand_index[:, :, None].expand(-1, -1, cur_len))
        new_seqs[:, :, cur_len] = cand_tokens.gather(1, cand_index)
        keep = finished.gather(1, best.clamp(max=N - 1)[:, :, None].expand(-1, -1, L))
        finished = torch.where(from_candidates[:, :, None], new_seqs, keep)
        finished_lengths = torch.where(
            from_candidates, cur_len + 1 - prompt_len, finished_lengths.gather(1, best.clamp(max=N - 1))
        )
        is_finished = torch.cat([is_finished, ended], dim=1).gather(1, best)
        finished_scores = merged_scores.gather(1, best)

        # Running beams: the N best candidates that did not end.
        next_index = (cand_scores + hits.float() * _NEG).topk(N, dim=1).indices  # (B, N)
        running_scores = (cand_scores + hits.float() * _NEG).gather(1, next_index)
        rows = (sentence_rows + cand_beams.gather(1, next_index)).view(BN)
        session.reorder(rows)
        processors.reorder(rows)
        tokens = cand_tokens.gather(1, next_index).view(BN)
        session.append(tokens)
        processors.observe(tokens)

        # Can a running beam still beat the worst finished hypothesis?
        length = (L - prompt_len) if (early == "never" and lp > 0) else (cur_len + 1 - prompt_len)
        best_possible = running_scores[:, :1] / float(length) ** lp  # (B, 1)
        worst = torch.where(is_finished, finished_scores.min(dim=1, keepdim=True).values, _NEG)
        improvable &= (best_possible > worst).any(dim=1, keepdim=True)
        if last or not bool(improvable.any()) or (early is True and bool(is_finished.all())):
            break

    # Finished hypotheses are kept sorted, best first (``topk``): the n best are the first n.
    n = config.num_return_sequences
    out_len = prompt_len + int(finished_lengths[:, :n].max())
    sequences = finished[:, :n, :out_len].reshape(B * n, out_len).contiguous()  # (B * n, out_len)
    return sequences, finished_scores[:, :n].reshape(B * n)
