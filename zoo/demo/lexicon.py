"""The toy corpus's vocabulary: nouns with counters and tags, pronouns, adjectives, verbs, places, numbers.

Tags drive selectional restrictions (only people write letters, only food is eaten...): a verb or
adjective lists the tags a noun must have one of, so generated sentences stay sensible. Korean forms
that are irregular (attributive adjectives, native numerals) are listed, not derived.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Noun:
    en: str
    en_plural: str | None  # None: a mass noun, used bare (no article, plural or number)
    ko: str
    counter: str | None
    tags: frozenset[str]


def _nouns(rows: str, base: str) -> tuple[Noun, ...]:
    # One noun per line: "english plural korean counter [extra tags]"; plural "-" marks a mass noun.
    out = []
    for row in rows.strip().splitlines():
        en, plural, ko, counter, *extra = row.split()
        mass = plural == "-"
        tags = frozenset({base, "mass" if mass else "count", *extra})
        out.append(Noun(en, None if mass else plural, ko, None if mass else counter, tags))
    return tuple(out)


# Tags drive selectional restrictions: a verb or adjective lists the tags a noun must have one of.
NOUNS: tuple[Noun, ...] = (
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
class Adjective:
    en: str
    ko: str  # attributive form, listed rather than derived (크다 -> 큰, 귀엽다 -> 귀여운 are irregular)
    tags: frozenset[str]


def _adj(en: str, ko: str, tags: str) -> Adjective:
    return Adjective(en, ko, frozenset(tags.split()))


ADJECTIVES: tuple[Adjective, ...] = (
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
class Verb:
    en: str
    en_3sg: str
    en_past: str
    stem: str  # Korean stem: 먹다 -> 먹
    subject: frozenset[str]
    object: frozenset[str]


def _verb(en: str, en_3sg: str, en_past: str, stem: str, subject: str, obj: str) -> Verb:
    return Verb(en, en_3sg, en_past, stem, frozenset(subject.split()), frozenset(obj.split()))


# Every verb takes 을/를; none has an English past form equal to a present form ("read", "hit"),
# which would make "they read the book" ambiguous between 읽는다 and 읽었다.
VERBS: tuple[Verb, ...] = (
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
