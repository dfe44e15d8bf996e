"""Training data at any size: streamed from the corpus, stored as memory-mapped token shards.

    sources    streaming readers (tsv, aligned, text, jsonl, parquet, arrow) -> `Record`s, a bad line named
    shards     the prepared folder: flat token arrays, offsets, a manifest; written atomically, memory-mapped
    prepare    a corpus through an encoder into shards, in bounded chunks; a no-op when already done
    planning   batches planned from the lengths alone, per epoch and per torchrun process

What the tasks make of the data (reading a split, framing, collation) is `zoo.training.tasks`; how a config's
splits become prepared data is `zoo.training.corpus`.
"""

from __future__ import annotations


class DataError(ValueError):
    """Training data that cannot be used; the message names the file and line."""
