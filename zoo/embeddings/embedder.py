"""`Embedder` and `embed`: texts -> one float32 vector each, from any zoo model and its tokenizer.

    vectors = zoo.embed("all-MiniLM-L6-v2/", ["A man plays a guitar.", "Someone plays music."])  # (2, 384)

The texts are tokenized together (in parallel, by the Rust tokenizer), truncated to ``max_length`` tokens
(special tokens included, as sentence-transformers truncates), sorted by their token count, longest first,
and run ``batch_size`` at a time, each batch in rows as long as its longest text: padded on the right, or
with several texts packed into a row where every attention pattern allows it (`zoo.embeddings.packing`);
the vectors come back in the order of the texts. Sorting and packing keep padding, and so wasted compute,
near zero on a large, mixed file; the first batch is the longest, so running out of memory shows at once.

Padding on the right is exact for every family: an encoder masks the pads out of attention, and a decoder's
causal attention never sees the pads after a real token, so a text's vector is the one it gets alone.
Packed texts are kept apart by document ids (their attention stays inside, their positions restart).

An encoder pools its last hidden states; a decoder pools ``last_hidden_state`` (use ``lasttoken`` pooling,
the usual choice for decoder embedders); an encoder-decoder pools its encoder's output. The LM or MLM head is
not run (its logits are selected for no position).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import normalizers

from zoo.embeddings import packing
from zoo.embeddings.folder import FolderSettings, check_pooling, read_folder_settings
from zoo.embeddings.image_text import ImageTextEmbedder, dual_embedder
from zoo.embeddings.pooling import pool
from zoo.io.checkpoint import load, load_tokenizer
from zoo.io.hf import from_hf
from zoo.io.hf.hub import resolve_checkpoint
from zoo.io.names import SPEC_NAME
from zoo.io.tokenizer import Tokenizer
from zoo.io.tokenizer.batch import is_int
from zoo.io.tokenizer.lengths import char_budget, cut_before_encoding

if TYPE_CHECKING:
    from zoo.models.base import ZooModel

PathLike = str | os.PathLike[str]


class Embedder:
    """A model, its tokenizer and the embedding settings, resolved once: ``embedder(texts)`` -> (N, dim).

    Build one with `Embedder.load` (a folder, or a model); `embed` is the one-call form. ``pooling`` is a
    tuple of modes (`zoo.embeddings.pooling`), ``max_length`` counts special tokens (None: no limit),
    ``prompt`` is put before every text, and its tokens are left out of the pooling unless
    ``include_prompt``.
    """

    reads_images = False  # a dual encoder's `ImageTextEmbedder` reads images too

    def __init__(
        self,
        model: ZooModel,
        tokenizer: Tokenizer,
        *,
        pooling: tuple[str, ...] = ("mean",),
        normalize: bool = False,
        max_length: int | None = None,
        prompt: str | None = None,
        include_prompt: bool = True,
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.pooling = check_pooling(pooling)
        self.normalize = bool(normalize)
        self.max_length = max_length
        self.prompt = prompt
        self.prompt_length = 0 if include_prompt or not prompt else _prompt_length(tokenizer, prompt)
        self.packable = _packable(model)

    @classmethod
    def load(
        cls,
        model_or_folder: ZooModel | PathLike,
        *,
        tokenizer: Tokenizer | PathLike | None = None,
        pooling: str | Sequence[str] | None = None,
        normalize: bool | None = None,
        max_length: int | None = None,
        device: torch.device | str | None = None,
    ) -> Embedder | ImageTextEmbedder:
        """The embedder of a folder (zoo checkpoint, Hugging Face or sentence-transformers; or a Hub id) or
        of a loaded model. See `embed` for the arguments. A dual encoder's (CLIP, SigLIP) is an
        `ImageTextEmbedder`, which embeds images too."""
        if max_length is not None and (not is_int(max_length) or max_length < 1):
            raise ValueError(f"max_length must be an int >= 1 or None, got {max_length!r}")
        if normalize is not None and not isinstance(normalize, bool):
            raise ValueError(f"normalize must be True, False or None, got {normalize!r}")
        modes = check_pooling(pooling) if pooling is not None else None
        model, settings = _model_and_settings(model_or_folder, device=device)
        tok = _tokenizer(tokenizer, settings)
        if model.spec.family == "dual-encoder":  # CLIP, SigLIP: texts and images (`image_text`)
            # its vectors are unit length (normalize=True is what it does anyway)
            given = {
                "pooling": pooling is not None,
                "max_length": max_length is not None,
                "normalize": normalize is False,
            }
            for name, set_ in given.items():
                if set_:
                    raise ValueError(
                        f"{name}: a dual encoder (CLIP, SigLIP) pools, cuts and normalises as its spec says"
                    )
            return dual_embedder(model, tok, settings)
        if settings.lowercase:
            tok = _lowercased(tok)
        if settings.from_modules and settings.pooling is None and modes is None:
            raise ValueError(
                f"{settings.model_dir}: its modules.json has no Pooling module, so it gives no text "
                "vectors; pass pooling= to choose one"
            )
        limit = max_length if max_length is not None else settings.max_length
        if limit is None:  # as sentence-transformers: the tokenizer's limit, within the model's positions
            limits = [n for n in (tok.model_max_length, model.spec.max_positions) if n is not None]
            limit = min(limits) if limits else None
        elif limit > model.spec.max_positions:
            where = "max_length" if max_length is not None else f"{settings.model_dir}: max_seq_length"
            raise ValueError(
                f"{where} ({limit}) is longer than the model's {model.spec.max_positions} positions"
            )
        return cls(
            model,
            tok,
            pooling=modes or settings.pooling or ("mean",),
            normalize=settings.normalize if normalize is None else normalize,
            max_length=limit,
            prompt=settings.prompt,
            include_prompt=settings.include_prompt,
        )

    @property
    def device(self) -> torch.device:
        """Where the model's weights are (the batches go there)."""
        return next(self.model.parameters()).device

    @property
    def dim(self) -> int:
        """The length of each vector: the hidden width times the number of pooling modes."""
        project_out = getattr(self.model, "project_out", None)
        width = project_out.out_features if project_out is not None else self.model.spec.d_model
        return width * len(self.pooling)

    def counts(self, texts: Sequence[str]) -> list[int]:
        """Tokens each text costs (the server's usage count)."""
        return [len(ids) for ids in self.tokenize(texts)]

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's ids: prompt put first, framed by the tokenizer's special tokens, cut to max_length."""
        texts = _check_texts(texts)
        if self.prompt:
            texts = [self.prompt + text for text in texts]
        if self.max_length is None:
            return self.tokenizer(texts)["input_ids"]
        # A 20 MB line costs gigabytes to encode whole: cut it first to what the limit can keep (lengths).
        texts, _ = cut_before_encoding(texts, char_budget(self.tokenizer, self.max_length))
        return self.tokenizer(texts, truncation=True, max_length=self.max_length)["input_ids"]

    @torch.inference_mode()
    def __call__(
        self,
        texts: Sequence[str],
        *,
        batch_size: int = 32,
        on_batch: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        """(N, dim) float32 vectors of ``texts``, in their order. ``on_batch(n)`` is called after each batch
        with the number of texts it held (a progress bar's step)."""
        if not is_int(batch_size) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        rows = self.tokenize(texts)
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        lengths = torch.tensor([len(row) for row in rows], dtype=torch.long)
        if len(rows) and int(lengths.min()) == 0:
            i = int(torch.nonzero(lengths == 0)[0])
            raise ValueError(
                f"texts[{i}] ({texts[i][:40]!r}) has no tokens, and the tokenizer adds no special tokens: it "
                "has no vector"
            )
        order = torch.argsort(lengths, descending=True, stable=True)  # longest first
        for start in range(0, len(rows), batch_size):
            picked = order[start : start + batch_size]
            vectors = self._embed_batch([rows[i] for i in picked.tolist()], lengths[picked])
            out[picked.numpy()] = vectors.float().cpu().numpy()
            if on_batch is not None:
                on_batch(len(picked))
        return out

    def _embed_batch(self, rows: list[list[int]], lengths: torch.Tensor) -> torch.Tensor:
        """Rows of ids (longest first) -> (B, dim) vectors."""
        T, padding = int(lengths.max()), int(lengths.min()) < int(lengths.max())
        # Packed only where it saves positions: texts of one length fill padded rows exactly.
        pack = self.packable and padding
        layout = packing.packed(lengths) if pack else packing.padded(lengths)
        flat = torch.tensor(list(chain.from_iterable(rows)), dtype=torch.long)  # (N,) text by text
        pad_id = self.tokenizer.pad_id or 0  # any id: pads are masked
        ids, mask, documents = packing.model_inputs(layout, flat, pad_id=pad_id, documents=pack)
        hidden = self._hidden(ids, mask, documents, padding=padding)  # (rows, width, C)
        hidden = packing.per_text(layout, hidden, lengths)  # (B, T, C)
        keep = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)  # (B, T) True = a real token, on the left
        if self.prompt_length:  # the prompt's tokens are context, not content: out of the pooling
            keep &= (torch.arange(T) >= self.prompt_length).unsqueeze(0)
        vectors = pool(hidden, keep.to(hidden.device), self.pooling)  # (B, dim)
        return F.normalize(vectors, p=2, dim=1) if self.normalize else vectors

    def _hidden(
        self, ids: torch.Tensor, mask: torch.Tensor, documents: torch.Tensor | None, *, padding: bool
    ) -> torch.Tensor:
        """The token vectors the family pools: (R, W) ids, mask and document ids -> (R, W, C)."""
        model: Any = self.model
        ids = ids.to(self.device)
        # Without padding, no mask: attention takes its faster path for unmasked rows.
        attention_mask = mask.to(self.device) if padding else None
        if model.spec.family == "encoder-decoder":
            return model.encode(ids, attention_mask).hidden
        # Token-level heads score no position: their (B, T, V) logits would cost more than the model.
        heads = [getattr(model, name, None) for name in ("lm_head", "mlm_head")]
        classifier = getattr(model, "classifier", None)
        token_head = any(h is not None for h in heads) or getattr(classifier, "per_token", False)
        skip = torch.zeros_like(ids, dtype=torch.bool) if token_head else None
        extra = {"document_ids": documents.to(self.device)} if documents is not None else {}
        return model(ids, attention_mask=attention_mask, logits_mask=skip, **extra).last_hidden_state


