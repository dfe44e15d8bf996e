"""What every zoo model shares: its spec, parameter counts, and `generate` (decoders)."""

from __future__ import annotations

from typing import Any

from torch import nn

from zoo.blocks import TokenEmbedding
from zoo.spec import ModelSpec
from zoo.stacks import Stack


class ZooModel(nn.Module):
    """Base of `EncoderModel`, `DecoderModel` and `EncoderDecoderModel`; ``model.spec`` built it."""

    spec: ModelSpec

    def num_parameters(self, *, trainable_only: bool = False) -> int:
        """Distinct parameters (a tied or shared tensor counts once)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    def reset_buffers(self) -> None:
        """Recompute fixed tables (sinusoids, rotary angles, ALiBi slopes), e.g. after a meta-device build."""
        for module in self.modules():
            if module is not self and hasattr(module, "reset_buffers"):
                module.reset_buffers()

    def extra_repr(self) -> str:
        return f"spec={self.spec.name or self.spec.family!r}"


def build_stack(spec: ModelSpec, name: str) -> Stack:
    """The ``name`` stack ("encoder" or "decoder") of ``spec``, with the model-level context it needs."""
    return Stack(
        spec.stacks()[name],
        embedding=spec.embedding,
        d_model=spec.d_model,
        max_positions=spec.max_positions,
        dropout=spec.dropout,
    )


def build_embedding(spec: ModelSpec, *, vocab_size: int | None = None) -> TokenEmbedding:
    """Token embeddings for ``spec`` (its target vocabulary unless ``vocab_size`` says otherwise)."""
    return TokenEmbedding(spec.embedding, vocab_size=vocab_size or spec.vocab_size, d_model=spec.d_model)


class GenerationMixin:
    """``model.generate(...)`` for the models that decode; the search itself lives in `zoo.generation`."""

    def generate(self, input_ids: Any, **kwargs: Any) -> Any:
        """Greedy, sampling or beam search; see `zoo.generation.generate` for every argument."""
        from zoo.generation import generate  # generation sits above models in the flow: import lazily

        return generate(self, input_ids, **kwargs)
