"""The weight layout single-row CPU decoding uses (`zoo.generation.weight_layout`): the wide matrices
column-major for one or two float32 rows a step, every matrix row-major otherwise; the same tokens either
way; training and saving see contiguous weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import zoo
from zoo.generation import stream
from zoo.generation.weight_layout import (
    COPY_BYTES,
    is_column_major,
    row_major,
    use_decoding_layout,
    wants_column_major,
)


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


# One run per entry point that decodes single rows (each with its own freshly loaded model), in a fresh
# process whose allocator gives freed memory back (as bench/memory.py runs): the peak of the resident set
# over the loaded model, reset through /proc/self/clear_refs before the call.
_ENTRY_POINTS = r"""
import json, sys
from pathlib import Path

import torch

import zoo
from chat_support import chat_tokenizer
from zoo.evaluation.generating import generate_until
from zoo.generation import ChatSession
from zoo.generation.weight_layout import is_column_major, row_major
from zoo.serving.engine import Engine

def kib(key):
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith(key + ":"))
    return int(line.split()[1])

folder, tokenizer = Path(sys.argv[1]), chat_tokenizer()
torch.manual_seed(0)
spec = zoo.preset("llama-tiny").override(vocab_size=32768, d_model=512, num_layers=1, lm_head={"tied": True},
                                         attention={"num_heads": 8, "num_kv_heads": 8})
zoo.save(zoo.build(spec), folder)
calls = {
    "generate": lambda m: m.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=2),
    "zoo chat": lambda m: "".join(ChatSession(m, tokenizer, max_new_tokens=2, eos_token_id=[]).reply("hi")),
    "zoo serve --max-batch 1": lambda m: Engine(m, None, max_batch=1),
    "lm-eval generate_until": lambda m: generate_until(
        m, tokenizer, [[5, 6, 7]], stops=[], max_new_tokens=2, eos_id=None, pad_id=0, settings={}),
    "row_major": lambda m: row_major(m),
}
peaks = {}
for name, call in calls.items():
    model = zoo.load(folder)  # float32, memory-mapped from the file
    with torch.no_grad():
        for p in model.parameters():
            p.sum()  # resident, as after any call
    if name == "row_major":
        with torch.no_grad():
            model.generate(torch.tensor([[5]]), max_new_tokens=1)
    table = model.embed.tokens.weight
    expected = table.detach().clone()
    loaded = kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    with torch.inference_mode():
        call(model)
    peaks[name] = (kib("VmHWM") - loaded) / 1024
    assert is_column_major(table) == (name != "row_major") and torch.equal(table, expected), name
    del model, table
print(json.dumps(peaks))
"""


@pytest.mark.skipif(
    not Path("/proc/self/clear_refs").exists(), reason="Linux: the resident set's high-water mark"
)
def test_single_row_decoding_never_holds_a_second_copy_of_a_weight(tmp_path):
    """`generate`, `zoo chat`'s session, the serving engine at --max-batch 1, lm-eval's generate_until and
    `row_major` convert a float32 model memory-mapped from its checkpoint, whose tied 32768 x 512 table is
    64 MiB: a plain copy (``W.t().contiguous()``) would hold a second one, and, for a memory-mapped file,
    keep the file's pages resident beside it. None may peak more than half the table over the model."""
    pytest.importorskip("fastapi")  # the engine lives beside the server
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "MALLOC_MMAP_THRESHOLD_": "65536",
        "PYTHONPATH": f"{root}{os.pathsep}{root / 'tests'}",
    }
    result = subprocess.run(
        [sys.executable, "-c", _ENTRY_POINTS, str(tmp_path / "model")],
        capture_output=True, text=True, env=env, cwd=root, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    peaks = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(peaks) == 5
    assert all(peak < 32 for peak in peaks.values()), f"MiB over the loaded model: {peaks}"


def test_a_matrix_shared_with_another_tensor_is_never_released_and_a_large_one_stays():
    """A ``state_dict()`` kept by the caller refers to the weights: releasing their pages would wipe it. Such a
    matrix is converted by a plain copy when small; over `COPY_BYTES` it stays as it is (a copy would be a
    second one held for as long as the caller keeps theirs); `row_major` always converts (saving needs it)."""
    spec = zoo.preset("llama-tiny").override(vocab_size=COPY_BYTES // (4 * 64) + 1, lm_head={"tied": True})
    model = zoo.build(spec).eval()
    kept = model.state_dict()
    before = {name: tensor.clone() for name, tensor in kept.items()}
    use_decoding_layout(model, rows=1)
    table, qkv = "embed.tokens.weight", "decoder.layers.0.self_attn.qkv_proj.weight"
    assert not is_column_major(model.get_parameter(table)) and is_column_major(model.get_parameter(qkv))
    assert all(torch.equal(kept[name], before[name]) for name in kept)
    kept_qkv = model.get_parameter(qkv).detach()  # a view of the column-major matrix
    row_major(model)
    assert model.get_parameter(qkv).is_contiguous() and torch.equal(kept_qkv, before[qkv])