def embed(
    model_or_folder: ZooModel | PathLike,
    texts: Sequence[Any],
    *,
    tokenizer: Tokenizer | PathLike | None = None,
    pooling: str | Sequence[str] | None = None,
    normalize: bool | None = None,
    max_length: int | None = None,
    batch_size: int = 32,
    device: torch.device | str | None = None,
) -> np.ndarray:
    """Sentence embeddings: one float32 vector per text, as a numpy array of shape (len(texts), dim).

    A dual encoder (CLIP, SigLIP) embeds images too: ``texts`` may hold PIL images and ``data:image/...;base64,``
    URLs among the texts, each vector transformers' ``image_embeds`` / ``text_embeds`` (unit length, one
    space; `zoo.embeddings.image_text`).

    ``model_or_folder``: a folder (a zoo checkpoint, a Hugging Face or a sentence-transformers folder; a Hub
    id in the local cache), or a loaded zoo model. A sentence-transformers folder's ``modules.json``,
    ``1_Pooling/config.json`` and ``sentence_bert_config.json`` give the pooling, the normalisation and the
    max length (`zoo.embeddings.folder`); any other folder gets mean pooling, no normalisation. A model
    loaded from a folder (``zoo.from_hf(folder)``) reads that folder's settings the same way.

    Args:
        tokenizer: a `zoo.Tokenizer`, or the path of a ``tokenizer.json`` or its folder; default: the
            folder's. Required for a model that came from no folder.
        pooling: "mean", "cls", "max", "lasttoken", "mean_sqrt_len_tokens" or "weightedmean", or a list of
            them (their vectors concatenated); overrides the folder's.
        normalize: unit-length vectors (True) or not (False); default: the folder's Normalize module.
        max_length: tokens kept per text, special tokens included; default: ``max_seq_length``, else the
            tokenizer's ``model_max_length`` within the model's positions.
        batch_size: texts per forward pass (sorted by length first, so batches carry little padding).
        device: where a folder's model is loaded (default: the CPU; ``"auto"``: CUDA when available). A
            model given loaded stays where it is.

    ``zoo.embed(folder, texts)`` equals ``SentenceTransformer(folder).encode(texts)`` (to 1e-5 for
    all-MiniLM-L6-v2, long texts included). For many calls, build an `Embedder` once.
    """
    embedder = Embedder.load(
        model_or_folder,
        tokenizer=tokenizer,
        pooling=pooling,
        normalize=normalize,
        max_length=max_length,
        device=device,
    )
    return embedder(texts, batch_size=batch_size)


