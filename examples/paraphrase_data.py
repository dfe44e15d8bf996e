"""Write the paraphrase pairs of examples/contrastive.yaml, or score an embedding model's retrieval on them.

    python examples/paraphrase_data.py                    # rewrites examples/data/paraphrase.{train,valid}.jsonl
    python examples/paraphrase_data.py --score FOLDER     # held-out retrieval accuracy of FOLDER's embeddings

Each line is ``{"anchor": ..., "positive": ...}``: a sentence and a paraphrase of it (synonyms, the passive
voice, the place moved to the front): "the big dog chased the small cat in the park" and "in the garden, the
little kitten was pursued by the large hound". Sentences come in twins with their roles swapped ("the
small cat chased the big dog in the park"): the same words, the meaning reversed, so the nearest
paraphrase is only found by a model that reads who did what to whom, not by one that matches the words. ``--score`` embeds the held-out anchors and positives with `zoo.embed` and prints
the share of anchors whose nearest positive (cosine) is their own. Deterministic: the same seeds give the
same files.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

# Each word with the synonym its paraphrase uses.
ADJECTIVES = {"big": "large", "small": "little", "old": "elderly", "young": "youthful", "angry": "furious",
              "happy": "cheerful", "quiet": "silent", "fast": "quick"}  # fmt: skip
NOUNS = {"dog": "hound", "cat": "kitten", "man": "gentleman", "woman": "lady", "child": "kid",
         "teacher": "instructor", "farmer": "grower", "doctor": "physician"}  # fmt: skip
VERBS = {"chased": "pursued", "painted": "coloured", "carried": "hauled", "found": "discovered",
         "watched": "observed", "washed": "cleaned", "bought": "purchased", "hid": "concealed"}  # fmt: skip
PLACES = {"in the park": "in the garden", "at the station": "at the depot", "near the river": "by the stream",
          "in the kitchen": "in the cookhouse", "on the hill": "on the slope", "at school": "at the academy"}  # fmt: skip


def twins(rng: random.Random) -> list[tuple[str, str]]:
    """Two sentences with their roles swapped ("the big dog chased the small cat", "the small cat chased
    the big dog"), each with its paraphrase in the passive voice: the same words, the meaning reversed, so
    a bag of words cannot tell them apart."""
    (a1, n1), (a2, n2) = [(rng.choice(list(ADJECTIVES)), rng.choice(list(NOUNS))) for _ in range(2)]
    verb, place = rng.choice(list(VERBS)), rng.choice(list(PLACES))
    out = []
    for (sa, sn), (oa, on) in (((a1, n1), (a2, n2)), ((a2, n2), (a1, n1))):
        anchor = f"the {sa} {sn} {verb} the {oa} {on} {place}"
        positive = (
            f"{PLACES[place]}, the {ADJECTIVES[oa]} {NOUNS[on]} was {VERBS[verb]} by the {ADJECTIVES[sa]} "
            f"{NOUNS[sn]}"
        )
        out.append((anchor, positive))
    return out


def pairs(n: int, seed: int, exclude: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """``n`` pairs (twins, one after the other) with distinct anchors (none of ``exclude``)."""
    rng, seen, out = random.Random(seed), set(exclude), []
    while len(out) < n:
        twin = twins(rng)
        if twin[0][0] != twin[1][0] and not {a for a, _ in twin} & seen:
            seen.update(a for a, _ in twin)
            out.extend(twin)
    return out


def main(directory: Path) -> None:
    train = pairs(3000, seed=0)
    valid = pairs(300, seed=1, exclude=frozenset(a for a, _ in train))
    directory.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", train), ("valid", valid)):
        text = "".join(json.dumps({"anchor": a, "positive": p}) + "\n" for a, p in rows)
        (directory / f"paraphrase.{split}.jsonl").write_text(text, encoding="utf-8")


def score(folder: str, valid: Path) -> float:
    """The share of ``valid``'s anchors whose nearest positive (cosine, `zoo.embed`) is their own."""
    import numpy as np

    import zoo

    lines = [json.loads(line) for line in valid.read_text(encoding="utf-8").splitlines()]
    anchors = zoo.embed(folder, [line["anchor"] for line in lines])
    positives = zoo.embed(folder, [line["positive"] for line in lines])
    anchors /= np.linalg.norm(anchors, axis=1, keepdims=True)
    positives /= np.linalg.norm(positives, axis=1, keepdims=True)
    return float(((anchors @ positives.T).argmax(axis=1) == np.arange(len(lines))).mean())


if __name__ == "__main__":
    here = Path(__file__).resolve().parent / "data"
    if len(sys.argv) > 2 and sys.argv[1] == "--score":
        accuracy = score(sys.argv[2], here / "paraphrase.valid.jsonl")
        print(f"held-out retrieval accuracy of {sys.argv[2]}: {accuracy:.1%}")
    else:
        main(Path(sys.argv[1]) if len(sys.argv) > 1 else here)
