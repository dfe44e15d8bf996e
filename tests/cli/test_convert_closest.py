"""`zoo convert --to-hf` of a spec no Hugging Face family can express: one line naming the closest family
and its first reason; every family's reason with ``--verbose``."""

from __future__ import annotations

from pathlib import Path

import pytest

import zoo
from zoo.cli import main
from zoo.io.hf import NoFamilyError, family_mappings
from zoo.io.hf.common import HFError, require

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def custom(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A zoo checkpoint of examples/my_stack.yaml: rotary, RMSNorm, SwiGLU, GQA in an encoder-decoder."""
    directory = tmp_path_factory.mktemp("custom") / "my-stack"
    zoo.save(zoo.build(ROOT / "examples" / "my_stack.yaml"), directory)
    return directory


def test_the_refusal_is_one_short_line_naming_the_closest_family(
    custom: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["convert", "--to-hf", str(custom), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and len(err) < 400, err
    assert "closest: t5 cannot express position.kind='rotary'" in err  # the one encoder-decoder family
    assert "--verbose" in err and "gpt2" not in err  # the other families are left to --verbose
    assert not (tmp_path / "hf").exists()


def test_verbose_lists_every_family_closest_first(
    custom: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["convert", "--to-hf", str(custom), "--out", str(tmp_path / "hf"), "--verbose"]) == 2
    err = capsys.readouterr().err.splitlines()
    families = [line.split(":")[0].strip() for line in err if not line.startswith("error:")]
    assert sorted(families) == sorted("/".join(m.model_types) for m in family_mappings())
    assert families[0] == "t5" and err[-1].startswith("error: no Hugging Face family")


def test_families_of_another_model_kind_rank_last_and_fewer_fields_rank_first() -> None:
    spec = zoo.preset("gpt2-tiny").override(**{"norm.kind": "rmsnorm"})
    with pytest.raises(NoFamilyError) as caught:
        zoo.to_hf(zoo.build(spec, device="meta", init=False), "unused")
    ranked = [family for family, _ in caught.value.reasons]
    assert ranked[0] == "gpt2"  # one field away (norm.kind)
    decoders = {
        "gpt2",
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "opt",
        "ctrl",
        "gemma",
        "gemma2",
        "gemma3_text",
        "gpt_neox",
        "phi3",
        "olmo2",
        "starcoder2",
        "smollm3",
        "cohere2",
    }
    assert set(ranked[: len(decoders)]) == decoders  # every decoder family before any encoder one
    assert caught.value.summary.startswith("no Hugging Face family can express this spec; closest: gpt2 ")


def test_require_names_the_first_field_and_counts_every_other() -> None:
    with pytest.raises(HFError) as caught:
        require("fam", [("a", 1, 2), ("b", 3, 3), ("c", 4, (5, 6)), ("c", 4, 7), ("d", 0, 1)])
    assert caught.value.fields == ("a", "c", "d")  # a field checked twice counts once
    assert str(caught.value) == "fam cannot express a=1: Hugging Face fam needs 2 (and 2 more: c, d)"
