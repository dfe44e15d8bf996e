"""Property tests: any valid spec of each family builds and runs a forward pass; any invalid spec raises the
spec's validation error (pydantic's ValidationError), never another exception."""

from __future__ import annotations

import contextlib

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import zoo
from zoo.spec import parse_spec

FAMILIES = ("encoder", "decoder", "encoder-decoder")
POSITIONS = (
    {"kind": "sinusoidal", "layout": "interleaved"},
    {"kind": "sinusoidal", "layout": "half"},
    {"kind": "learned", "offset": 2},
    {"kind": "rotary", "theta": 10000.0},
    {"kind": "relative_bias", "num_buckets": 8, "max_distance": 16},
    {"kind": "alibi"},
    {"kind": "none"},
)


@st.composite
def valid_specs(draw: st.DrawFn) -> dict:
    family = draw(st.sampled_from(FAMILIES))
    kv_heads = draw(st.sampled_from([1, 2]))
    num_heads = kv_heads * draw(st.sampled_from([1, 2]))
    head_dim = draw(st.sampled_from([4, 8]))
    spec = {
        "family": family,
        "vocab_size": draw(st.integers(8, 64)),
        "d_model": num_heads * head_dim,
        "num_layers": draw(st.integers(1, 2)),
        "max_positions": 32,
        "attention": {
            "num_heads": num_heads,
            "num_kv_heads": kv_heads,
            "bias": draw(st.booleans()),
            "scaled": draw(st.booleans()),
            "qk_norm": draw(st.booleans()),
        },
        "ffn": {
            "d_ff": draw(st.sampled_from([8, 16])),
            "activation": draw(st.sampled_from(["relu", "gelu", "gelu_tanh", "silu"])),
            "gated": draw(st.booleans()),
            "bias": draw(st.booleans()),
        },
        "norm": {
            "kind": draw(st.sampled_from(["layernorm", "rmsnorm"])),
            "placement": draw(st.sampled_from(["pre", "post"])),
        },
        "position": draw(st.sampled_from(POSITIONS)),
        "embedding": {"scale": draw(st.booleans()), "norm": draw(st.booleans())},
        "dropout": 0.0,
    }
    if family == "encoder":
        spec["embedding"]["segment_vocab_size"] = draw(st.integers(0, 2))
        spec["heads"] = {
            "pooler": draw(st.booleans()),
            "mlm": draw(st.sampled_from([None, {"activation": "gelu"}])),
        }
        spec["encoder"] = {"share_layers": draw(st.booleans())}
    else:
        spec["lm_head"] = {"tied": draw(st.booleans())}
    if family == "encoder-decoder":
        spec["decoder"] = {"num_layers": draw(st.integers(1, 2))}
    return spec


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_specs())
def test_any_valid_spec_builds_and_runs_a_forward_pass(data):
    model = zoo.build(parse_spec(data)).eval()
    ids = torch.randint(0, data["vocab_size"], (2, 5))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    if data["family"] == "encoder-decoder":
        out = model(ids, attention_mask=mask, decoder_input_ids=ids[:, :4])
    else:
        out = model(ids, attention_mask=mask)
    result = out.logits if out.logits is not None else out.last_hidden_state
    assert torch.isfinite(result).all()


INVALID_CHANGES = [
    ("d_model", 30),  # not divisible by the heads (unless head_dim was set)
    ("vocab_size", 0),
    ("num_layers", -1),
    ("dropout", 1.5),
    ("max_positions", 0),
    ("attention.num_heads", 0),
    ("attention.num_kv_heads", 3),
    ("attention.head_dim", -8),
    ("ffn.activation", "tanh"),
    ("ffn.d_ff", "wide"),
    ("norm.kind", "batchnorm"),
    ("norm.eps", -1.0),
    ("position.kind", "spiral"),
    ("position", {"kind": "rotary", "theta": -1.0}),
    ("family", "mixer"),
    ("unknown_field", 1),
    ("attention.unknown", True),
    ("pad_token_id", 10_000),
]


@st.composite
def invalid_specs(draw: st.DrawFn) -> dict:
    data = draw(valid_specs())
    key, value = draw(st.sampled_from(INVALID_CHANGES))
    if key == "d_model":
        data["attention"]["num_heads"] = 4
        data["attention"]["num_kv_heads"] = 2
    *parents, leaf = key.split(".")
    node = data
    for part in parents:
        node = node[part]
    node[leaf] = value
    return data


@settings(max_examples=60, deadline=None)
@given(invalid_specs())
def test_any_invalid_spec_raises_the_validation_error(data):
    try:
        parse_spec(data)
    except ValidationError:
        return
    raise AssertionError(f"accepted an invalid spec: {data}")


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(["family", "vocab_size", "d_model", "attention", "ffn", "position"]),
                       st.one_of(st.none(), st.integers(-3, 3), st.text(max_size=3), st.lists(st.integers(), max_size=2),
                                 st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))))  # fmt: skip
def test_garbage_never_raises_anything_but_validation_error(data):
    with contextlib.suppress(ValidationError):  # anything else propagates and fails the test
        parse_spec(data)
