"""A shifted toy task for fine-tuning the demo model: negated sentences, which the demo corpus never holds.

    the cat does not eat fish                  고양이가 생선을 안 먹는다
    the dogs did not chase two cats            개들이 고양이 두 마리를 안 쫓았다
    she will not cook fish in the kitchen      그녀는 부엌에서 생선을 요리 안 할 것이다

Same grammar, same vocabulary (`zoo.demo.corpus`), one new construction on each side:

* **English** negates with do-support: ``does not`` / ``do not`` + the bare verb in the present (agreeing
  with the subject), ``did not`` + the bare verb in the past, ``will not`` in the future. So the past tense
  moves off the verb (``ate`` -> ``did not eat``), which the demo model has never had to read.
* **Korean** uses short-form negation, 안 right before the verb (안 먹는다, 안 먹었다, 안 먹을 것이다); a
  noun + 하다 verb takes it between the noun and 하다 (요리 안 한다), as Korean grammars teach (e.g. Sohn,
  *The Korean Language*, 1999, section 9.6). Everything else (particles, word order, counters) is unchanged.

Every Korean syllable here is already in the demo corpus (안 is the stem of 안다, "hug"), so the demo's
tokenizer covers the task with no unknown tokens, and the English side is lowercase letters as before.
`shifted_corpus` mixes in a share of the demo's own (affirmative) pairs, so a fine-tune sees when *not* to
negate; its held-out split is negated sentences only.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from zoo.demo.corpus import MAX_WORDS, MIN_WORDS, ToyCorpus, _Clause, _render, _sample_clause, toy_corpus
from zoo.demo.hangul import conjugate

# Verbs made of a noun and 하다: negation goes between them (요리 안 하다, not 안 요리하다).
NOUN_HA_STEMS = frozenset({"요리하"})
NEGATION = "안"


def negate(clause: _Clause) -> tuple[str, str]:
    """The negated ``(english, korean)`` rendering of ``clause``."""
    en, ko = _render(clause)  # the affirmative pair; the verb is rewritten on each side
    subject, verb, tense = clause.subject, clause.verb, clause.tense
    affirmative_en = {
        "present": verb.en_3sg if subject.third_singular else verb.en,
        "past": verb.en_past,
        "future": f"will {verb.en}",
    }[tense]
    auxiliary = {"past": "did", "future": "will"}.get(tense, "does" if subject.third_singular else "do")
    head = len(subject.english())  # the verb phrase starts right after the subject
    assert en[head:].startswith(f" {affirmative_en} ")
    en = f"{en[:head]} {auxiliary} not {verb.en} {en[head + len(affirmative_en) + 2 :]}"
    verb_ko = conjugate(verb.stem, tense)  # always the last word(s) of the Korean sentence
    assert ko.endswith(verb_ko)
    if verb.stem in NOUN_HA_STEMS:
        negated = f"{verb.stem[:-1]} {NEGATION} {conjugate('하', tense)}"
    else:
        negated = f"{NEGATION} {verb_ko}"
    return en, ko[: -len(verb_ko)] + negated


def _negated_pairs(seed: int) -> Iterator[tuple[str, str]]:
    """Endless stream of distinct-source negated pairs; a fixed prefix for a fixed seed."""
    rng = random.Random(seed)
    seen: set[str] = set()
    while True:
        en, ko = negate(_sample_clause(rng))
        # Two more words than the affirmative sentence at most ("does not eat" for "eats").
        if not MIN_WORDS <= len(en.split()) <= MAX_WORDS + 2 or en in seen:
            continue
        seen.add(en)
        yield en, ko


def negated_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` distinct negated ``(english, korean)`` pairs, identical for identical ``(n, seed)``."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    stream = _negated_pairs(seed)
    return [next(stream) for _ in range(n)]


def shifted_corpus(
    seed: int = 0, train_size: int = 2000, valid_size: int = 200, affirmative_share: float = 0.25
) -> ToyCorpus:
    """The fine-tuning task: ``train_size`` pairs, ``affirmative_share`` of them the demo corpus's own training
    pairs (never its held-out ones) and the rest negated, shuffled; ``valid_size`` negated pairs held out.

    No English sentence is in both splits. The demo's held-out split (`zoo.demo.corpus.toy_corpus`, same
    ``seed``) stays the measure of what the demo task keeps.
    """
    if not 0.0 <= affirmative_share < 1.0:
        raise ValueError(f"affirmative_share must be in [0, 1), got {affirmative_share}")
    affirmative = round(train_size * affirmative_share)
    negated = negated_pairs(valid_size + train_size - affirmative, seed=seed)
    valid, train = negated[:valid_size], negated[valid_size:]
    train += toy_corpus(seed=seed, train_size=affirmative, valid_size=300).train
    random.Random(seed).shuffle(train)
    return ToyCorpus(train=train, valid=valid)
