"""Spec files are read at bounded cost (size, aliases, expanded nodes), and every validation error is
formatted by one formatter: ``dotted.field: problem`` lines, no pydantic links, no input reprs."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

import zoo
from zoo.spec import SpecError, load_spec, parse_spec
from zoo.spec import files as spec_files
from zoo.spec.errors import format_validation_error

HEADER = "family: decoder\nvocab_size: 100\nd_model: 64\nattention: {num_heads: 4}\n"


def alias_bomb(levels: int = 9, width: int = 10, *, key: str = "name") -> str:
    """``width ** levels`` scalars from ``levels * width`` aliases (the "billion laughs")."""
    lines = ["bomb0: &b0 [" + ", ".join(["lol"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"bomb{i}: &b{i} [" + ", ".join([f"*b{i - 1}"] * width) + "]")
    return "\n".join(lines) + f"\n{key}: *b{levels - 1}\n"


def write(tmp_path, text: str, name: str = "spec.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_an_alias_bomb_in_a_spec_file_is_refused_at_once(tmp_path):
    path = write(tmp_path, HEADER + alias_bomb(levels=9, width=10))  # 10**9 scalars from 81 aliases
    start = time.perf_counter()
    with pytest.raises(SpecError, match=r"refused: more than 100,000 values once aliases are expanded"):
        load_spec(path)
    assert time.perf_counter() - start < 1.0


def test_more_than_a_hundred_aliases_are_refused(tmp_path):
    aliases = "\n".join(f"k{i}: *a" for i in range(101))
    with pytest.raises(SpecError, match=r"more than 100 aliases"):
        load_spec(write(tmp_path, HEADER + "a: &a 1\n" + aliases))


def test_a_recursive_alias_is_refused(tmp_path):
    with pytest.raises(SpecError, match="refused: an alias refers to a node that contains it"):
        load_spec(write(tmp_path, HEADER + "name: &a [1, *a]\n"))


def test_a_file_over_the_size_limit_is_refused_without_parsing(tmp_path, monkeypatch):
    monkeypatch.setattr(spec_files, "MAX_FILE_BYTES", 1000)
    path = write(tmp_path, HEADER + "# padding\n" * 200)
    with pytest.raises(SpecError, match=r"refused: larger than"):
        load_spec(path)


def test_the_default_size_limit_is_ten_mebibytes(tmp_path):
    assert spec_files.MAX_FILE_BYTES == 10 * 2**20
    path = write(tmp_path, HEADER + "#" * (10 * 2**20) + "\n")
    with pytest.raises(SpecError, match=r"larger than 10 MiB"):
        load_spec(path)


def test_a_few_aliases_in_a_small_spec_still_load(tmp_path):
    text = HEADER.replace("attention: {num_heads: 4}", "attention: &heads {num_heads: 4}")
    spec = load_spec(write(tmp_path, text + "decoder: {attention: *heads, num_layers: 2}\n"))
    assert spec.stacks()["decoder"].attention.num_heads == 4


def shared_bomb(levels: int = 10, width: int = 10) -> list:
    """A Python list that repeats (shares) itself ``width ** levels`` times when printed."""
    node: list = ["lol"] * width
    for _ in range(levels):
        node = [node] * width
    return node


@pytest.mark.parametrize(
    "data",
    [
        {"family": "decoder", "vocab_size": 100, "name": shared_bomb()},
        {"family": "decoder", "vocab_size": 100, "attention": shared_bomb()},
        {"family": shared_bomb(), "vocab_size": 100},
        {"family": "decoder", "vocab_size": "x" * 10**6},
        {"family": "decoder", "vocab_size": 100, "x" * 10**5: 1},
        {"family": "d" * 10**6, "vocab_size": 100},
    ],
)
def test_validation_errors_never_print_their_input_or_a_link(data):
    start = time.perf_counter()
    with pytest.raises(ValidationError) as error:
        parse_spec(data)
    text, representation = str(error.value), repr(error.value)
    assert time.perf_counter() - start < 1.0
    assert len(text) < 1000 and len(representation) < 1200
    for raw in ("https://", "errors.pydantic.dev", "input_value", "lol", "x" * 100, "d" * 100):
        assert raw not in text
    assert isinstance(error.value, SpecError)  # a ValueError zoo's callers (and its CLI) already report


def test_override_errors_use_the_formatter():
    with pytest.raises(ValidationError) as error:
        zoo.preset("gpt2-tiny").override(num_layers="many")
    text = str(error.value)
    assert "num_layers: Input should be a valid integer" in text
    assert "https://" not in text and "input_value" not in text


def test_format_validation_error_cuts_long_messages_and_lists():
    with pytest.raises(ValidationError) as error:
        parse_spec({"family": "decoder", "vocab_size": 10, **{f"x{i}" * 50: i for i in range(100)}})
    text = format_validation_error(error.value)
    assert "... and 70 more" in text
    assert max(len(line) for line in text.splitlines()) < 400
