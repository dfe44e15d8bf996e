"""GGUF export read back by transformers' own GGUF reader (``from_pretrained(dir, gguf_file=...)``): the
logits equal zoo's within 1e-4 in float32 for every family written, the tokenizer rebuilt from the file
splits text as zoo's does, smaller types stay close, and what llama.cpp cannot run is refused by name.
llama-cpp-python, where installed, runs the file greedily (slow)."""

from __future__ import annotations

import numpy as np
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
            "sliding_window 16 is shorter than the context .*; export a spec with max_positions <= 16",
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


# Llama 3.2 1B's settings (rope theta 5e5, llama3 scaling factor 32 / low 1 / high 4 / original 8192, tied
# head), narrowed: head_dim 32 puts a rate in each of llama3's three bands (kept, blended, slowed).
LLAMA32 = {
    "d_model": 128,
    "num_layers": 2,
    "vocab_size": 512,
    "max_positions": 1024,
    "attention.num_heads": 4,
    "attention.num_kv_heads": 2,
    "ffn.d_ff": 256,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
ROPE_MODELS = {  # (preset, overrides)
    "llama3": ("llama-3.2-1b", LLAMA32),
    "linear": ("llama-tiny", {"position.scaling": {"type": "linear", "factor": 4.0}}),
    "linear-qwen3": (
        "llama-tiny",
        {**FAMILIES["qwen3"][1], "position.scaling": {"type": "linear", "factor": 4.0}},
    ),
    # Gemma 3 scales its global layers only (llama.cpp's sliding ones keep freq_scale 1, as zoo's local table)
    "linear-gemma3": (
        "gemma-tiny",
        {**FAMILIES["gemma3"][1], "position.scaling": {"type": "linear", "factor": 8.0}},
    ),
}


def _rope_model(name: str) -> zoo.ZooModel:
    preset, overrides = ROPE_MODELS[name]
    torch.manual_seed(0)
    model = zoo.build(zoo.preset(preset, **overrides)).eval()
    with torch.no_grad():  # sharper attention, so positions (and their rotary rates) show in the logits
        for name_, p in model.named_parameters():
            if "qkv_proj" in name_:
                p.mul_(4.0)
    return model


def _field(fields, key: str):
    """A scalar GGUF metadata value (a string decoded), or None where the file has no such key."""
    if key not in fields:
        return None
    part = fields[key].parts[-1]
    return bytes(part).decode() if fields[key].types[0].name == "STRING" else part[0].item()


def _llama_cpp_rates(path) -> tuple[np.ndarray, dict]:
    """The rotary rates llama.cpp runs a file with, from the file alone: ggml's rope takes rate i as
    freq_base^(-2i/n_rot), times freq_scale (1 / rope.scaling.factor, linear scaling) and divided by
    ``rope_freqs[i]`` (its freq_factors: theta / ff) where the file has that tensor."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    arch = _field(reader.fields, "general.architecture")
    fields = {k.removeprefix(f"{arch}."): v for k, v in reader.fields.items()}
    base, dims = float(_field(fields, "rope.freq_base")), int(_field(fields, "rope.dimension_count"))
    rates = base ** (-np.arange(0, dims, 2, dtype=np.float64) / dims)  # (dims/2,)
    if _field(fields, "rope.scaling.type") == "linear":
        rates = rates / float(_field(fields, "rope.scaling.factor"))
    tensors = {t.name: t for t in reader.tensors}
    if "rope_freqs.weight" in tensors:
        freqs = tensors["rope_freqs.weight"]
        assert freqs.tensor_type.name == "F32" and freqs.data.shape == (dims // 2,)
        rates = rates / freqs.data.astype(np.float64)
    return rates, {"arch": arch, "tensors": tensors, "fields": fields}


@pytest.mark.parametrize("name", list(ROPE_MODELS))
def test_rope_scaling_in_the_file_gives_zoos_rates_as_llama_cpp_applies_it(name: str, tmp_path) -> None:
    from zoo.blocks.position import rotary_frequencies

    model = _rope_model(name)
    export_gguf(model, tmp_path / "model.gguf", type="q8_0")  # the factors stay f32 whatever the type
    rates, file = _llama_cpp_rates(tmp_path / "model.gguf")
    position = model.spec.position
    expected = rotary_frequencies(
        position.theta, model.spec.attention.resolved_head_dim(model.spec.d_model), position.scaling
    )
    torch.testing.assert_close(torch.from_numpy(rates).float(), expected, rtol=1e-6, atol=0)
    if name == "llama3":  # Llama 3 is factors only (no scaling keys), in all three bands, and a tied head
        factors = file["tensors"]["rope_freqs.weight"].data
        assert factors[0] == 1.0 and factors[-1] == 32.0 and ((factors > 1) & (factors < 32)).any()
        assert "rope.scaling.type" not in file["fields"] and "output.weight" not in file["tensors"]
    else:
        assert "rope_freqs.weight" not in file["tensors"]


@pytest.mark.parametrize("name", ["llama3", "linear"])
def test_rope_scaled_file_runs_zoos_model_with_llama_cpps_rates(name: str, tmp_path) -> None:
    """transformers' GGUF reader builds plain RoPE from these files (it reads neither rope_freqs.weight nor
    llama's rope.scaling keys): with llama.cpp's rates put in its place the logits are zoo's, without them
    they are not, so the check can fail."""
    model = _rope_model(name)
    export_gguf(model, tmp_path / "model.gguf")
    rates, _ = _llama_cpp_rates(tmp_path / "model.gguf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file="model.gguf", dtype=torch.float32
    ).eval()
    ids = torch.randint(3, model.spec.vocab_size, (1, 128), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids).logits
        plain = hf(ids).logits
        hf.model.rotary_emb.inv_freq = torch.from_numpy(rates).float()
        got = hf(ids).logits
    print(
        name,
        f"{(got - expected).abs().max().item():.2e}",
        f"plain {(plain - expected).abs().max().item():.2e}",
    )
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert (plain - expected).abs().max() > 1e-3


def test_llama_3_2_1b_is_written_and_llama3_elsewhere_refused(tmp_path) -> None:
    from zoo.export.gguf import llama_cpp_arch
    from zoo.io.hf import hf_config

    assert llama_cpp_arch(hf_config(zoo.preset("llama-3.2-1b"))).name == "llama"  # the real size's config
    qwen2 = {**FAMILIES["qwen2"][1], "position.scaling": {"type": "llama3"}}
    with pytest.raises(ExportError, match=r"rope_scaling 'llama3' .* only llama.cpp's llama reads"):
        export_gguf(zoo.build(zoo.preset("llama-tiny", **qwen2), device="meta"), tmp_path / "model.gguf")


# A Llama 3-style tokenizer: byte-level BPE split by Llama 3's regex, its special tokens after the
# vocabulary, <|begin_of_text|> put first by its post-processor, <|eot_id|> the end of a turn (the Instruct
# models' eos), no pad token, and a Llama 3-style chat template.
LLAMA3_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


@pytest.fixture(scope="module")
def llama3_tokenizer() -> Tokenizer:
    from tokenizers import Regex, processors

    from zoo.export.gguf.vocab import _LLAMA3_SPLIT

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_special_tokens(LLAMA3_SPECIALS)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)]
    )
    return Tokenizer(
        tok,
        special_tokens={"bos": "<|begin_of_text|>", "eos": "<|eot_id|>"},
        chat_template=LLAMA3_TEMPLATE,
    )


def test_llama_3_2_checkpoint_converts_with_its_tokenizer_and_chat_template(
    tmp_path, llama3_tokenizer
) -> None:
    """zoo convert --to-gguf on a saved Llama-3.2-shaped model with a Llama 3-style tokenizer: transformers
    rebuilds the tokenizer from the file with the same ids (special tokens, bos first), the same bos / eos /
    no pad, and the same chat template rendering the same ids."""
    from gguf import GGUFReader

    from zoo.cli import main

    tok = llama3_tokenizer
    bos, eos = tok.token_to_id("<|begin_of_text|>"), tok.token_to_id("<|eot_id|>")
    torch.manual_seed(0)
    model = zoo.build(zoo.preset("llama-3.2-1b", **{**LLAMA32, "bos_token_id": bos, "eos_token_id": eos}))
    zoo.save(model.eval(), tmp_path / "ck", tokenizer=tok)
    out = tmp_path / "llama-3.2.gguf"
    assert main(["convert", "--to-gguf", str(tmp_path / "ck"), "--out", str(out)]) == 0
    fields = GGUFReader(out).fields
    assert _field(fields, "tokenizer.ggml.pre") == "llama-bpe"
    assert (_field(fields, "tokenizer.ggml.bos_token_id"), _field(fields, "tokenizer.ggml.eos_token_id")) == (
        bos,
        eos,
    )
    assert "tokenizer.ggml.padding_token_id" not in fields
    assert _field(fields, "tokenizer.ggml.add_bos_token") is True
    assert _field(fields, "tokenizer.ggml.add_eos_token") is False
    assert _field(fields, "tokenizer.chat_template") == LLAMA3_TEMPLATE

    hf = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=out.name)
    assert (hf.bos_token, hf.eos_token, hf.pad_token) == ("<|begin_of_text|>", "<|eot_id|>", None)
    text = f"<|start_header_id|>user<|end_header_id|>\n\n{TEXT}<|eot_id|>"
    expected = tok(text)["input_ids"]
    assert expected[0] == bos and expected[-1] == eos and len(expected) > 10
    assert hf(text)["input_ids"] == expected
    chat = [{"role": "user", "content": TEXT}, {"role": "assistant", "content": "the cat sat"}]
    ids = tok.apply_chat_template(chat, add_generation_prompt=True)
    assert hf.apply_chat_template(chat, add_generation_prompt=True, return_dict=False) == ids
    assert ids.count(eos) == 2 and ids[0] == bos


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