# --- loading ------------------------------------------------------------------------------------------------


def _model_and_settings(
    model_or_folder: ZooModel | PathLike, *, device: torch.device | str | None
) -> tuple[ZooModel, FolderSettings]:
    """The model and the settings of its folder (those of a loaded model's ``name_or_path``, if a folder)."""
    if isinstance(model_or_folder, torch.nn.Module):
        if device is not None:
            raise ValueError("device= is for loading a folder; move a loaded model with model.to(device)")
        source = getattr(model_or_folder, "name_or_path", None)
        folder = Path(source) if isinstance(source, str) and Path(source).is_dir() else None
        settings = read_folder_settings(folder) if folder is not None else FolderSettings(model_dir=None)
        return model_or_folder, settings
    if not isinstance(model_or_folder, (str, os.PathLike)):
        raise ValueError(
            f"model_or_folder must be a zoo model or a folder path, got {type(model_or_folder).__name__}"
        )
    folder = resolve_checkpoint(model_or_folder)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"{folder}: no such folder (a zoo checkpoint, a Hugging Face or sentence-transformers folder)"
        )
    settings = read_folder_settings(folder)
    assert settings.model_dir is not None  # read from a folder
    if (settings.model_dir / SPEC_NAME).is_file():
        model = load(settings.model_dir, device=device)
    else:
        model = from_hf(settings.model_dir, device=device)
    return model, settings  # type: ignore[return-value]


