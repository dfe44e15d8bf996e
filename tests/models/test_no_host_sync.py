"""No forward reads a tensor's values on the host: every family runs a padded batch on FakeTensors and on the
meta device, where a read (``.item()``, ``bool(t)``, ``.tolist()``) raises instead of syncing with a GPU."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
import torch
from support import TINY_PRESETS, padded_batch
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

import zoo


def test_a_host_read_raises_under_fake_tensors():
    """What the tests below rely on: a value read under FakeTensorMode is an error, not a silent sync."""
    with FakeTensorMode() as mode:
        mask = mode.from_tensor(torch.ones(2, 3))
        with pytest.raises(DataDependentOutputException):
            bool(mask.all())


@pytest.mark.parametrize("where", ["fake", "meta"])
@pytest.mark.parametrize("name", TINY_PRESETS)
def test_a_padded_forward_and_backward_never_read_values_on_the_host(name, where):
    spec = zoo.preset(name)
    ids, mask = padded_batch(spec.vocab_size, [6, 3])  # real padding: every mask is built
    labels = torch.tensor([0, 1]) if spec.family == "encoder" and not spec.heads.mlm else ids
    mode: contextlib.AbstractContextManager = (
        FakeTensorMode() if where == "fake" else contextlib.nullcontext()
    )
    with mode:
        convert: Callable[[torch.Tensor], torch.Tensor] = (
            mode.from_tensor if isinstance(mode, FakeTensorMode) else (lambda t: t.to("meta"))
        )
        model = zoo.build(spec, device="meta" if where == "meta" else None)
        ids, mask, labels = convert(ids), convert(mask), convert(labels)
        extra = (
            {"decoder_input_ids": ids, "decoder_attention_mask": mask}
            if spec.family == "encoder-decoder"
            else {}
        )
        out = model.train()(ids, attention_mask=mask, labels=labels, **extra)  # SDPA path, with the loss
        out.loss.backward()
        eager = model.eval()(ids, attention_mask=mask, output_attentions=True, **extra)  # eager path
    assert out.last_hidden_state.shape == eager.last_hidden_state.shape == (2, 6, spec.d_model)
