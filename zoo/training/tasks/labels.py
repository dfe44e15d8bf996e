"""A classifier's labels and head, and the framing its tokenizer carries (`zoo.training.tasks.classification`).

Prepared data keeps each split's own label names in its manifest, sorted (numerically when every label is an
integer), and class ids by them; `class_ids` maps them to the model's. A model without a classifier for the
task gets one (`new_head`, replacing an MLM head): reading the pooler when it has one, else the first
token; a token classifier drops the pooler, as transformers' ``*ForTokenClassification`` do.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from tokenizers import Tokenizer as HFTokenizer

from zoo.io.tokenizer import Tokenizer
from zoo.spec import EncoderSpec, ModelSpec
from zoo.training.data import DataError
from zoo.training.data.shards import PreparedData
from zoo.training.tasks.base import Split

# --- labels ---------------------------------------------------------------------------------------------


def data_labels(data: PreparedData) -> tuple[str, ...]:
    """A prepared split's label names, in its class-id order (its manifest's)."""
    labels = data.manifest.info.get("labels")
    if not isinstance(labels, list) or not all(isinstance(name, str) for name in labels):
        raise DataError(f"{data.path}: the manifest names no labels; not prepared for classification")
    return tuple(labels)


def label_names(spec: ModelSpec) -> tuple[str, ...]:
    """The class names of a classifier spec (set by `Classification.fit_spec`)."""
    classifier = spec.heads.classifier if isinstance(spec, EncoderSpec) else None
    assert classifier is not None and classifier.labels is not None, "fit_spec names the labels"
    return classifier.labels


def class_ids(split: Split, names: Sequence[str]) -> np.ndarray:
    """(the split's labels,) int64: the model's class id of each of the split's label ids. A label the
    model lacks is a `DataError` naming the first example that has it."""
    known = {name: i for i, name in enumerate(names)}
    labels = data_labels(split.data)
    stray = [name for name in labels if name not in known]
    if stray:
        first = _first_with(split.data, [labels.index(name) for name in stray])
        name = labels[first[1]]
        raise DataError(
            f"{split.data.origin(first[0])}: label {name!r:.60} is not one of the model's labels ({quoted(names)})"
        )
    return np.array([known[name] for name in labels], dtype=np.int64)


def _first_with(data: PreparedData, ids: list[int]) -> tuple[int, int]:
    """(the first example holding any of the label ids ``ids``, that id)."""
    side = "label" if "label" in data.sides else "tags"
    if data.side(side).kind == "scalar":
        values = data.values(side)
        where = int(np.argmax(np.isin(values, ids)))
        return where, int(values[where])
    tokens = data.tokens(side)
    position = int(np.argmax(np.isin(tokens, ids)))
    example = int(np.searchsorted(data.offsets(side), position, side="right")) - 1
    return example, int(tokens[position])


def sorted_names(names: set[str]) -> tuple[str, ...]:
    """Label names in class-id order: numerically when all are integers, else alphabetically."""
    if all(re.fullmatch(r"-?[0-9]+", name) for name in names):
        return tuple(sorted(names, key=int))
    return tuple(sorted(names))


def quoted(names: Sequence[str]) -> str:
    shown = ", ".join(repr(n) for n in list(names)[:8])
    return shown + (f", ... ({len(names)} in all)" if len(names) > 8 else "")


def new_head(spec: EncoderSpec, head: str, names: tuple[str, ...]) -> dict[str, Any]:
    """Overrides giving ``spec`` a fresh ``head`` classifier for ``names`` (in place of an MLM head or
    ELECTRA's replaced-token head)."""
    classifier: dict[str, Any] = {"task": head, "num_labels": len(names), "labels": list(names)}
    changes: dict[str, Any] = {
        "heads.mlm": None,
        "heads.replaced_token": None,
        "heads.classifier": classifier,
    }
    if head == "sequence":
        classifier["pooling"] = "pooler" if spec.heads.pooler else "first_token"
    else:
        changes["heads.pooler"] = False  # as transformers' *ForTokenClassification
    return changes


# --- the tokenizer ------------------------------------------------------------------------------------------


def with_encoder_framing(tokenizer: Tokenizer) -> Tokenizer:
    """``tokenizer`` with BERT's framing ``bos text eos`` as its post-processor, when it has none (those
    zoo trains): the batch call, and transformers' ``AutoTokenizer`` on an exported folder, then frame
    texts as training did, and a sequence head reads the same first token."""
    tok, bos, eos = tokenizer.hf, tokenizer.bos_id, tokenizer.eos_id
    if tok.post_processor is not None or bos is None or eos is None:
        return tokenizer
    first, last = ({"SpecialToken": {"id": tok.id_to_token(i), "type_id": 0}} for i in (bos, eos))
    single = [first, {"Sequence": {"id": "A", "type_id": 0}}, last]
    data = json.loads(tok.to_str())
    data["post_processor"] = {  # JSON, not a template string: token names may hold ':' or spaces
        "type": "TemplateProcessing",
        "single": single,
        "pair": [*single, {"Sequence": {"id": "B", "type_id": 0}}, last],
        "special_tokens": {
            token: {"id": token, "ids": [i], "tokens": [token]}
            for i in (bos, eos)
            if (token := tok.id_to_token(i)) is not None
        },
    }
    framed = Tokenizer(
        HFTokenizer.from_str(json.dumps(data)),
        model_max_length=tokenizer.model_max_length,
        source=tokenizer.source,
    )
    # Special tokens a tokenizer_config.json named (not found by their usual names) would be lost: keep it.
    return framed if framed.special_ids() == tokenizer.special_ids() else tokenizer
