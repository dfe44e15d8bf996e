"""Korean morphology for the toy corpus, computed from the Hangul code points: batchim, particles, tense.

* **Particles** are chosen by whether the word they attach to ends in a final consonant (batchim),
  read off the Hangul syllable code point (``(cp - 0xAC00) % 28 != 0``): ``attach("곰", ...) == "곰이"``,
  after 고양이 it is 가.
* **Tense**, conjugated by rule from the verb stem in the plain declarative style (해라체):
  present ``-는다`` after a consonant, ``-ㄴ다`` after a vowel, with ㄹ-stems dropping ㄹ
  (먹는다, 본다, 만든다); past ``-았다`` after ㅏ/ㅗ, ``-었다`` otherwise, contracted after a vowel
  (먹었다, 봤다, 마셨다, 썼다) and ``하다 -> 했다``; future ``-(으)ㄹ 것이다`` (먹을 것이다, 볼 것이다,
  만들 것이다).
"""

from __future__ import annotations

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
