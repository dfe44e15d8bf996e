"""Hugging Face interop for BigBird: ``original_full`` exactly, ``block_sparse`` where transformers computes
the same function as zoo's pattern, and the measured nature of the difference where it does not.

Small random BigBird models (every parameter perturbed) are saved with ``save_pretrained`` and imported with
`zoo.from_hf`; zoo models go out with `zoo.to_hf` and back in with ``from_pretrained``. Nothing is downloaded.
The block-sparse facts checked here are spelled out in `zoo.io.hf.bigbird`'s docstring.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import zoo
from zoo.blocks.masks import block_sparse_layout
from zoo.io.hf import bigbird
from zoo.io.hf.faithful import faithful_config
from zoo.spec.patterns import BlockSparsePattern

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

V = 128
BS, R = 4, 1  # block_size, num_random_blocks: transformers attends in full up to (5 + 2R) * BS = 28 tokens
BODY = dict(
    vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
    max_position_embeddings=96, block_size=BS, num_random_blocks=R,
)  # fmt: skip


def hf_model(cls: type = transformers.BigBirdForMaskedLM, **config: object) -> torch.nn.Module:
    """A fresh transformers model (block_sparse switches itself to full for good on a short input)."""
    torch.manual_seed(1)
    model = cls(transformers.BigBirdConfig(**{**BODY, **config}))
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    return model.eval()


def saved(hf: torch.nn.Module, path: Path) -> Path:
    hf.save_pretrained(path)
    return path


def reloaded(cls: type, path: Path) -> torch.nn.Module:
    """transformers' from_pretrained, asserting it found exactly the tensors it needed."""
    model, info = cls.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()


def batch(length: int, lengths: tuple[int, ...] | None = None) -> tuple[torch.Tensor, ...]:
    """Right-padded ids (rows of ``lengths``, default: the full length and 2/3 of it), mask, token types."""
    lengths = lengths or (length, 2 * length // 3)
    g = torch.Generator().manual_seed(2)
    mask = torch.tensor([[1] * n + [0] * (length - n) for n in lengths])
    ids = torch.randint(3, V, (len(lengths), length), generator=g) * mask
    types = (torch.arange(length) >= length // 2).long().expand_as(ids) * mask
    return ids, mask, types


@torch.no_grad()
def both(
    model: zoo.ZooModel, hf: torch.nn.Module, length: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """zoo's and transformers' logits (or last hidden states) on a padded batch, and its mask."""
    ids, mask, types = batch(length)
    ours = model(ids, attention_mask=mask, token_type_ids=types)
    theirs = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
    if ours.logits is not None:
        return ours.logits, theirs.logits, mask
    return ours.last_hidden_state, theirs.last_hidden_state, mask


def assert_same(model: zoo.ZooModel, hf: torch.nn.Module, length: int) -> None:
    ours, theirs, mask = both(model, hf, length)
    real = mask.bool()
    assert theirs[real].abs().max() > 1e-2  # a real signal
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-4, rtol=1e-4)


# -- original_full: BERT's attention, exactly ----------------------------------------------------------------


def test_original_full_mlm_logits_match_transformers_and_survive_export(tmp_path) -> None:
    hf = hf_model(attention_type="original_full")
    model = zoo.from_hf(saved(hf, tmp_path / "hf"))
    spec = model.spec
    assert spec.encoder.pattern is None and spec.heads.pooler and spec.heads.mlm.activation == "gelu_tanh"
    assert_same(model, hf, 10)
    zoo.to_hf(model, tmp_path / "out", model_type="big_bird")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["model_type"], config["architectures"], config["attention_type"]) == (
        "big_bird", ["BigBirdForMaskedLM"], "original_full",
    )  # fmt: skip
    assert_same(model, reloaded(transformers.BigBirdForMaskedLM, tmp_path / "out"), 10)


def test_headless_model_with_bigbird_options_matches_with_pooler(tmp_path) -> None:
    """use_bias: false (no q/k/v biases; the output dense keeps one) and rescale_embeddings: true."""
    hf = hf_model(
        transformers.BigBirdModel, attention_type="original_full", use_bias=False, rescale_embeddings=True
    )
    model = zoo.from_hf(saved(hf, tmp_path / "hf"))
    attention = model.spec.attention
    assert (attention.bias, attention.has_out_bias, model.spec.embedding.scale) == (False, True, True)
    assert_same(model, hf, 9)
    ids, mask, types = batch(9)
    with torch.no_grad():
        pooled = model(ids, attention_mask=mask, token_type_ids=types).pooler_output
        torch.testing.assert_close(pooled, hf(ids, attention_mask=mask, token_type_ids=types).pooler_output)
    zoo.to_hf(model, tmp_path / "out", model_type="big_bird")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["use_bias"], config["rescale_embeddings"]) == (False, True)
    assert_same(model, reloaded(transformers.BigBirdModel, tmp_path / "out"), 9)


