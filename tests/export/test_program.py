"""torch.export of every family: one export on a padded (2, 8) example with dynamic dims, then the exported
program run on batches and lengths it never saw (padded, unpadded, a single token) equals eager."""

from __future__ import annotations

import functools

import pytest
import torch

import zoo
from zoo.blocks.flex import attention_kernel
from zoo.export import (
    ExportError,
    compare_program,
    example_inputs,
    export_program,
    load_program,
    output_names,
    save_program,
)
from zoo.models.outputs import ModelOutput

TOLERANCE = 1e-5  # float32


def _swap(name: str, field: str, value: dict) -> zoo.ModelSpec:
    """A tiny preset with one tagged field replaced whole (override would merge the old kind's fields)."""
    return zoo.parse_spec({**zoo.preset(name).model_dump(), field: value})


# name -> spec: the paths each family's forward takes. One layer each: export time grows with the layers.
SPECS = {
    "bert-mlm": lambda: zoo.preset("bert-tiny", num_layers=1),  # padding mask, MLM head, pooler
    "bert-classifier": lambda: zoo.preset("bert-tiny", num_layers=1).override(
        heads={"num_labels": 3, "mlm": None}
    ),
    "gpt2": lambda: zoo.preset("gpt2-tiny", num_layers=1),  # learned positions, causal + padding
    "llama": lambda: zoo.preset("llama-tiny", num_layers=1),  # rotary, GQA 4:2, RMSNorm, SwiGLU
    "sliding-window": lambda: zoo.preset("llama-tiny", num_layers=1).override(
        decoder={"pattern": {"kind": "sliding_window", "window": 3}}
    ),  # the dense window mask through SDPA
    "transformer": lambda: zoo.preset("transformer-tiny", num_layers=1),  # sinusoids, post-norm, tied
    "t5": lambda: zoo.preset("t5-tiny", num_layers=1),  # relative position bias (an additive mask)
    "bart": lambda: zoo.preset("bart-tiny", num_layers=1),  # learned positions offset 2, embedding norm
    "alibi": lambda: _swap("llama-tiny", "position", {"kind": "alibi"}),
    # soft-capped attention (the math path) and logits, sandwich (1 + w) norms, a local and a global layer
    # with their own rope bases
    "gemma": lambda: zoo.preset("gemma-tiny").override(
        num_layers=2,
        decoder={"layer_patterns": [{"kind": "sliding_window", "window": 3}, {"kind": "causal"}]},
        **{"attention.qk_norm": True, "position.local_theta": 1000.0},
    ),
    # YaRN's scaled tables with a layer that rotates nothing; dynamic NTK's rates from the batch's longest
    # position (a torch.where on it: past the original context of 4 on some shapes, within it on others)
    "yarn-nope": lambda: zoo.preset("llama-tiny", num_layers=2).override(
        **{
            "position.scaling": {"type": "yarn", "factor": 4.0, "original_max_positions": 4},
            "position.nope_layers": [1],
        }
    ),
    "dynamic": lambda: zoo.preset("llama-tiny", num_layers=1).override(
        **{"position.scaling": {"type": "dynamic", "factor": 4.0, "original_max_positions": 4}}
    ),
    # experts dispatched by gathered weights (no data-dependent shapes), a shared expert; aux_loss returned
    "moe": lambda: zoo.preset("moe-tiny", num_layers=1).override(**{"ffn.shared_d_ff": 16}),
    # latent attention (a q bottleneck) and DeepSeek-V3's routing: sigmoid scores, groups, a routing bias
    "deepseek": lambda: zoo.preset("deepseek-tiny", num_layers=2),
    # OLMo 2: norms on each sub-layer's output, q/k norms over all heads
    "olmo2": lambda: zoo.preset("olmo2-tiny", num_layers=1),
    # Cohere 2: one norm feeding parallel branches, scaled logits, a sliding window
    "cohere2": lambda: zoo.preset("cohere2-tiny", num_layers=1),
    # attention sinks (the SDPA sink column), a sliding layer, biased router and experts, the clamped SwiGLU
    "gpt-oss": lambda: zoo.preset("gpt-oss-tiny").override(
        decoder={"layer_patterns": [{"kind": "sliding_window", "window": 3}, {"kind": "causal"}]}
    ),
    # Llama 4: chunks of 3 (the chunked mask rule, traced), a no-rope layer with temperature tuning,
    # weightless q/k norms, input-weighted experts with a shared expert
    "llama4": lambda: zoo.preset("llama4-tiny").override(
        num_layers=2,
        decoder={"layer_patterns": [{"kind": "chunked", "size": 3}, {"kind": "causal"}]},
        **{"attention.temperature_tuning": {"floor_scale": 2, "scale": 0.5}, "position.nope_layers": [1]},
    ),
}
# 2-6 s each on a loaded 2-core machine; the default suite keeps the rest
SLOW = {"t5", "bart", "alibi", "gemma", "olmo2", "cohere2", "gpt-oss", "llama4"}
OUTPUTS = {
    "encoder": ["logits", "last_hidden_state", "pooler_output"],
    "decoder": ["logits", "last_hidden_state"],
    "encoder-decoder": ["logits", "last_hidden_state", "encoder_last_hidden_state"],
}
# (batch, length, target length): new batch sizes and lengths, padded; a single token; past the window
NEW_SHAPES = [(3, 11, 5), (1, 1, 1), (4, 2, 9)]


