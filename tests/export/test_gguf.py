"""GGUF export read back by transformers' own GGUF reader (``from_pretrained(dir, gguf_file=...)``): the
logits equal zoo's within 1e-4 in float32 for every family written, the tokenizer rebuilt from the file
splits text as zoo's does, smaller types stay close, and what llama.cpp cannot run is refused by name.
llama-cpp-python, where installed, runs the file greedily (slow)."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

import zoo
from zoo.export import ExportError, export_gguf
from zoo.io.tokenizer import Tokenizer, train_tokenizer

pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-4  # float32 through transformers' modelling code

# One tiny model per llama.cpp architecture: (preset, overrides, Hugging Face family written as)
FAMILIES = {
    "llama": ("llama-tiny", {}, None),
    "qwen2": (
        "llama-tiny",
        {"attention.bias": True, "attention.out_bias": False, "lm_head.tied": True},
        None,
    ),
    # transformers' qwen3 reader takes head_dim from Qwen3Config's default (128), so the model has that
    "qwen3": (
        "llama-tiny",
        {"attention.head_dim": 128, "attention.qk_norm": True, "attention.qk_norm_eps": 1e-5},
        None,
    ),
    "phi3": ("llama-tiny", {}, "phi3"),  # a plain model written in Phi-3's fused layout
    # transformers' gemma2/3 readers keep query_pre_attn_scalar's default (256): head_dim 256 scales alike
    "gemma2": ("gemma-tiny", {"attention.head_dim": 256, "attention.scale": 1 / 16}, None),
    "gemma3": (
        "gemma-tiny",
        {
            "num_layers": 6,
            "attention.head_dim": 256,
            "attention.scale": 1 / 16,
            "attention.softcap": None,
            "attention.qk_norm": True,
            "lm_head.softcap": None,
            "position.theta": 1e6,
            "position.local_theta": 1e4,
            "decoder.layer_patterns": [{"kind": "sliding_window", "window": 16}] * 5 + [{"kind": "causal"}],
        },
        None,
    ),
    # transformers' gpt2 reader keeps GPT2Config's n_inner (4 x width) and n_positions (1024)
    "gpt2": ("gpt2-tiny", {"dropout": 0.0, "ffn.d_ff": 256, "max_positions": 1024}, None),
    # transformers' qwen3_moe reader keeps the config's moe_intermediate_size (768)
    "qwen3moe": (
        "moe-tiny",
        {"attention.qk_norm": True, "attention.qk_norm_eps": 1e-5, "ffn.d_ff": 768, "num_layers": 1},
        None,
    ),
}
TEXT = "Hello world, the quick brown fox jumps over 12 lazy dogs."
CORPUS = [TEXT, "the cat sat on the mat", "a rose is a rose is a rose", "numbers 123 456 7890"] * 20


@pytest.fixture(scope="module")
def byte_level() -> Tokenizer:
    """A byte-level BPE tokenizer (GPT-2's split and byte alphabet) whose ids 0-2 are pad, bos, eos."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return Tokenizer(tok, chat_template="{% for m in messages %}{{ m['content'] }}</s>{% endfor %}")


def _model(name: str) -> zoo.ZooModel:
    preset, overrides, _ = FAMILIES[name]
    torch.manual_seed(0)
    model = zoo.build(zoo.preset(preset, **overrides)).eval()
    with torch.no_grad():  # norms away from their initial ones, so a missed 1 + weight or permutation shows
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


def _hf_logits(folder, file: str, ids: torch.Tensor) -> torch.Tensor:
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(ids).logits


@pytest.mark.parametrize("name", list(FAMILIES))
def test_transformers_reads_the_file_with_zoos_logits(name: str, tmp_path, byte_level) -> None:
    model = _model(name)
    written = export_gguf(model, tmp_path / "model.gguf", tokenizer=byte_level, model_type=FAMILIES[name][2])
    assert written.arch == name
    ids = torch.randint(3, model.spec.vocab_size, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids).logits
    got = _hf_logits(tmp_path, "model.gguf", ids)
    print(name, f"{(got - expected).abs().max().item():.2e}")
    torch.testing.assert_close(got, expected, atol=TOLERANCE, rtol=0)


def _tokens_equal(zoo_tok: Tokenizer, folder, file: str) -> None:
    hf = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=file)
    assert hf(TEXT, add_special_tokens=False)["input_ids"] == zoo_tok.encode(TEXT, add_eos=False)


def test_byte_level_tokenizer_and_chat_template_travel(tmp_path, byte_level) -> None:
    export_gguf(_model("llama"), tmp_path / "model.gguf", tokenizer=byte_level)
    _tokens_equal(byte_level, tmp_path, "model.gguf")
    from gguf import GGUFReader

    fields = GGUFReader(tmp_path / "model.gguf").fields
    assert bytes(fields["tokenizer.ggml.model"].parts[-1]).decode() == "gpt2"
    assert bytes(fields["tokenizer.ggml.pre"].parts[-1]).decode() == "gpt-2"
    assert bytes(fields["tokenizer.chat_template"].parts[-1]).decode() == byte_level.chat_template
    assert int(fields["tokenizer.ggml.bos_token_id"].parts[-1][0]) == 1


def test_sentencepiece_style_tokenizer_travels(tmp_path) -> None:
    tok = train_tokenizer(
        iter(CORPUS), kind="bpe", vocab_size=200
    )  # zoo's own: Metaspace "▁", ids 0-4 specials
    export_gguf(_model("llama"), tmp_path / "model.gguf", tokenizer=tok)
    _tokens_equal(tok, tmp_path, "model.gguf")