def test_pretraining_checkpoint_imports_without_its_next_sentence_head(tmp_path) -> None:
    hf = hf_model(transformers.BigBirdForPreTraining, attention_type="original_full")
    model = zoo.from_hf(saved(hf, tmp_path))
    assert model.spec.heads.pooler and model.spec.heads.mlm is not None
    ids, mask, types = batch(8)
    with torch.no_grad():
        ours = model(ids, attention_mask=mask, token_type_ids=types).logits
        theirs = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).prediction_logits
    torch.testing.assert_close(ours[mask.bool()], theirs[mask.bool()], atol=1e-4, rtol=1e-4)


# -- block_sparse --------------------------------------------------------------------------------------------


def test_block_sparse_config_becomes_the_bigbird_pattern(tmp_path) -> None:
    spec = zoo.from_hf(saved(hf_model(), tmp_path)).spec
    assert spec.encoder.pattern == BlockSparsePattern(
        block_size=BS, window_blocks=3, global_blocks=1, random_blocks=R, seed=0
    )


@pytest.mark.parametrize(
    ("length", "equal"),
    [
        (3 * BS, True),  # 3 blocks: zoo's pattern covers every block
        ((4 + R) * BS, True),  # the longest where window + globals + R random blocks cover every block
        ((4 + R) * BS + 1, False),  # zoo is sparse now; transformers attends in full up to (5 + 2R) * BS
    ],
)
def test_block_sparse_short_inputs_equal_transformers_where_both_attend_everywhere(tmp_path, length, equal):
    hf = hf_model()
    model = zoo.from_hf(saved(hf, tmp_path))
    ours, theirs, mask = both(model, hf, length)
    assert hf.bert.attention_type == "original_full"  # transformers switched itself to full, for good
    real = mask.bool()
    if equal:
        torch.testing.assert_close(ours[real], theirs[real], atol=1e-4, rtol=1e-4)
    else:
        assert (ours[real] - theirs[real]).abs().max() > 1e-3


