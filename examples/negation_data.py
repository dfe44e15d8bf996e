"""Write the shifted toy task of examples/finetune_lora.yaml: negated sentences the demo model never saw.

    python examples/negation_data.py             # rewrites examples/data/negation.{train,valid}.tsv

``the cat does not eat fish<TAB>고양이가 생선을 안 먹는다``: the demo grammar with one new construction,
do-support negation in English and short-form 안 negation in Korean (`zoo.demo.shifted`). The training file
holds 1,500 negated pairs and 500 of the demo corpus's own training pairs (so a fine-tune also sees when not
to negate), shuffled; the held-out file 200 negated pairs, none in training. Every Korean syllable is one
the demo tokenizer learned (no unknown tokens). Deterministic: the same seed gives the same files.
"""

from __future__ import annotations

import sys
from pathlib import Path

from zoo.demo import write_tsv
from zoo.demo.shifted import shifted_corpus


def main(directory: Path) -> None:
    corpus = shifted_corpus(seed=0, train_size=2000, valid_size=200, affirmative_share=0.25)
    directory.mkdir(parents=True, exist_ok=True)
    write_tsv(corpus.train, directory / "negation.train.tsv")
    write_tsv(corpus.valid, directory / "negation.valid.tsv")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "data")
