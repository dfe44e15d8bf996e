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
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Tense = Literal["present", "past", "future"]
TENSES: tuple[Tense, ...] = ("present", "past", "future")

# --- Hangul arithmetic -----------------------------------------------------------------------------
# A precomposed syllable is 0xAC00 + (initial * 21 + medial) * 28 + final, with final 0 = no batchim.
_HANGUL_FIRST, _HANGUL_LAST = 0xAC00, 0xD7A3
_FINAL_NONE, _FINAL_N, _FINAL_L, _FINAL_SS = 0, 4, 8, 20  # none, ㄴ, ㄹ, ㅆ
# Medial vowel indices of ㅏ ㅐ ㅓ ㅕ ㅗ ㅘ ㅜ ㅝ ㅡ ㅣ.
_V_A, _V_AE, _V_EO, _V_YEO, _V_O, _V_WA, _V_U, _V_WO, _V_EU, _V_I = 0, 1, 4, 6, 8, 9, 13, 14, 18, 20


def _split(syllable: str) -> tuple[int, int, int]:
    cp = ord(syllable)
    if not _HANGUL_FIRST <= cp <= _HANGUL_LAST:
        raise ValueError(f"{syllable!r} is not a precomposed Hangul syllable")
    index = cp - _HANGUL_FIRST
    return index // (21 * 28), (index // 28) % 21, index % 28


def _join(initial: int, medial: int, final: int) -> str:
    return chr(_HANGUL_FIRST + (initial * 21 + medial) * 28 + final)


def has_batchim(word: str) -> bool:
    """Whether the last syllable of a Hangul ``word`` ends in a final consonant (받침)."""
    return _split(word[-1])[2] != _FINAL_NONE


def attach(word: str, *, after_consonant: str, after_vowel: str) -> str:
    """Append the particle form that fits ``word``'s last syllable.

    ``attach("곰", after_consonant="이", after_vowel="가") == "곰이"``; after 고양이 it would be 가.
    """
    return word + (after_consonant if has_batchim(word) else after_vowel)


def _with_final(stem: str, final: int) -> str:
    initial, medial, _ = _split(stem[-1])
    return stem[:-1] + _join(initial, medial, final)


def conjugate(stem: str, tense: Tense) -> str:
    """Plain declarative form of a regular verb stem: ``conjugate("먹", "past") == "먹었다"``.

    Covers consonant stems, vowel stems (with the standard contractions), ㄹ-stems and 하다 verbs.
    Irregular stems (ㅂ, ㄷ, 르, ㅅ ...) are not handled; the vocabulary below contains none.
    """
    initial, medial, final = _split(stem[-1])
    if tense == "present":
        if final == _FINAL_NONE:
            return _with_final(stem, _FINAL_N) + "다"
        if final == _FINAL_L:  # ㄹ drops before ㄴ: 만들 + ㄴ다 -> 만든다
            return _with_final(stem, _FINAL_N) + "다"
        return stem + "는다"
    if tense == "future":
        if final == _FINAL_NONE:
            return _with_final(stem, _FINAL_L) + " 것이다"
        if final == _FINAL_L:  # the ㄹ of the ending merges with the stem's: 만들 것이다
            return stem + " 것이다"
        return stem + "을 것이다"
    if tense != "past":
        raise ValueError(f"unknown tense {tense!r}; expected one of {TENSES}")
    if stem.endswith("하"):
        return stem[:-1] + "했다"
    bright = medial in (_V_A, _V_O)  # vowel harmony: ㅏ/ㅗ take 았, everything else 었
    if final != _FINAL_NONE:
        return stem + ("았다" if bright else "었다")
    # Vowel stems fuse with the ending: 사+았 -> 샀, 보+았 -> 봤, 마시+었 -> 마셨, 쓰+었 -> 썼, 주+었 -> 줬.
    # (ㅡ -> ㅓ holds for one-syllable stems; 바쁘 -> 바빴 would follow the previous vowel, not needed here.)
    contracted = {
        _V_A: _V_A,
        _V_O: _V_WA,
        _V_I: _V_YEO,
        _V_EU: _V_EO,
        _V_EO: _V_EO,
        _V_U: _V_WO,
        _V_AE: _V_AE,
    }
    if medial not in contracted:
        raise ValueError(f"no past-tense rule for vowel stem {stem!r}")
    return stem[:-1] + _join(initial, contracted[medial], _FINAL_SS) + "다"


# --- Vocabulary -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Noun:
    en: str
    en_plural: str | None  # None: a mass noun, used bare (no article, plural or number)
    ko: str
    counter: str | None
    tags: frozenset[str]


def _nouns(rows: str, base: str) -> tuple[_Noun, ...]:
    # One noun per line: "english plural korean counter [extra tags]"; plural "-" marks a mass noun.
    out = []
    for row in rows.strip().splitlines():
        en, plural, ko, counter, *extra = row.split()
        mass = plural == "-"
        tags = frozenset({base, "mass" if mass else "count", *extra})
        out.append(_Noun(en, None if mass else plural, ko, None if mass else counter, tags))
    return tuple(out)