def first_block_weighted_bias(mask: torch.Tensor, *, block_size: int, random_blocks: int) -> torch.Tensor:
    """(B, 1, T, T) additive mask of transformers' eval-mode block-sparse attention, written densely.

    Query blocks 0 and N - 1 see every key. Any other block sees its 3-block window and blocks 0 and N - 1,
    plus ``random_blocks`` "random" blocks that are all block 0 (``rand_attn`` is zeros when not training):
    block 0's keys enter its softmax 1 + random_blocks times, i.e. their logits gain log(1 + random_blocks).
    """
    T = mask.shape[1]
    last = T // block_size - 1
    q, k = (torch.arange(T) // block_size)[:, None], (torch.arange(T) // block_size)[None, :]
    global_query = (q == 0) | (q == last)
    seen = global_query | (k == 0) | (k == last) | ((q - k).abs() <= 1)
    bias = torch.zeros(T, T).masked_fill(~seen, float("-inf"))
    bias = bias + torch.where(~global_query & (k == 0), math.log(1 + random_blocks), 0.0)
    return bias + torch.zeros(mask.shape).masked_fill(mask == 0, float("-inf"))[:, None, None]


@torch.no_grad()
def test_eval_block_sparse_attention_counts_block_0_once_per_random_block(tmp_path) -> None:
    """transformers' eval-mode block-sparse attention is zoo's attention module under the window + global
    pattern with block 0 weighted 1 + r: not a boolean mask, and not zoo's pattern (which draws its r
    random blocks), so the two differ on every non-global query block and agree on the global ones."""
    r, T = 2, 48  # 12 blocks: block_sparse runs beyond (5 + 2r) * BS = 36 tokens
    hf = hf_model(transformers.BigBirdModel, num_hidden_layers=1, num_random_blocks=r)
    model = zoo.from_hf(saved(hf, tmp_path))
    mask = torch.tensor([[1] * T, [1] * 29 + [0] * (T - 29)])
    hidden = torch.randn(2, T, 32, generator=torch.Generator().manual_seed(3))
    blocked, band, from_mask, to_mask = hf.create_masks_for_block_sparse_attn(mask, BS)
    attention = hf.encoder.layer[0].attention
    context, _ = attention.self(hidden, band.float(), from_mask.float(), to_mask.float(), blocked, blocked)
    theirs = attention.output.dense(context)  # (B, T, C), before the residual and LayerNorm
    self_attn = model.encoder.layers[0].self_attn
    weighted, _ = self_attn(hidden, mask=first_block_weighted_bias(mask, block_size=BS, random_blocks=r))
    real = mask.bool()
    torch.testing.assert_close(weighted[real], theirs[real], atol=1e-5, rtol=1e-5)

    layout = block_sparse_layout(model.spec.encoder.pattern, num_blocks=T // BS, layer=0)  # zoo's, layer 0
    blocks = torch.arange(T) // BS
    pattern = layout[blocks[:, None], blocks[None, :]] & real[:, None, None, :]  # (B, 1, T, T)
    ours, _ = self_attn(hidden, mask=pattern)
    is_global = (blocks == 0) | (blocks == T // BS - 1)  # (T,)
    torch.testing.assert_close(
        ours[:, is_global][real[:, is_global]], theirs[:, is_global][real[:, is_global]]
    )
    middle = ~is_global & real  # (B, T)
    assert ((ours - theirs).abs().amax(-1)[middle] > 1e-3).all()


def test_long_input_one_layer_model_agrees_on_global_blocks_only(tmp_path) -> None:
    hf = hf_model(num_hidden_layers=1)
    model = zoo.from_hf(saved(hf, tmp_path))
    T = 10 * BS  # beyond (5 + 2R) * BS: transformers runs its block-sparse path
    ours, theirs, mask = both(model, hf, T)
    assert hf.bert.attention_type == "block_sparse"
    blocks = torch.arange(T) // BS
    is_global = ((blocks == 0) | (blocks == T // BS - 1))[None] & mask.bool()  # (B, T)
    middle = ~is_global & mask.bool()
    torch.testing.assert_close(ours[is_global], theirs[is_global], atol=1e-4, rtol=1e-4)
    assert (ours[middle] - theirs[middle]).abs().max() > 1e-3


def test_block_sparse_export_writes_the_pattern_and_loads_with_same_logits(tmp_path) -> None:
    spec = zoo.preset("bigbird-roberta-base").override(
        vocab_size=V, d_model=32, num_layers=2, max_positions=96, attention={"num_heads": 4},
        ffn={"d_ff": 48}, encoder={"pattern": {"block_size": BS, "random_blocks": 2, "seed": 7}},
    )  # fmt: skip
    model = zoo.build(spec)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    zoo.to_hf(model.eval(), tmp_path, model_type="big_bird")
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["attention_type"], config["block_size"], config["num_random_blocks"]) == (
        "block_sparse", BS, 2,
    )  # fmt: skip
    hf = reloaded(transformers.BigBirdForMaskedLM, tmp_path)
    assert_same(model.eval(), hf, (4 + 2) * BS)  # both attend everywhere at this length
    assert zoo.from_hf(tmp_path).spec.encoder.pattern == spec.encoder.pattern.model_copy(update={"seed": 0})


# -- presets and refusals ------------------------------------------------------------------------------------


def test_preset_has_the_published_shape_and_parameter_count() -> None:
    """google/bigbird-roberta-base's config.json is transformers' BigBirdConfig defaults."""
    with torch.device("meta"):
        hf = transformers.BigBirdForMaskedLM(transformers.BigBirdConfig())
    spec = zoo.preset("bigbird-roberta-base")
    assert zoo.build(spec, device="meta").num_parameters() == hf.num_parameters() == 128_111_286
    mapping = bigbird.MAPPING
    names = set(mapping.zoo_to_hf(zoo.build(spec, device="meta", init=False).state_dict(), spec))
    assert names == {n for n in hf.state_dict() if not n.startswith("cls.predictions.decoder")}
    back = mapping.config_to_spec(mapping.spec_to_config(spec), names)
    unsaid = {"source": True, "name": True}
    assert back.model_dump(exclude=unsaid) == spec.model_dump(exclude=unsaid)


SPARSE = {"kind": "block_sparse", "block_size": 64}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"encoder.pattern": SPARSE | {"window_blocks": 5}}, r"encoder\.pattern\.window_blocks=5"),
        ({"encoder.pattern": SPARSE | {"global_blocks": 2}}, r"encoder\.pattern\.global_blocks=2"),
        (
            {"encoder.pattern": {"kind": "sliding_window", "window": 8}},
            r"encoder\.pattern\.kind='sliding_window'",
        ),
        ({"encoder.layer_patterns": [{"kind": "full"}] * 12}, r"encoder\.layer_patterns"),
        ({"attention.out_bias": False}, r"attention\.out_bias=False"),
        ({"norm.placement": "pre"}, r"norm\.placement='pre'"),
        ({"heads": {"mlm": None, "num_labels": 3}}, r"heads\.classifier"),
    ],
)
def test_to_hf_names_the_spec_field_big_bird_cannot_express(change, message) -> None:
    spec = zoo.preset("bigbird-roberta-base").override(**{"encoder.pattern": None}).override(**change)
    with pytest.raises(ValueError, match=rf"big_bird cannot express {message}"):
        faithful_config(bigbird.MAPPING, spec)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"attention_type": "sparse"}, r"attention_type='sparse' is not supported"),
        (
            {"architectures": ["BigBirdForQuestionAnswering"]},
            r"architectures=\['BigBirdForQuestionAnswering'\]",
        ),
        ({"is_decoder": True}, r"is_decoder=True is not supported"),
    ],
)
def test_configs_zoo_cannot_read_are_refused(config, message) -> None:
    with pytest.raises(ValueError, match=message):
        bigbird.MAPPING.config_to_spec({**BODY, "model_type": "big_bird", **config}, set())
