"""The toy English -> Korean corpus: determinism, the split, and the grammar rules it encodes."""

from __future__ import annotations

import pytest

from zoo.demo import corpus as tc
from zoo.demo.corpus import generate_pairs, toy_corpus, translate
from zoo.demo.hangul import attach, conjugate, has_batchim
from zoo.demo.tsv import read_tsv, write_tsv


def test_same_seed_gives_same_pairs_and_other_seed_differs() -> None:
    assert generate_pairs(200, seed=7) == generate_pairs(200, seed=7)
    assert generate_pairs(200, seed=7) != generate_pairs(200, seed=8)


def test_generate_pairs_is_a_prefix_stream_of_unique_sources() -> None:
    pairs = generate_pairs(500, seed=1)
    assert len(pairs) == 500
    assert len({src for src, _ in pairs}) == 500
    assert generate_pairs(100, seed=1) == pairs[:100]


def test_split_sizes_and_no_source_in_both_splits() -> None:
    corpus = toy_corpus(seed=0, train_size=1000, valid_size=100)
    assert len(corpus.train) == 1000
    assert len(corpus.valid) == 100
    assert not {s for s, _ in corpus.train} & {s for s, _ in corpus.valid}


def test_valid_split_does_not_depend_on_train_size() -> None:
    assert (
        toy_corpus(seed=3, train_size=50, valid_size=40).valid
        == toy_corpus(seed=3, train_size=400, valid_size=40).valid
    )


def test_sentences_are_short_lowercase_and_punctuation_free() -> None:
    for src, tgt in generate_pairs(2000, seed=2):
        assert tc.MIN_WORDS <= len(src.split()) <= tc.MAX_WORDS
        assert src == src.lower() and src.replace(" ", "").isalpha()
        assert tgt.replace(" ", "").isalpha()
        assert "  " not in src + tgt and src == src.strip() and tgt == tgt.strip()


def test_batchim_is_read_from_the_code_point() -> None:
    assert has_batchim("곰") and has_batchim("선생님") and has_batchim("책")
    assert not has_batchim("고양이") and not has_batchim("사과") and not has_batchim("마리")
    with pytest.raises(ValueError, match="not a precomposed Hangul syllable"):
        has_batchim("cat")


def test_particles_follow_the_final_consonant() -> None:
    assert attach("곰", after_consonant="이", after_vowel="가") == "곰이"
    assert attach("고양이", after_consonant="이", after_vowel="가") == "고양이가"
    assert attach("책", after_consonant="을", after_vowel="를") == "책을"
    assert attach("사과", after_consonant="을", after_vowel="를") == "사과를"
    assert attach("그들", after_consonant="은", after_vowel="는") == "그들은"


@pytest.mark.parametrize(
    ("stem", "present", "past", "future"),
    [
        ("먹", "먹는다", "먹었다", "먹을 것이다"),  # consonant stem, dark vowel
        ("잡", "잡는다", "잡았다", "잡을 것이다"),  # consonant stem, bright vowel
        ("보", "본다", "봤다", "볼 것이다"),  # ㅗ + 았 -> ㅘ
        ("사", "산다", "샀다", "살 것이다"),  # ㅏ + 았 -> ㅏ
        ("마시", "마신다", "마셨다", "마실 것이다"),  # ㅣ + 었 -> ㅕ
        ("쓰", "쓴다", "썼다", "쓸 것이다"),  # ㅡ drops
        ("만들", "만든다", "만들었다", "만들 것이다"),  # ㄹ-stem
        ("열", "연다", "열었다", "열 것이다"),  # ㄹ-stem
        ("좋아하", "좋아한다", "좋아했다", "좋아할 것이다"),  # 하다 verb
        ("가져오", "가져온다", "가져왔다", "가져올 것이다"),
    ],
)
def test_conjugation(stem: str, present: str, past: str, future: str) -> None:
    assert [conjugate(stem, t) for t in ("present", "past", "future")] == [present, past, future]


@pytest.mark.parametrize(
    ("english", "korean"),
    [
        ("the cat eats fish", "고양이가 생선을 먹는다"),  # SVO -> SOV, 가 after a vowel, 을 after ㄴ
        ("the bear ate an apple", "곰이 사과를 먹었다"),  # 이 after ㅁ, 를 after a vowel
        ("she will open the book", "그녀는 책을 열 것이다"),  # ㄹ-stem future
        ("they opened the heavy door", "그들은 무거운 문을 열었다"),  # pronouns take 은/는
        ("the big dog chased the small cats", "큰 개가 작은 고양이들을 쫓았다"),  # adjectives, plural 들
        ("three cats drank milk", "고양이 세 마리가 우유를 마셨다"),  # native numeral + counter
        ("i bought two books at the market", "나는 시장에서 책 두 권을 샀다"),  # location after the subject
        ("five students will meet one teacher", "학생 다섯 명이 선생님 한 명을 만날 것이다"),
        ("the chef makes hot soup in the kitchen", "요리사가 부엌에서 뜨거운 수프를 만든다"),
    ],
)
def test_translate_known_sentences(english: str, korean: str) -> None:
    assert translate(english) == korean


def test_generated_pairs_agree_with_translate() -> None:
    for src, tgt in generate_pairs(2000, seed=4):
        assert translate(src) == tgt


@pytest.mark.parametrize(
    "english",
    ["the dog eat the apple", "the cat eats dog", "a dog eats a apple", "two dog ate fish", "the dog"],
)
def test_translate_rejects_sentences_outside_the_grammar(english: str) -> None:
    with pytest.raises(ValueError, match="cannot translate"):
        translate(english)


def test_particles_in_generated_pairs_match_batchim() -> None:
    heads = {ko for _, ko, _ in tc.PRONOUNS} | {n.counter for n in tc.NOUNS}
    heads |= {n.ko for n in tc.NOUNS} | {n.ko + "들" for n in tc.NOUNS}
    for src, tgt in generate_pairs(1000, seed=5):
        words = tgt.split()
        # The subject is the first noun, plural, counter or pronoun followed by a particle (아이 is a noun).
        subject = next(w for w in words if w[-1] in "이가은는" and w[:-1] in heads)
        assert (subject[-1] in "이은") == has_batchim(subject[:-1]), tgt
        assert (subject[-1] in "은는") == (src.split()[0] in {"i", "we", "he", "she", "they"}), tgt
        obj = words[-3] if tgt.endswith("것이다") else words[-2]
        assert obj[-1] in "을를" and (obj[-1] == "을") == has_batchim(obj[:-1]), tgt


def test_numbers_use_native_numerals_and_counters() -> None:
    pairs = dict(generate_pairs(5000, seed=0))
    counted = [tgt for src, tgt in pairs.items() if src.startswith("three ")]
    assert counted
    for tgt in counted:
        assert " 세 " in tgt
        assert any(f" 세 {c}" in tgt for c in ("마리", "명", "개", "권", "통", "장", "대", "송이"))


def test_tsv_round_trip(tmp_path) -> None:
    pairs = generate_pairs(50)
    path = tmp_path / "pairs.tsv"
    write_tsv(pairs, path)
    assert path.read_text(encoding="utf-8").splitlines()[0] == "\t".join(pairs[0])
    assert read_tsv(path) == pairs


def test_write_tsv_rejects_tabs(tmp_path) -> None:
    with pytest.raises(ValueError, match="tab or newline"):
        write_tsv([("a\tb", "c")], tmp_path / "x.tsv")