def _tokenizer(tokenizer: Tokenizer | PathLike | None, settings: FolderSettings) -> Tokenizer:
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    if tokenizer is not None:
        return Tokenizer.from_file(tokenizer)
    if settings.model_dir is None:
        raise ValueError("the model came from no folder, so it has no tokenizer to use: pass tokenizer=")
    if (settings.model_dir / SPEC_NAME).is_file():
        return load_tokenizer(settings.model_dir)
    return Tokenizer.from_file(settings.model_dir)


def _lowercased(tokenizer: Tokenizer) -> Tokenizer:
    """``tokenizer`` with a Lowercase normalizer in front (``do_lower_case``, as sentence-transformers adds
    it), on a copy: the caller's tokenizer keeps its normalizer."""
    backend = type(tokenizer.hf).from_str(tokenizer.hf.to_str())
    steps = [normalizers.Lowercase(), *([backend.normalizer] if backend.normalizer is not None else [])]
    backend.normalizer = normalizers.Sequence(steps)
    specials = {n: tokenizer.id_to_token(i) for n, i in tokenizer.special_ids().items() if i is not None}
    return Tokenizer(
        backend,
        model_max_length=tokenizer.model_max_length,
        special_tokens={n: t for n, t in specials.items() if t is not None},
        source=tokenizer.source,
    )


def _packable(model: ZooModel) -> bool:
    """Whether several texts may share a row (`zoo.embeddings.packing`): an encoder or a decoder whose every
    attention pattern is one a text sees the same way at any offset."""
    stack = getattr(model, {"encoder": "encoder", "decoder": "decoder"}.get(model.spec.family, ""), None)
    patterns = getattr(stack, "patterns", None)
    return patterns is not None and all(p.kind in packing.PACKABLE for p in patterns.distinct)


def _prompt_length(tokenizer: Tokenizer, prompt: str) -> int:
    """The prompt's tokens at the start of every row, framing included, its closing special token not (as
    sentence-transformers counts them)."""
    [ids] = tokenizer([prompt])["input_ids"]
    specials = {i for i in tokenizer.special_ids().values() if i is not None}
    return len(ids) - (1 if ids and ids[-1] in specials else 0)


def _check_texts(texts: object) -> list[str]:
    if isinstance(texts, str):
        raise ValueError("texts must be a list of str, got one str: wrap it in a list, [text]")
    if not isinstance(texts, (list, tuple)):
        raise ValueError(f"texts must be a list of str, got {type(texts).__name__}")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(f"texts must be a list of str; texts[{i}] is {type(text).__name__}")
    return list(texts)