# Tags drive selectional restrictions: a verb or adjective lists the tags a noun must have one of.
NOUNS: tuple[_Noun, ...] = (
    *_nouns(
        """
        dog dogs 개 마리 drawable
        cat cats 고양이 마리 drawable
        bird birds 새 마리 drawable
        horse horses 말 마리 drawable
        cow cows 소 마리 drawable
        rabbit rabbits 토끼 마리 drawable
        bear bears 곰 마리 drawable
        tiger tigers 호랑이 마리 drawable
        duck ducks 오리 마리 drawable
        mouse mice 쥐 마리 drawable
        pig pigs 돼지 마리 drawable
        fox foxes 여우 마리 drawable
        """,
        "animal",
    ),
    *_nouns(
        """
        boy boys 소년 명
        girl girls 소녀 명
        man men 남자 명
        woman women 여자 명
        child children 아이 명
        baby babies 아기 명
        teacher teachers 선생님 명
        student students 학생 명
        doctor doctors 의사 명
        farmer farmers 농부 명
        friend friends 친구 명
        chef chefs 요리사 명
        """,
        "person",
    ),
    *_nouns(
        """
        apple apples 사과 개 fruit sweet washable throwable portable red
        banana bananas 바나나 개 fruit sweet portable yellow
        orange oranges 오렌지 개 fruit sweet washable portable
        tomato tomatoes 토마토 개 fruit washable red
        potato potatoes 감자 개 cookable washable
        egg eggs 달걀 개 cookable portable
        cake cakes 케이크 개 sweet makeable portable
        cookie cookies 쿠키 개 sweet makeable portable
        sandwich sandwiches 샌드위치 개 makeable portable
        fish - 생선 - cookable
        bread - 빵 - makeable portable
        rice - 밥 -
        meat - 고기 - cookable
        soup - 수프 - makeable warm
        """,
        "food",
    ),
    *_nouns(
        """
        milk - 우유 - warm
        water - 물 - warm
        coffee - 커피 - warm
        juice - 주스 - sweet
        tea - 차 - warm
        """,
        "drink",
    ),
    *_nouns(
        """
        ball balls 공 개 colored throwable kickable portable chaseable toyish
        book books 책 권 colored openable portable writable
        letter letters 편지 통 portable writable
        picture pictures 그림 장 portable drawable
        box boxes 상자 개 colored openable movable kickable makeable portable
        car cars 자동차 대 colored movable drawable vehicle
        bicycle bicycles 자전거 대 colored movable vehicle
        door doors 문 개 colored openable fixed
        window windows 창문 개 openable fixed
        cup cups 컵 개 colored washable portable
        bag bags 가방 개 colored openable portable toyish
        chair chairs 의자 개 colored movable kickable makeable
        table tables 탁자 개 movable makeable
        hat hats 모자 개 colored throwable makeable portable toyish
        key keys 열쇠 개 throwable portable
        toy toys 장난감 개 colored throwable makeable portable toyish
        flower flowers 꽃 송이 colored drawable portable red yellow
        """,
        "thing",
    ),
)

PRONOUNS: tuple[tuple[str, str, bool], ...] = (
    # english, korean, takes the English third-person singular verb form
    ("i", "나", False),
    ("we", "우리", False),
    ("he", "그", True),
    ("she", "그녀", True),
    ("they", "그들", False),
)


@dataclass(frozen=True)
class _Adjective:
    en: str
    ko: str  # attributive form, listed rather than derived (크다 -> 큰, 귀엽다 -> 귀여운 are irregular)
    tags: frozenset[str]


def _adj(en: str, ko: str, tags: str) -> _Adjective:
    return _Adjective(en, ko, frozenset(tags.split()))


ADJECTIVES: tuple[_Adjective, ...] = (
    _adj("big", "큰", "animal person thing fruit"),
    _adj("small", "작은", "animal person thing fruit"),
    _adj("young", "어린", "animal person"),
    _adj("happy", "행복한", "animal person"),
    _adj("hungry", "배고픈", "animal person"),
    _adj("lazy", "게으른", "animal person"),
    _adj("kind", "친절한", "person"),
    _adj("cute", "귀여운", "animal"),
    _adj("fast", "빠른", "animal vehicle"),
    _adj("old", "오래된", "thing"),  # things only: people and animals would need 늙은 / 나이 든
    _adj("new", "새", "thing"),
    _adj("heavy", "무거운", "movable openable"),
    _adj("red", "빨간", "colored red"),
    _adj("blue", "파란", "colored"),
    _adj("yellow", "노란", "colored yellow"),
    _adj("white", "하얀", "colored animal"),
    _adj("black", "검은", "colored animal"),
    _adj("fresh", "신선한", "fruit cookable"),
    _adj("hot", "뜨거운", "warm"),
    _adj("cold", "차가운", "drink"),
    _adj("sweet", "달콤한", "sweet"),
)


