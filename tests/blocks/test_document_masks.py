"""Packed documents: a token attends only within its document, and positions restart per document."""

from __future__ import annotations

import pytest
import torch

from zoo.blocks import masks
from zoo.blocks.flex import attention_kernel
from zoo.models.build import build_model
from zoo.spec import preset
from zoo.stacks import position_ids_from_documents


def packed(lengths: list[int], *, seed: int = 0) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """(the documents, their concatenation (1, T), document ids (1, T))."""
    gen = torch.Generator().manual_seed(seed)
    docs = [torch.randint(5, 100, (n,), generator=gen) for n in lengths]
    ids = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    return docs, torch.cat(docs)[None], ids[None]


def test_the_document_rule_is_block_diagonal_and_composes_with_causality() -> None:
    documents = torch.tensor([[0, 0, 1, 1, 1, 2]])
    frame = masks.Frame(q_pos=torch.arange(6), k_pos=torch.arange(6), batch=1)
    full = masks.pattern_mask(masks.within_documents(None, documents), frame)
    causal = masks.pattern_mask(masks.within_documents(lambda b, q, k: k <= q, documents), frame)
    assert full is not None and causal is not None
    blocks = torch.block_diag(torch.ones(2, 2), torch.ones(3, 3), torch.ones(1, 1)).bool()
    assert torch.equal(full[0, 0], blocks)
    assert torch.equal(causal[0, 0], blocks & torch.ones(6, 6).tril().bool())


def test_positions_restart_at_each_document() -> None:
    documents = torch.tensor([[3, 3, 3, 4, 4, 7], [0, 1, 1, 1, 1, -1]])
    assert position_ids_from_documents(documents).tolist() == [[0, 1, 2, 0, 1, 0], [0, 0, 1, 2, 3, 0]]


def _with_sinks(model: torch.nn.Module) -> torch.nn.Module:
    """Attention sinks drawn away from zero, where the model has them (gpt-oss-tiny)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("sinks"):
                param.normal_(0.0, 2.0)
    return model


# rotary, learned, encoder; OLMo 2's and Cohere 2's norms (Cohere's rope only on its sliding layers);
# attention sinks with sliding and full layers; latent attention; Llama 4's chunks (counted from each
# document's start) and temperature tuning (by position in the document)
@pytest.mark.parametrize(
    "name",
    [
        "llama-tiny", "gpt2-tiny", "bert-tiny", "olmo2-tiny", "cohere2-tiny", "gpt-oss-tiny", "deepseek-tiny",
        "llama4-tiny",
    ],
)  # fmt: skip
def test_a_packed_row_gives_each_document_the_logits_it_gets_alone(name: str) -> None:
    torch.manual_seed(0)
    model = _with_sinks(build_model(preset(name))).eval()
    docs, ids, documents = packed([5, 9, 3])
    with torch.no_grad():
        together = model(ids, document_ids=documents).logits[0]
        alone = torch.cat([model(doc[None]).logits[0] for doc in docs])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)


def test_document_ids_are_checked_by_name() -> None:
    model = build_model(preset("gpt2-tiny")).eval()
    _, ids, documents = packed([4, 4])
    with pytest.raises(ValueError, match=r"document_ids must have shape \(1, 8\)"):
        model(ids, document_ids=documents[:, :5])
    with pytest.raises(ValueError, match="document_ids must hold integer document ids"):
        model(ids, document_ids=documents.float())
    with pytest.raises(ValueError, match=r"position_ids contains 9999, outside \[0, "):
        model(ids, position_ids=torch.full_like(ids, 9999))


@pytest.mark.slow  # flex_attention compiles on first use (~25 s on a CPU)
@pytest.mark.parametrize("name", ["llama-tiny", "gpt-oss-tiny"])  # gpt-oss: dense on a CPU (no flex lse)
def test_flex_document_mask_matches_the_dense_path(name: str) -> None:
    torch.manual_seed(0)
    model = _with_sinks(build_model(preset(name))).eval()
    _, ids, documents = packed([40, 50, 30])
    with torch.no_grad():
        dense = model(ids, document_ids=documents).logits
        with attention_kernel("flex"):
            flexed = model(ids, document_ids=documents).logits
    torch.testing.assert_close(flexed, dense, atol=1e-5, rtol=1e-5)
