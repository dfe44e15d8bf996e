"""Sentence embeddings: one vector per text from any zoo model, as sentence-transformers computes them.

    vectors = zoo.embed("all-MiniLM-L6-v2/", texts)             # (N, 384) float32, unit length
    embedder = Embedder.load("all-MiniLM-L6-v2/", device="cuda")   # loaded once, called many times
    vectors = embedder(texts, batch_size=64)

One job a module:

    folder.py     what a sentence-transformers folder says: modules.json, the pooling config, the max length
    pooling.py    token vectors -> text vectors: mean, cls, max, lasttoken, mean_sqrt_len_tokens, weightedmean
    packing.py    a batch's rows: padded, or several texts packed into a row (document ids keep them apart)
    embedder.py   `Embedder` and `embed`: tokenize, sort by length, batch, pool, normalise, restore the order
    image_text.py `ImageTextEmbedder`: a dual encoder's (CLIP, SigLIP) texts and images, in one space

``zoo embed MODEL --input texts.txt --out vectors.npy`` (`zoo.cli.embed`) streams a file through an
`Embedder`. docs/embeddings.md has the details and the comparison with sentence-transformers.
"""

from __future__ import annotations

from zoo._lazy import lazy_exports
from zoo.embeddings.folder import POOLING_MODES, EmbeddingConfigError, FolderSettings, read_folder_settings

# The folder's settings import no torch (so `zoo embed --help` stays instant); the rest loads on first use.
_LAZY = {
    "Embedder": "zoo.embeddings.embedder:Embedder",
    "embed": "zoo.embeddings.embedder:embed",
    "pool": "zoo.embeddings.pooling:pool",
}

__all__ = ["POOLING_MODES", "EmbeddingConfigError", "FolderSettings", "read_folder_settings", *_LAZY]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, eager=__all__)