@dataclass(frozen=True)
class _Verb:
    en: str
    en_3sg: str
    en_past: str
    stem: str  # Korean stem: 먹다 -> 먹
    subject: frozenset[str]
    object: frozenset[str]


def _verb(en: str, en_3sg: str, en_past: str, stem: str, subject: str, obj: str) -> _Verb:
    return _Verb(en, en_3sg, en_past, stem, frozenset(subject.split()), frozenset(obj.split()))


# Every verb takes 을/를; none has an English past form equal to a present form ("read", "hit"),
# which would make "they read the book" ambiguous between 읽는다 and 읽었다.
VERBS: tuple[_Verb, ...] = (
    _verb("eat", "eats", "ate", "먹", "animal person", "food"),
    _verb("drink", "drinks", "drank", "마시", "animal person", "drink"),
    _verb("see", "sees", "saw", "보", "animal person", "animal person thing food"),
    _verb("like", "likes", "liked", "좋아하", "animal person", "animal person thing food drink"),
    _verb("want", "wants", "wanted", "원하", "animal person", "food drink portable vehicle"),
    _verb("find", "finds", "found", "찾", "animal person", "animal portable"),
    _verb("chase", "chases", "chased", "쫓", "animal person", "animal chaseable"),
    _verb("catch", "catches", "caught", "잡", "animal person", "animal chaseable"),
    _verb("bite", "bites", "bit", "물", "animal", "animal person toyish"),
    _verb("follow", "follows", "followed", "따라가", "animal person", "animal person"),
    _verb("buy", "buys", "bought", "사", "person", "food drink portable vehicle"),
    _verb("sell", "sells", "sold", "팔", "person", "food drink portable vehicle"),
    _verb("make", "makes", "made", "만들", "person", "makeable"),
    _verb("cook", "cooks", "cooked", "요리하", "person", "cookable"),
    _verb("wash", "washes", "washed", "씻", "person", "washable"),
    _verb("open", "opens", "opened", "열", "person", "openable"),
    _verb("close", "closes", "closed", "닫", "person", "openable"),
    _verb("draw", "draws", "drew", "그리", "person", "drawable"),
    _verb("write", "writes", "wrote", "쓰", "person", "writable"),
    _verb("throw", "throws", "threw", "던지", "person", "throwable"),
    _verb("push", "pushes", "pushed", "밀", "animal person", "movable"),
    _verb("pull", "pulls", "pulled", "당기", "animal person", "movable"),
    _verb("kick", "kicks", "kicked", "차", "person", "kickable"),
    _verb("bring", "brings", "brought", "가져오", "animal person", "portable"),
    _verb("meet", "meets", "met", "만나", "person", "person"),
    _verb("hug", "hugs", "hugged", "안", "person", "animal person"),
    _verb("teach", "teaches", "taught", "가르치", "person", "person"),
)

LOCATIONS: tuple[tuple[str, str], ...] = (
    ("in the park", "공원"),
    ("in the garden", "정원"),
    ("in the kitchen", "부엌"),
    ("in the forest", "숲"),
    ("in the library", "도서관"),
    ("at the market", "시장"),
    ("at the zoo", "동물원"),
    ("at school", "학교"),
    ("at home", "집"),
    ("by the river", "강가"),
)

NUMBERS: tuple[tuple[str, str], ...] = (
    # English cardinal, native Korean attributive numeral (하나 -> 한, 둘 -> 두, 셋 -> 세, 넷 -> 네)
    ("one", "한"),
    ("two", "두"),
    ("three", "세"),
    ("four", "네"),
    ("five", "다섯"),
)

MIN_WORDS, MAX_WORDS = 3, 9


# --- Sentences: sampling, rendering and parsing -------------------------------------------------------
Form = Literal["the", "a", "plural", "mass", "pronoun"] | int  # int: a number 1-5


@dataclass(frozen=True)
class _NounPhrase:
    form: Form
    noun: _Noun | None = None  # None for pronouns
    adjective: _Adjective | None = None
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
        head = self.noun.en if self.form in ("the", "a", "mass", 1) else self.noun.en_plural
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
    verb: _Verb
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


def write_tsv(pairs: Iterable[tuple[str, str]], path: str | Path) -> None:
    """Write ``source<TAB>target`` lines, UTF-8, ``\\n``-terminated."""
    lines = []
    for src, tgt in pairs:
        if any(c in text for text in (src, tgt) for c in "\t\n\r"):
            raise ValueError(f"pair contains a tab or newline and cannot be written as TSV: {(src, tgt)!r}")
        lines.append(f"{src}\t{tgt}\n")
    Path(path).write_text("".join(lines), encoding="utf-8")


def read_tsv(path: str | Path) -> list[tuple[str, str]]:
    """Read pairs written by :func:`write_tsv`."""
    pairs = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line:
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise ValueError(f"{path}:{number}: expected 'source<TAB>target', got {len(fields)} field(s)")
        pairs.append((fields[0], fields[1]))
    return pairs
