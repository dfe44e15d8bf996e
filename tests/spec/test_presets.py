"""Every preset builds; presets that mirror a published model have exactly its parameter count."""

from __future__ import annotations

import pytest

import zoo
from zoo.spec import SpecError

PUBLISHED_COUNTS = {
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "bert-base": 109_482_240,
    "t5-small": 60_506_624,
    "t5-base": 222_903_552,
    "bart-base": 139_420_416,
    "bart-large": 406_291_456,
    "opt-125m": 125_239_296,  # OPTForCausalLM on the meta device from facebook/opt-125m's config
    "opt-350m": 331_196_416,
    "ctrl": 1_637_964_550,  # CTRLLMHeadModel from Salesforce/ctrl's config (tied head + its bias)
    # *ForCausalLM on the meta device from the published config.json (meta-llama/Llama-3.2-1B,
    # mistralai/Mistral-7B-v0.1, Qwen/Qwen2-0.5B, Qwen/Qwen3-0.6B)
    "llama-3.2-1b": 1_235_814_400,
    "mistral-7b": 7_241_732_096,
    "qwen2-0.5b": 494_032_768,
    "qwen3-0.6b": 596_049_920,
    # from transformers' model on the meta device, built from facebook/m2m100_418M's config
    # (M2M100ForConditionalGeneration) and google/bigbird-roberta-base's (BigBirdForMaskedLM: no NSP head)
    "m2m100-418m": 483_905_536,
    "bigbird-roberta-base": 128_111_286,
    # transformers' model on the meta device from the published config: FacebookAI/xlm-roberta-base
    # (XLMRobertaForMaskedLM), distilbert/distilbert-base-uncased (DistilBertForMaskedLM),
    # google/electra-base-discriminator (ElectraForPreTraining), google/electra-small-generator
    # (ElectraForMaskedLM), microsoft/mpnet-base (MPNetForMaskedLM), sentence-transformers/all-mpnet-base-v2
    # (MPNetModel, pooler included)
    "xlm-roberta-base": 278_295_186,
    "distilbert-base-uncased": 66_985_530,
    "electra-base-discriminator": 109_483_009,
    "electra-small-generator": 13_546_682,
    "mpnet-base": 109_518_527,
    "all-mpnet-base-v2": 109_486_464,
    # GPTNeoXForCausalLM / Phi3ForCausalLM on the meta device from EleutherAI/pythia-160m's and
    # microsoft/Phi-3-mini-4k-instruct's config.json
    "pythia-160m": 162_322_944,
    "phi-3-mini-4k": 3_821_079_552,
    # *ForCausalLM on the meta device from google/gemma-2b's, google/gemma-2-2b's and google/gemma-3-1b-pt's
    # config.json (tied heads)
    "gemma-2b": 2_506_172_416,
    "gemma-2-2b": 2_614_341_888,
    "gemma-3-1b": 999_885_952,
    # ModernBertForMaskedLM on the meta device from answerdotai/ModernBERT-base's config.json (the body,
    # ModernBertModel, is 149_014_272: + the head's dense and norm and the decoder bias)
    "modernbert-base": 149_655_232,
    # MixtralForCausalLM / Qwen3MoeForCausalLM on the meta device from mistralai/Mixtral-8x7B-v0.1's and
    # Qwen/Qwen3-30B-A3B's config.json
    "mixtral-8x7b": 46_702_792_704,
    "qwen3-30b-a3b": 30_532_122_624,
    # SmolLM3ForCausalLM on the meta device from HuggingFaceTB/SmolLM3-3B's config.json (tied head)
    "smollm3-3b": 3_075_098_624,
    # Olmo2ForCausalLM / Starcoder2ForCausalLM on the meta device from allenai/OLMo-2-0425-1B's,
    # allenai/OLMo-2-1124-7B's and bigcode/starcoder2-3b's config.json (tests/io/test_hf_olmo2_starcoder2.py)
    "olmo-2-1b": 1_484_916_736,
    "olmo-2-7b": 7_298_617_344,
    "starcoder2-3b": 3_030_371_328,
    # transformers' GptOssForCausalLM built on meta from openai/gpt-oss-{20b,120b}'s config.json
    "gpt-oss-20b": 20_914_757_184,
    "gpt-oss-120b": 116_829_156_672,
    # DeepseekV3ForCausalLM on the meta device from DeepseekV3Config() (transformers' defaults are
    # deepseek-ai/DeepSeek-V3's config.json): its 61 layers, without the checkpoint's MTP layer
    "deepseek-v3": 671_026_404_352,
    # Glm4MoeForCausalLM on the meta device from zai-org/GLM-4.5-Air's config.json (tests/io/test_hf_deepseek.py)
    "glm-4.5-air": 106_852_245_504,
    # DeepseekV2ForCausalLM on the meta device from deepseek-ai/DeepSeek-V2-Lite's config.json (the card's
    # 15.7B; tests/io/test_hf_deepseek.py)
    "deepseek-v2-lite": 15_706_484_224,
    # Llama4ForCausalLM on the meta device from meta-llama/Llama-4-Scout-17B-16E's text_config
    # (tests/io/test_hf_llama4.py builds it)
    "llama-4-scout": 107_769_861_120,
    # ViTForImageClassification on the meta device from google/vit-base-patch16-224's config (ViTConfig's
    # defaults, num_labels 1000; tests/io/test_hf_vit.py builds it)
    "vit-base-patch16-224": 86_567_656,
    # WhisperForConditionalGeneration on the meta device from openai/whisper-tiny's and openai/whisper-base's
    # config.json (the encoder's frozen sinusoid table counted, as transformers counts it)
    "whisper-tiny": 37_760_640,
    "whisper-base": 72_593_920,
}
# Parameters one token runs through (router, shared parts and top_k experts): the "12.9B active" of the
# Mixtral paper and the "3.3B activated" of the Qwen3-30B-A3B model card.
# gpt-oss's model card says 3.61B and 5.13B active: the same counts less the 579,133,440 of the embedding table.
ACTIVE_COUNTS = {
    "mixtral-8x7b": 12_879_925_248,
    "qwen3-30b-a3b": 3_353_032_704,
    "gpt-oss-20b": 3_608_307_264 + 201_088 * 2880,
    "gpt-oss-120b": 5_132_849_472 + 201_088 * 2880,
    "deepseek-v3": 37_552_282_624,  # the technical report's "37B activated for each token"
    "llama-4-scout": 17_172_894_720,  # the model card's "17B active parameters"
}
EXPECTED = {
    "transformer-tiny", "transformer-base", "transformer-big", "bert-base", "bert-large", "roberta-base",
    "albert-base", "gpt2", "gpt2-medium", "t5-small", "t5-base", "bart-base", "bart-large", "marian-en-de",
    "llama-3.2-1b", "mistral-7b", "qwen2-0.5b", "qwen3-0.6b", "opt-125m", "opt-350m", "ctrl",
    "m2m100-418m", "bigbird-roberta-base", "pythia-160m", "phi-3-mini-4k", "gemma-2b", "gemma-2-2b", "gemma-3-1b", "gemma-tiny", "modernbert-base", "modernbert-tiny", "mixtral-8x7b", "qwen3-30b-a3b", "moe-tiny",
    "smollm3-3b",
    "olmo-2-1b", "olmo-2-7b", "olmo2-tiny", "starcoder2-3b", "starcoder2-tiny", "cohere2-tiny",
    "gpt-oss-20b", "gpt-oss-120b", "gpt-oss-tiny",
    "deepseek-v3", "deepseek-tiny", "glm-4.5-air", "deepseek-v2-lite", "llama-4-scout", "llama4-tiny",
    "vit-base-patch16-224", "vit-tiny", "whisper-tiny", "whisper-base",
}  # fmt: skip


