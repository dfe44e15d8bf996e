"""Write the English text of examples/gpt.yaml: the English side of the demo's generated corpus.

    python examples/english_data.py             # rewrites examples/data/english.{train,valid}.txt

One sentence a line ("the big dog chased two cats in the park"), the plain-text format `zoo train` reads
for a language model. The sentences come from the demo's grammar (`zoo.demo.corpus`, seed 0: subjects,
tenses, adjectives, numbers, locations), so a small GPT learns it in a minute and its continuations can be
checked by eye. Deterministic: the same seed gives the same files.
"""

from __future__ import annotations

import sys
from pathlib import Path

from zoo.demo import toy_corpus


def main(directory: Path) -> None:
    corpus = toy_corpus(seed=0, train_size=6000, valid_size=300)
    directory.mkdir(parents=True, exist_ok=True)
    for split, pairs in (("train", corpus.train), ("valid", corpus.valid)):
        text = "".join(f"{english}\n" for english, _ in pairs)
        (directory / f"english.{split}.txt").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "data")