def test_a_wordpiece_tokenizer_is_refused_by_name(tmp_path) -> None:
    tok = train_tokenizer(iter(CORPUS), kind="wordpiece", vocab_size=200)
    with pytest.raises(ExportError, match="WordPiece tokenizer has no GGUF form"):
        export_gguf(_model("llama"), tmp_path / "model.gguf", tokenizer=tok)
    assert not (tmp_path / "model.gguf").exists()


@pytest.mark.parametrize(("kind", "atol"), [("f16", 5e-3), ("bf16", 5e-2), ("q8_0", 5e-2)])
def test_smaller_types_load_and_stay_close(kind: str, atol: float, tmp_path, byte_level) -> None:
    model = _model("llama")
    written = export_gguf(model, tmp_path / "model.gguf", tokenizer=byte_level, type=kind)
    full = export_gguf(model, tmp_path / "full.gguf", tokenizer=byte_level)
    assert written.bytes < full.bytes
    ids = torch.randint(3, 512, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids).logits
    got = _hf_logits(tmp_path, "model.gguf", ids)
    print(kind, f"{(got - expected).abs().max().item():.2e}")
    torch.testing.assert_close(got, expected, atol=atol, rtol=0)


def test_mixtral_experts_are_stacked_in_llamas_layout(tmp_path) -> None:
    """transformers reads no llama-architecture experts: the tensors are checked against zoo's own."""
    from gguf import GGUFReader

    model = zoo.build("moe-tiny").eval()
    export_gguf(model, tmp_path / "model.gguf")
    tensors = {t.name: t for t in GGUFReader(tmp_path / "model.gguf").tensors}
    up = model.state_dict()["decoder.layers.0.ffn.experts.up_proj.weight"]  # (E, 2F, C): [gate_e; up_e]
    E, F2, C = up.shape
    gate = torch.from_numpy(tensors["blk.0.ffn_gate_exps.weight"].data.copy())
    assert gate.shape == (E, F2 // 2, C)
    torch.testing.assert_close(gate, up.view(E, 2, F2 // 2, C)[:, 0], atol=0, rtol=0)
    assert "blk.0.ffn_gate_inp.weight" in tensors and "output.weight" in tensors


@pytest.mark.parametrize(
    ("preset", "overrides", "match"),
    [
        ("bert-tiny", {}, "llama.cpp runs decoders; this model is an encoder"),
        ("t5-tiny", {}, "this model is an encoder-decoder"),
        ("pythia-tiny", {}, "the gpt_neox family is not written"),
        ("phi3-tiny", {}, "rope_scaling .* rope scaling is not written yet"),
        ("gemma-tiny", {}, "query_pre_attn_scalar 64 differs from head_dim 32"),
        (
            "llama-tiny",
            {"decoder.layer_patterns": [{"kind": "sliding_window", "window": 16}] * 2},
            "sliding_window 16 is shorter than the context",
        ),
    ],
)
def test_what_llama_cpp_cannot_run_is_refused_by_name(preset, overrides, match, tmp_path) -> None:
    model = zoo.build(zoo.preset(preset, **overrides), device="meta")
    with pytest.raises(ExportError, match=match):
        export_gguf(model, tmp_path / "model.gguf")
    assert not (tmp_path / "model.gguf").exists()


def test_cli_converts_a_saved_llama_tiny_that_transformers_loads(tmp_path, byte_level) -> None:
    from zoo.cli import main

    model = _model("llama")
    zoo.save(model, tmp_path / "ck", tokenizer=byte_level)
    out = tmp_path / "out" / "llama.gguf"
    assert main(["convert", "--to-gguf", str(tmp_path / "ck"), "--out", str(out)]) == 0
    ids = torch.randint(3, 512, (1, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = model(ids).logits
    torch.testing.assert_close(_hf_logits(out.parent, out.name, ids), expected, atol=TOLERANCE, rtol=0)
    _tokens_equal(byte_level, out.parent, out.name)
    (tmp_path / "other.gguf").write_text("not a model")
    argv = ["convert", "--to-gguf", str(tmp_path / "ck"), "--out", str(tmp_path / "other.gguf")]
    assert main(argv) != 0  # a file that is not GGUF is not replaced without --overwrite
    assert (tmp_path / "other.gguf").read_text() == "not a model"
    assert main(["convert", "--to-gguf", "bert-tiny", "--out", str(tmp_path / "bert.gguf")]) == 2
    assert not (tmp_path / "bert.gguf").exists()


@pytest.mark.slow
def test_llama_cpp_greedy_tokens_equal_zoos(tmp_path, byte_level) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    model = _model("llama")
    export_gguf(model, tmp_path / "model.gguf", tokenizer=byte_level)
    prompt = [1, *byte_level.encode(TEXT, add_eos=False)]
    llm = llama_cpp.Llama(str(tmp_path / "model.gguf"), n_ctx=128, verbose=False, logits_all=False)
    got = []
    for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        got.append(int(token))
        if len(got) == 16:
            break
    expected = model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)[0, len(prompt) :]
    assert got == expected.tolist()


def test_without_the_gguf_package_the_error_names_the_extra(monkeypatch, tmp_path) -> None:
    import importlib.util

    from zoo.export import GGUFMissingError

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a)
    )
    with pytest.raises(GGUFMissingError, match=r"pip install -e '\.\[gguf\]'"):
        export_gguf(zoo.build("llama-tiny", device="meta"), tmp_path / "model.gguf")
