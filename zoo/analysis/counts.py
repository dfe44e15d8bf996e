"""Parameter counts of a built model, by role: lookup tables, the layer stacks, and the output heads.

    embedding   token / segment / position tables and T5's relative-bias tables (lookups, no FLOPs); an
                image front-end's class token and position table, an audio front-end's (Whisper's) positions
    body        everything inside the stacks that multiplies (Kaplan et al.'s non-embedding parameters),
                an image front-end's patch projection (a matmul per patch) and an audio front-end's convolutions
    head        output heads: untied LM matrix, MLM head, pooler, classifier, replaced-token detector

``body_as_run`` counts a shared layer once per use (ALBERT runs one layer 12 times): the FLOPs follow
the runs, the memory follows the distinct tensors. ``active`` is what one token runs through: a
Mixture-of-Experts layer's ``top_k`` of its ``num_experts`` experts (adapters included), everything else whole. ``tied`` is the size of a matrix that serves twice
(token embedding and output projection) and is stored, and counted, once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torch import nn

from zoo.analysis.tree import EMBEDDING_TABLES
from zoo.blocks.audio import AudioEmbedding
from zoo.blocks.patches import PatchEmbedding
from zoo.models.heads import ClassificationHead, LMHead, MLMHead, Pooler, ReplacedTokenHead
from zoo.models.sizes import idle_expert_parameters
from zoo.stacks import Stack


@dataclass(frozen=True)
class ParameterCounts:
    """Distinct parameters (``total`` == ``model.num_parameters()``) split by role."""

    total: int
    trainable: int
    embedding: int
    body: int
    head: int
    body_as_run: int
    tied: int
    active: int  # per token: total less the experts a Mixture-of-Experts layer does not route it to


def _distinct(params: Iterable[nn.Parameter]) -> dict[int, int]:
    return {id(p): p.numel() for p in params}


def _front_end(
    module: PatchEmbedding | AudioEmbedding,
) -> tuple[list[nn.Parameter | None], list[nn.Parameter]]:
    """(lookup tables, matmul weights) of an image or audio front-end: ViT's class token and positions beside
    its patch projection; Whisper's fixed sinusoidal positions beside its two convolutions."""
    if isinstance(module, PatchEmbedding):
        return [module.cls_token, module.positions], list(module.proj.parameters())
    return [module.positions], [*module.conv1.parameters(), *module.conv2.parameters()]


def count_parameters(model: nn.Module) -> ParameterCounts:
    """Split ``model``'s distinct parameters into embedding / body / head, plus tied and shared views."""
    everything = _distinct(model.parameters())
    tables: dict[int, int] = {}
    body: dict[int, int] = {}
    body_as_run = 0
    for module in model.modules():
        if isinstance(module, EMBEDDING_TABLES):
            tables |= _distinct(module.parameters())
        elif isinstance(module, PatchEmbedding | AudioEmbedding):  # tables beside a projection
            table, projections = _front_end(module)
            tables |= _distinct(p for p in table if p is not None)
            body |= _distinct(projections)
            body_as_run += sum(p.numel() for p in projections)
    for module in model.modules():
        if not isinstance(module, Stack):
            continue
        stack = {k: v for k, v in _distinct(module.parameters()).items() if k not in tables}
        body |= stack
        per_layer_set = sum(_distinct(module.layers.parameters()).values())
        extra_runs = (
            module.num_layers // len(module.layers) - 1
        )  # ALBERT: the one layer runs N - 1 more times
        body_as_run += sum(stack.values()) + extra_runs * per_layer_set
    tied = sum(
        m._tied_to[0].weight.numel()
        for m in model.modules()
        if isinstance(m, LMHead | MLMHead) and m._tied_to
    )
    idle = idle_expert_parameters(model)
    return ParameterCounts(
        total=sum(everything.values()),
        trainable=sum(p.numel() for p in model.parameters() if p.requires_grad),
        embedding=sum(tables.values()),
        body=sum(body.values()),
        head=sum(everything.values()) - sum(tables.values()) - sum(body.values()),
        body_as_run=body_as_run,
        tied=tied,
        active=sum(everything.values()) - idle,
    )


def head_flops(model: nn.Module, *, seq_len: int) -> float:
    """Matmul FLOPs per token of the output heads (a tied matrix multiplies like an untied one)."""
    total = 0.0
    for module in model.modules():
        if isinstance(module, LMHead):
            total += 2 * module.output_weight.numel()
        elif isinstance(module, MLMHead):
            total += 2 * (module.dense.weight.numel() + module.output_weight.numel())
        elif isinstance(module, ReplacedTokenHead):  # ELECTRA's discriminator: on every token
            total += 2 * sum(p.numel() for p in module.parameters() if p.dim() == 2)
        elif isinstance(module, Pooler | ClassificationHead):  # once per sequence, on its first token
            total += 2 * sum(p.numel() for p in module.parameters() if p.dim() == 2) / seq_len
    return total