@functools.cache
def exported(name: str) -> tuple[zoo.ZooModel, torch.export.ExportedProgram]:
    """One model and its program per case, shared by the tests of this module."""
    torch.manual_seed(0)
    model = zoo.build(SPECS[name]())  # train mode: export_program traces eval and restores it
    return model, export_program(model)


def _cases(names) -> list:
    return [pytest.param(name, marks=pytest.mark.slow) if name in SLOW else name for name in names]


@pytest.mark.parametrize("name", _cases(SPECS))
def test_exported_program_equals_eager_on_new_batches_and_lengths(name: str) -> None:
    model, program = exported(name)
    assert model.training, "export_program restores the model's mode"
    for batch, length, target in NEW_SHAPES:
        example = example_inputs(model, batch=batch, length=length, target_length=target, seed=batch)
        differences = compare_program(model, program, example)
        assert list(differences) == OUTPUTS[model.spec.family] + (
            ["aux_loss"] if name in ("moe", "gpt-oss", "deepseek", "llama4") else []
        )
        assert max(differences.values()) <= TOLERANCE, (batch, length, differences)


def test_the_exported_graph_applies_the_padding_mask() -> None:
    """The graph is not the mask-free shortcut: padding changes the real rows' neighbours' view, and a
    padded row's real positions equal the same tokens unpadded."""
    model, program = exported("gpt2")
    model.eval()
    ids = torch.randint(3, model.spec.vocab_size, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, 4:] = 0
    out = program.module()(input_ids=ids, attention_mask=mask)
    alone = program.module()(input_ids=ids[1:, :4], attention_mask=mask[1:, :4])
    torch.testing.assert_close(out.logits[1, :4], alone.logits[0], atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(out.logits, model(ids, attention_mask=mask).logits, atol=TOLERANCE, rtol=0)
    model.train()


def test_the_exported_program_keeps_the_forward_length_limit_as_a_guard() -> None:
    model, program = exported("gpt2")
    top = model.spec.max_positions
    assert program.module()(**example_inputs(model, length=top)).logits.shape[1] == top
    ids = torch.randint(3, model.spec.vocab_size, (2, top + 1))
    with pytest.raises(AssertionError, match=f"Guard failed: input_ids.size\\(\\)\\[1\\] <= {top}"):
        program.module()(input_ids=ids, attention_mask=torch.ones_like(ids))


def test_a_user_mask_exports_with_both_lengths_dynamic() -> None:
    """A (B, T, T) bool attention_mask (True = may attend) in the example: both its length dims dynamic."""
    torch.manual_seed(0)
    model = zoo.build(zoo.preset("gpt2-tiny", num_layers=1))

    def user_mask(batch: int, length: int) -> torch.Tensor:
        mask = torch.ones(batch, length, length, dtype=torch.bool).tril()
        mask[-1, :, length // 2 :] = False  # the last row sees only its first half
        return mask

    ids = example_inputs(model, length=6)["input_ids"]
    program = export_program(model, example={"input_ids": ids, "attention_mask": user_mask(2, 6)})
    new = {"input_ids": torch.randint(3, model.spec.vocab_size, (3, 9)), "attention_mask": user_mask(3, 9)}
    assert max(compare_program(model, program, new).values()) <= TOLERANCE


def test_the_exported_program_returns_a_model_output_with_unset_fields_none() -> None:
    model, program = exported("transformer")
    out = program.module()(**example_inputs(model, batch=3, length=5))
    assert isinstance(out, ModelOutput)
    assert out.logits.shape == (3, 5, model.spec.vocab_size)
    assert out.loss is None and out.attentions is None and out.pooler_output is None
    assert output_names(program) == OUTPUTS["encoder-decoder"]


def test_a_plain_torch_export_call_works() -> None:
    """What a new user tries first: torch.export.export on the model itself, positional ids, no dims."""
    torch.manual_seed(0)
    model = zoo.build(zoo.preset("gpt2-tiny", num_layers=1)).eval()
    ids = torch.randint(3, model.spec.vocab_size, (2, 5))
    program = torch.export.export(model, (ids,))
    out = program.module()(ids)
    assert isinstance(out, ModelOutput)
    torch.testing.assert_close(out.logits, model(ids).logits, atol=TOLERANCE, rtol=0)


def test_a_saved_program_loads_and_runs_like_eager(tmp_path) -> None:
    model, program = exported("llama")
    path = save_program(program, tmp_path / "llama.pt2")
    assert path.is_file() and [p.name for p in tmp_path.iterdir()] == ["llama.pt2"]  # no temp left
    loaded = load_program(path)
    example = example_inputs(model, batch=3, length=13, seed=5)
    assert max(compare_program(model, loaded, example).values()) <= TOLERANCE
    assert isinstance(torch.export.load(path).module()(**example), ModelOutput)


def test_a_flex_kernel_setting_still_exports_the_dense_mask() -> None:
    """flex_attention is chosen by the traced length; exported, every length takes SDPA's dense mask."""
    torch.manual_seed(0)
    model = zoo.build(SPECS["sliding-window"]())
    with attention_kernel("flex"):
        program = export_program(model)
    graph = str(program.graph)
    assert "flex_attention" not in graph and "scaled_dot_product_attention" in graph
    example = example_inputs(model, batch=3, length=9, seed=2)
    assert max(compare_program(model, program, example).values()) <= TOLERANCE


def test_a_static_export_fixes_the_example_shapes() -> None:
    torch.manual_seed(0)
    model = zoo.build(zoo.preset("gpt2-tiny", num_layers=1))
    example = example_inputs(model, batch=1, length=4)  # size 1 is fine when nothing is dynamic
    program = export_program(model, example=example, dynamic=False)
    assert (
        max(compare_program(model, program, example_inputs(model, batch=1, length=4, seed=3)).values()) == 0
    )
    with pytest.raises(AssertionError, match="Guard failed"):  # torch's own input check
        program.module()(**example_inputs(model, batch=2, length=4))


@pytest.mark.parametrize(
    ("example", "message"),
    [
        ({"batch": 1}, "needs every batch and length of at least 2"),
        ({"length": 1}, "needs every batch and length of at least 2"),
    ],
)
def test_a_dynamic_export_refuses_an_example_of_size_one(example, message) -> None:
    model = zoo.build(zoo.preset("gpt2-tiny", num_layers=1))
    with pytest.raises(ExportError, match=message):
        export_program(model, example=example_inputs(model, **example))


def test_export_refuses_inputs_the_graph_cannot_take() -> None:
    model = zoo.build(zoo.preset("gpt2-tiny", num_layers=1))
    example = example_inputs(model)
    with pytest.raises(ExportError, match="labels cannot be an input of an exported decoder forward"):
        export_program(model, example={**example, "labels": example["input_ids"]})
    with pytest.raises(ExportError, match="needs input_ids"):
        export_program(model, example={"attention_mask": example["attention_mask"]})
    seq2seq = zoo.build(zoo.preset("t5-tiny", num_layers=1))
    with pytest.raises(ExportError, match="needs decoder_input_ids"):
        export_program(seq2seq, example={"input_ids": example["input_ids"]})


def test_a_block_sparse_pattern_is_refused_dynamic_and_exports_static() -> None:
    spec = zoo.preset("bert-tiny", num_layers=1).override(
        encoder={"pattern": {"kind": "block_sparse", "block_size": 4, "global_blocks": 1, "random_blocks": 1}}
    )
    model = zoo.build(spec)
    with pytest.raises(ExportError, match=r"block_sparse .* cannot be exported with dynamic lengths"):
        export_program(model)
    example = example_inputs(model, length=10)
    program = export_program(model, example=example, dynamic=False)
    assert (
        max(compare_program(model, program, example_inputs(model, length=10, seed=4)).values()) <= TOLERANCE
    )


def test_example_inputs_pad_every_mask_and_stay_in_the_vocabulary() -> None:
    model = zoo.build(zoo.preset("t5-tiny", num_layers=1))
    example = example_inputs(model, batch=3, length=6, target_length=4)
    assert example["attention_mask"].tolist() == [[1] * 6, [1] * 5 + [0], [1] * 4 + [0] * 2]
    assert example["decoder_attention_mask"].sum(dim=1).tolist() == [4, 3, 2]
    assert int(example["input_ids"].max()) < model.spec.vocab_size
    assert (example["input_ids"][example["attention_mask"] == 0] == model.spec.pad_token_id).all()
    with pytest.raises(ExportError, match="more than the model's max_positions"):
        example_inputs(model, length=model.spec.max_positions + 1)


def test_save_program_refuses_a_folder(tmp_path) -> None:
    _, program = exported("gpt2")
    with pytest.raises(ExportError, match="is a folder"):
        save_program(program, tmp_path)
