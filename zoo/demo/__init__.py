"""The demo (`zoo demo`) and the generated English -> Korean corpus it trains on; nothing is downloaded.

    from zoo.demo import toy_corpus, write_tsv
    corpus = toy_corpus(seed=0, train_size=6000, valid_size=300)   # .train, .valid: (english, korean) pairs
    write_tsv(corpus.train, "train.tsv")                            # the format `zoo train` reads

    corpus.py    the grammar: sampling, rendering and parsing sentences, the splits, `translate`
    hangul.py    Korean morphology from the code points: batchim, particles, conjugation
    lexicon.py   the vocabulary and its selectional restrictions
    tsv.py       ``source<TAB>target`` files
    config.py    the demo's embedded training config (imports `zoo.training`; import it by name)

Everything re-exported here is pure Python: no torch.
"""

from __future__ import annotations

from zoo.demo.corpus import ToyCorpus, generate_pairs, toy_corpus, translate
from zoo.demo.tsv import read_tsv, write_tsv

__all__ = ["ToyCorpus", "generate_pairs", "read_tsv", "toy_corpus", "translate", "write_tsv"]
