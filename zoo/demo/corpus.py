"""A generated English -> Korean parallel corpus for the translation demo (nothing is downloaded).

Every pair comes from a small synchronous grammar, so each English sentence has exactly one Korean
translation and a tiny Transformer can learn the mapping to a high BLEU. The rules it encodes:

* **Word order.** English is SVO, Korean is SOV; an optional location moves to just after the subject:
  ``the dog chased two cats in the park`` -> ``개가 공원에서 고양이 두 마리를 쫓았다``.
* **Particles** are chosen by whether the word they attach to ends in a final consonant (batchim),
  read off the Hangul syllable code point (``(cp - 0xAC00) % 28 != 0``): subject 이/가 for noun
  phrases and topic 은/는 for pronouns (``고양이가``, ``곰이``, ``나는``, ``그들은``); object 을/를
  (``사과를``, ``책을``); location 에서 in every case.
* **Tense**, conjugated by rule from the verb stem in the plain declarative style (해라체):
  present ``-는다`` after a consonant, ``-ㄴ다`` after a vowel, with ㄹ-stems dropping ㄹ
  (먹는다, 본다, 만든다); past ``-았다`` after ㅏ/ㅗ, ``-었다`` otherwise, contracted after a vowel
  (먹었다, 봤다, 마셨다, 썼다) and ``하다 -> 했다``; future ``-(으)ㄹ 것이다`` (먹을 것이다, 볼 것이다,
  만들 것이다). English agrees: ``eats / eat``, ``ate``, ``will eat``.
* **Adjectives** precede the noun in both languages in their attributive form: ``the big dog`` -> ``큰 개``.
* **Plurals** take 들: ``the dogs`` -> ``개들``.
* **Numbers** 1-5 use native Korean attributive numerals and a counter after the noun:
  ``three cats`` -> ``고양이 세 마리``, ``two books`` -> ``책 두 권``, ``five students`` -> ``학생 다섯 명``.
* **Articles** disappear: ``a``/``an``/``the`` all map to nothing; mass nouns (``fish``, ``milk``) have none.

Selectional restrictions (only people write letters, only food is eaten...) keep sentences sensible. The
English side is lowercase, space-separated and punctuation-free; so is the Korean side. Where Korean
offers two correct forms (보았다 / 봤다), the grammar always picks one, so the mapping is a function.

This module samples, renders and parses sentences; the morphology (batchim, particles, conjugation) is
`zoo.demo.hangul`, the vocabulary `zoo.demo.lexicon`, and the TSV files `zoo.demo.tsv`.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from zoo.demo.hangul import TENSES, Tense, attach, conjugate
from zoo.demo.lexicon import ADJECTIVES, LOCATIONS, NOUNS, NUMBERS, PRONOUNS, VERBS, Adjective, Noun, Verb

MIN_WORDS, MAX_WORDS = 3, 9


Form = Literal["the", "a", "plural", "mass", "pronoun"] | int  # int: a number 1-5


@dataclass(frozen=True)
class _NounPhrase:
    form: Form
    noun: Noun | None = None  # None for pronouns
    adjective: Adjective | None = None
    pronoun: tuple[str, str, bool] | None = None

    @property
    def third_singular(self) -> bool:
        """Whether an English present-tense verb takes -s after this subject."""
        if self.pronoun is not None:
            return self.pronoun[2]
        return self.form in ("the", "a", "mass", 1)

    def english(self) -> str:
        if self.pronoun is not None:
            return self.pronoun[0]
        assert self.noun is not None
        if self.form in ("the", "a", "mass", 1):
            head = self.noun.en
        else:
            # Plural and number forms are sampled (and parsed) for count nouns only, which have a plural.
            assert self.noun.en_plural is not None
            head = self.noun.en_plural
        head = f"{self.adjective.en} {head}" if self.adjective else head
        if self.form == "a":
            return ("an " if head[0] in "aeiou" else "a ") + head
        if self.form in ("the", "plural"):
            return f"the {head}"
        if isinstance(self.form, int):
            return f"{NUMBERS[self.form - 1][0]} {head}"
        return head

    def korean(self) -> str:
        """The phrase without its particle."""
        if self.pronoun is not None:
            return self.pronoun[1]
        assert self.noun is not None
        head = f"{self.adjective.ko} {self.noun.ko}" if self.adjective else self.noun.ko
        if self.form == "plural":
            return head + "들"
        if isinstance(
            self.form, int
        ):  # "three cats" -> "고양이 세 마리": numeral and counter follow the noun
            return f"{head} {NUMBERS[self.form - 1][1]} {self.noun.counter}"
        return head


@dataclass(frozen=True)
class _Clause:
    subject: _NounPhrase
    verb: Verb
    tense: Tense
    object: _NounPhrase
    location: tuple[str, str] | None


def _render(clause: _Clause) -> tuple[str, str]:
    subject, verb, tense = clause.subject, clause.verb, clause.tense
    if tense == "present":
        verb_en = verb.en_3sg if subject.third_singular else verb.en
    else:
        verb_en = verb.en_past if tense == "past" else f"will {verb.en}"
    en = [subject.english(), verb_en, clause.object.english()]
    if subject.pronoun is not None:  # pronouns take the topic marker, noun phrases the subject marker
        subject_ko = attach(subject.korean(), after_consonant="은", after_vowel="는")
    else:
        subject_ko = attach(subject.korean(), after_consonant="이", after_vowel="가")
    ko = [subject_ko]
    if clause.location is not None:  # English ends in the location; Korean puts it after the subject
        en.append(clause.location[0])
        ko.append(clause.location[1] + "에서")
    ko += [
        attach(clause.object.korean(), after_consonant="을", after_vowel="를"),
        conjugate(verb.stem, tense),
    ]
    return " ".join(en), " ".join(ko)


def _fits(tags: frozenset[str], allowed: frozenset[str]) -> bool:
    return not tags.isdisjoint(allowed)


def _sample_noun_phrase(rng: random.Random, allowed: frozenset[str]) -> _NounPhrase:
    noun = rng.choice([n for n in NOUNS if _fits(n.tags, allowed)])
    adjectives = [a for a in ADJECTIVES if _fits(noun.tags, a.tags)]
    adjective = rng.choice(adjectives) if adjectives and rng.random() < 0.35 else None
    if noun.en_plural is None:
        return _NounPhrase("mass", noun, adjective)
    r = rng.random()
    form: Form = "the" if r < 0.45 else "a" if r < 0.6 else "plural" if r < 0.8 else rng.randint(1, 5)
    return _NounPhrase(form, noun, adjective)


def _sample_clause(rng: random.Random) -> _Clause:
    verb = rng.choice(VERBS)
    tense = rng.choice(TENSES)
    if "person" in verb.subject and rng.random() < 0.2:
        subject = _NounPhrase("pronoun", pronoun=rng.choice(PRONOUNS))
    else:
        subject = _sample_noun_phrase(rng, verb.subject)
    obj = _sample_noun_phrase(rng, verb.object)
    location = rng.choice(LOCATIONS) if rng.random() < 0.3 else None
    return _Clause(subject, verb, tense, obj, location)


def _parse_noun_phrase(words: list[str], i: int, *, subject: bool) -> tuple[_NounPhrase, int]:
    # Only reads words; translate() re-renders the parse and compares, which rejects "a apple",
    # "two dog" and other disagreements without a rule of their own here.
    if subject:
        for pronoun in PRONOUNS:
            if words[i] == pronoun[0]:
                return _NounPhrase("pronoun", pronoun=pronoun), i + 1
    numbers = [en for en, _ in NUMBERS]
    form: Form = "mass"
    if words[i] in ("the", "a", "an"):
        form = "a" if words[i] == "an" else words[i]  # type: ignore[assignment]
        i += 1
    elif words[i] in numbers:
        form = numbers.index(words[i]) + 1
        i += 1
    adjective = next((a for a in ADJECTIVES if a.en == words[i]), None)
    i += adjective is not None
    noun = next((n for n in NOUNS if words[i] in (n.en, n.en_plural)), None)
    if noun is None:
        raise ValueError(f"unknown noun {words[i]!r}")
    if (form == "mass") != (noun.en_plural is None):
        raise ValueError(f"{noun.en!r} needs {'no article' if form != 'mass' else 'an article or number'}")
    if form == "the" and words[i] == noun.en_plural:
        form = "plural"
    return _NounPhrase(form, noun, adjective), i + 1


def translate(source: str) -> str:
    """The Korean translation of an English sentence of the grammar (``ValueError`` if outside it).

    ``translate("the cat eats fish") == "고양이가 생선을 먹는다"``. Selectional restrictions are not
    checked: ``"the table eats the dog"`` is translated, though never generated.
    """
    words = source.split()
    try:
        subject, i = _parse_noun_phrase(words, 0, subject=True)
        tense: Tense = "future" if words[i] == "will" else "present"
        i += tense == "future"
        verb = next((v for v in VERBS if words[i] in (v.en, v.en_3sg, v.en_past)), None)
        if verb is None:
            raise ValueError(f"unknown verb {words[i]!r}")
        if tense == "present" and words[i] == verb.en_past:
            tense = "past"
        obj, j = _parse_noun_phrase(words, i + 1, subject=False)
        rest = " ".join(words[j:])
        location = next((loc for loc in LOCATIONS if loc[0] == rest), None)
        if rest and location is None:
            raise ValueError(f"unknown location {rest!r}")
        en, ko = _render(_Clause(subject, verb, tense, obj, location))
    except IndexError:
        raise ValueError(f"cannot translate {source!r}: sentence ends early") from None
    except ValueError as err:
        raise ValueError(f"cannot translate {source!r}: {err}") from None
    if en != " ".join(words):  # e.g. verb agreement ("the dog eat") or "a" before a vowel
        raise ValueError(f"cannot translate {source!r}: not grammatical here (expected {en!r})")
    return ko


def _unique_pairs(seed: int) -> Iterator[tuple[str, str]]:
    """Endless stream of distinct-source pairs; a fixed prefix for a fixed seed."""
    rng = random.Random(seed)
    seen: dict[str, str] = {}
    while True:
        en, ko = _render(_sample_clause(rng))
        if not MIN_WORDS <= len(en.split()) <= MAX_WORDS:
            continue
        if en in seen:
            if seen[en] != ko:  # the grammar must be a function from English to Korean
                raise AssertionError(f"ambiguous source {en!r}: {seen[en]!r} vs {ko!r}")
            continue
        seen[en] = ko
        yield en, ko


def _take(stream: Iterator[tuple[str, str]], n: int) -> list[tuple[str, str]]:
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return [next(stream) for _ in range(n)]


def generate_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` distinct ``(english, korean)`` pairs, identical for identical ``(n, seed)``.

    A larger ``n`` extends the list for a smaller one: ``generate_pairs(10)[:5] == generate_pairs(5)``.
    """
    return _take(_unique_pairs(seed), n)


@dataclass(frozen=True)
class ToyCorpus:
    """A train / held-out split; no English sentence appears in both."""

    train: list[tuple[str, str]]
    valid: list[tuple[str, str]]


def toy_corpus(seed: int = 0, train_size: int = 6000, valid_size: int = 300) -> ToyCorpus:
    """The demo corpus. The held-out split depends only on ``seed`` and ``valid_size``.

    Validation pairs are drawn first from the stream, so growing ``train_size`` never moves a sentence
    between the splits.
    """
    stream = _unique_pairs(seed)
    valid = _take(stream, valid_size)
    train = _take(stream, train_size)
    return ToyCorpus(train=train, valid=valid)