def test_every_issue_preset_is_listed():
    assert set(zoo.list_presets()) >= EXPECTED


@pytest.mark.parametrize("name", sorted(PUBLISHED_COUNTS))
def test_preset_has_the_published_parameter_count(name):
    assert zoo.build(name, device="meta").num_parameters() == PUBLISHED_COUNTS[name]


@pytest.mark.parametrize("name", sorted(ACTIVE_COUNTS))
def test_moe_preset_has_the_published_active_parameter_count(name):
    from zoo.spec import parameter_count

    assert parameter_count(zoo.preset(name), active=True) == ACTIVE_COUNTS[name]
    card = {
        "mixtral-8x7b": 12.9,
        "qwen3-30b-a3b": 3.4,
        "gpt-oss-20b": 3.61,
        "gpt-oss-120b": 5.13,
        "deepseek-v3": 37.6,
        "llama-4-scout": 17.2,
    }[name]
    embedding = 201_088 * 2880 if name.startswith("gpt-oss") else 0  # gpt-oss's card leaves the table out
    assert round((ACTIVE_COUNTS[name] - embedding) / 1e9, 2 if embedding else 1) == card


@pytest.mark.parametrize("name", zoo.list_presets())
def test_every_preset_builds_on_meta_with_a_source_note(name):
    spec = zoo.preset(name)
    assert spec.source, f"{name} needs a source note"
    model = zoo.build(name, device="meta")
    assert model.spec == spec
    assert model.num_parameters() > 0


def test_transformer_tiny_is_the_course_configuration():
    spec = zoo.preset("transformer-tiny")
    assert (spec.vocab_size, spec.num_layers, spec.ffn.d_ff, spec.d_model, spec.attention.num_heads, spec.dropout) == (
        9000, 4, 512, 128, 4, 0.3,
    )  # fmt: skip


def test_transformer_base_is_the_paper():
    spec = zoo.preset("transformer-base")
    assert spec.family == "encoder-decoder"
    assert (
        spec.norm.placement == "post" and spec.position.kind == "sinusoidal" and spec.ffn.activation == "relu"
    )
    assert spec.embedding.scale and spec.lm_head.tied and spec.dropout == 0.1


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(SpecError, match=r"unknown preset 'gpt5'.*gpt2"):
        zoo.preset("gpt5")


def test_spec_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("family: decoder\nvocab_size: 10\nd_model: 10\nattention: {num_heads: 3}\n")
    with pytest.raises(SpecError, match=r"(?s)bad\.yaml: invalid spec.*num_heads \(3\)"):
        zoo.load_spec(bad)
    with pytest.raises(SpecError, match=r"missing\.yaml: spec file not found"):
        zoo.load_spec(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(SpecError, match="must hold a mapping"):
        zoo.load_spec(tmp_path / "list.yaml")
    (tmp_path / "broken.json").write_text("{family: [")
    with pytest.raises(SpecError, match="not valid YAML/JSON"):
        zoo.load_spec(tmp_path / "broken.json")
