"""Write the toy sentiment data of examples/classify.yaml: short synthetic reviews, labelled by their tone.

    python examples/sentiment_data.py            # rewrites examples/data/sentiment.{train,valid}.tsv

Each line is ``text<TAB>label`` (positive / negative). A review is one clause ("the plot was really
gripping") or two joined by "but", where the second decides; "not" flips a clause ("the acting was not
very good" is negative). So the label is not a bag of words: the model has to see the negation and which
clause comes last. Deterministic: the same seeds give the same files.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

SUBJECTS = {
    "singular": ["the movie", "the film", "this show", "the plot", "the acting", "the ending", "the story",
                 "the soundtrack", "the dialogue", "the script", "the pacing", "the camera work"],
    "plural": ["the characters", "the jokes", "the actors", "the songs", "the effects", "the costumes"],
}  # fmt: skip
VERBS = {"singular": ["was", "is", "felt", "seemed"], "plural": ["were", "are", "felt", "seemed"]}
INTENSIFIERS = ["", "", "really", "very", "quite", "truly", "so", "rather"]
POSITIVE = ["great", "wonderful", "brilliant", "delightful", "moving", "charming", "superb", "clever",
            "gripping", "beautiful", "fun", "fresh", "touching", "excellent", "lovely", "good"]  # fmt: skip
NEGATIVE = ["boring", "awful", "dull", "terrible", "clumsy", "tedious", "bland", "weak", "messy",
            "painful", "flat", "silly", "predictable", "forgettable", "dreadful", "bad"]  # fmt: skip
OPENERS = ["", "", "", "honestly ,", "overall", "i thought", "to be fair ,", "in the end"]


def clause(rng: random.Random) -> tuple[str, bool]:
    """One clause and whether it is positive."""
    number = rng.choice(["singular", "singular", "plural"])
    positive = rng.random() < 0.5
    negated = rng.random() < 0.3
    words = [rng.choice(SUBJECTS[number]), rng.choice(VERBS[number])]
    words += ["not"] if negated else []
    words += [rng.choice(INTENSIFIERS), rng.choice(POSITIVE if positive else NEGATIVE)]
    return " ".join(w for w in words if w), positive != negated


def review(rng: random.Random) -> tuple[str, str]:
    text, positive = clause(rng)
    if rng.random() < 0.35:  # "X but Y": Y decides
        second, positive = clause(rng)
        text = f"{text} but {second}"
    opener = rng.choice(OPENERS)
    return f"{opener} {text}".strip(), "positive" if positive else "negative"


def write(path: Path, size: int, seed: int) -> None:
    rng = random.Random(seed)
    lines = ["\t".join(review(rng)) for _ in range(size)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    write(directory / "sentiment.train.tsv", 2000, seed=0)
    write(directory / "sentiment.valid.tsv", 200, seed=1)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "data")
