"""The weight layout single-row CPU decoding uses (`zoo.generation.weight_layout`): the wide matrices
column-major for one or two float32 rows a step, every matrix row-major otherwise; the same tokens either
way; training and saving see contiguous weights."""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.generation import stream
from zoo.generation.weight_layout import is_column_major, row_major, use_decoding_layout, wants_column_major


def _layouts(model: torch.nn.Module) -> set[str]:
    """{"column"} when some wide matrices are column-major (the rest row-major), {"row"} when none is."""
    columns = {is_column_major(p) for p in model.parameters() if p.dim() == 2}
    return {"column" if True in columns else "row"}


def _column_major_names(model: torch.nn.Module) -> set[str]:
    return {name for name, p in model.named_parameters() if is_column_major(p)}


def test_the_rule_is_wide_float32_matrices_on_the_cpu_for_at_most_two_rows():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    wide, narrow, square = (1536, 512), (512, 2048), (512, 512)
    assert wants_column_major(wide, cpu, torch.float32, 1) and wants_column_major(wide, cpu, torch.float32, 2)
    assert not wants_column_major(wide, cpu, torch.float32, 3)
    assert not wants_column_major(narrow, cpu, torch.float32, 1)
    assert not wants_column_major(square, cpu, torch.float32, 1)
    assert not wants_column_major(wide, cpu, torch.bfloat16, 1)
    assert not wants_column_major(wide, cuda, torch.float32, 1)


def test_which_matrices_go_column_major(tiny):
    model = tiny("gpt2-tiny")  # a tied head: it multiplies by the embedding table
    use_decoding_layout(model, rows=1)
    names = _column_major_names(model)
    assert "embed.tokens.weight" in names
    assert any(".qkv_proj." in n for n in names) and any(".up_proj." in n for n in names)  # wide
    assert all(".qkv_proj." in n or ".up_proj." in n or n == "embed.tokens.weight" for n in names), names
    untied = tiny("llama-tiny")  # an untied head: its own matrix, and the table stays row-major (lookups)
    use_decoding_layout(untied, rows=1)
    names = _column_major_names(untied)
    assert "lm_head.weight" in names and "embed.tokens.weight" not in names


def test_single_row_decoding_gives_the_row_major_tokens(any_model, prompts):
    model = any_model
    ids, _ = prompts(model.spec.vocab_size, [6])
    kwargs = dict(max_new_tokens=8, eos_token_id=[])
    model.train()  # a model in training mode decodes with its weights as they are
    reference = model.generate(ids, **kwargs)
    assert _layouts(model) == {"row"}
    model.eval()
    assert torch.equal(model.generate(ids, **kwargs), reference)
    assert _layouts(model) == {"column"}
    assert torch.equal(model.generate(ids, **kwargs), reference)  # kept: the second run converts nothing


def test_the_layout_follows_the_rows_of_each_run(tiny, prompts):
    model = tiny("llama-tiny")
    ids, mask = prompts(model.spec.vocab_size, [5, 3, 4])
    batched = model.generate(ids, attention_mask=mask, max_new_tokens=6, eos_token_id=[])
    model.generate(ids[:1], max_new_tokens=2)
    assert _layouts(model) == {"column"}
    assert torch.equal(model.generate(ids, attention_mask=mask, max_new_tokens=6, eos_token_id=[]), batched)
    assert _layouts(model) == {"row"}
    model.generate(ids[:1], max_new_tokens=2, num_beams=3)  # 3 rows a step: row-major
    assert _layouts(model) == {"row"}
    list(stream(model, ids[:2], attention_mask=mask[:2], max_new_tokens=2))  # 2 rows: column-major
    assert _layouts(model) == {"column"}


def test_the_parameters_ties_and_logits_stay_the_same(tiny, prompts):
    model = tiny("gpt2-tiny")  # tied head: its matrix is the embedding's
    params = dict(model.named_parameters())
    ids, _ = prompts(model.spec.vocab_size, [7])
    before = model(ids).logits
    use_decoding_layout(model, rows=1)
    assert _layouts(model) == {"column"}
    assert {name: id(p) for name, p in model.named_parameters()} == {n: id(p) for n, p in params.items()}
    assert model.lm_head.output_weight is model.embed.tokens.weight
    torch.testing.assert_close(model(ids).logits, before, rtol=1e-5, atol=1e-5)
    row_major(model)
    assert _layouts(model) == {"row"} and all(p.is_contiguous() for p in model.parameters())


def test_training_mode_makes_the_weights_contiguous_and_an_optimizer_step_works(tiny, prompts):
    model = tiny("llama-tiny")
    ids, _ = prompts(model.spec.vocab_size, [6])
    model.generate(ids, max_new_tokens=2)
    assert _layouts(model) == {"column"}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    model.train()
    assert all(p.is_contiguous() for p in model.parameters())
    model(ids, labels=ids).loss.backward()
    optimizer.step()
    assert all(p.grad is None or p.grad.is_contiguous() for p in model.parameters())


def test_other_dtypes_and_a_sample_inside_a_training_loop_keep_row_major(tiny, prompts):
    model = tiny("gpt2-tiny").to(torch.bfloat16)
    ids, _ = prompts(model.spec.vocab_size, [4])
    model.generate(ids, max_new_tokens=2)
    assert _layouts(model) == {"row"}
    model = tiny("gpt2-tiny").train()
    model.generate(ids, max_new_tokens=2)
    assert _layouts(model) == {"row"} and model.training


def test_saving_and_exporting_after_single_row_decoding(tmp_path, tiny, prompts):
    model = tiny("gpt2-tiny")
    ids, _ = prompts(model.spec.vocab_size, [4])
    expected = model.generate(ids, max_new_tokens=4, eos_token_id=[])
    assert _layouts(model) == {"column"}
    zoo.save(model, tmp_path / "zoo")
    assert torch.equal(zoo.load(tmp_path / "zoo").generate(ids, max_new_tokens=4, eos_token_id=[]), expected)
    model.generate(ids, max_new_tokens=1)
    zoo.to_hf(model, tmp_path / "hf")
    back = zoo.from_hf(tmp_path / "hf")
    assert torch.equal(back.generate(ids, max_new_tokens=4, eos_token_id=[]), expected)


@pytest.mark.parametrize("rows", [1, 8])
def test_the_serving_engine_sets_the_layout_for_its_batch(tiny, rows):
    pytest.importorskip("fastapi")  # the engine itself needs nothing, but lives beside the server
    from zoo.serving.engine import Engine

    model = tiny("llama-tiny")
    use_decoding_layout(model, rows=9 - rows)  # the other layout first
    Engine(model, None, max_batch=rows)
    assert _layouts(model) == {"column" if rows == 1 else "row"}


def test_lora_layers_decode_the_same_with_their_frozen_matrix_column_major(tiny, prompts):
    model = tiny("llama-tiny")
    zoo.lora.apply(model, r=4, alpha=8.0)
    with torch.no_grad():  # B = 0 at first: give the adapters an effect
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.1)
    ids, _ = prompts(model.spec.vocab_size, [5])
    model.train()
    reference = model.generate(ids, max_new_tokens=6, eos_token_id=[])
    model.eval()
    assert torch.equal(model.generate(ids, max_new_tokens=6, eos_token_id=[]), reference)
    names = _column_major_names(model)
    assert any(".qkv_proj." in n for n in names) and not any("lora_" in n for n in names)
