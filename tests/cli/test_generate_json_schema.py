"""``zoo generate --json-schema FILE``: the printed text is JSON the schema validates."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

import zoo
from tests.grammar_support import PERSON, decoder_for, metaspace_tokenizer
from zoo.cli import main


def test_generate_prints_json_the_schema_validates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokenizer = metaspace_tokenizer()
    zoo.save(decoder_for(tokenizer), tmp_path / "ckpt", tokenizer=tokenizer)
    (tmp_path / "person.json").write_text(json.dumps(PERSON))
    argv = [
        "generate",
        str(tmp_path / "ckpt"),
        "--prompt",
        "the cat",
        "--json-schema",
        str(tmp_path / "person.json"),
    ]
    assert main([*argv, "--sample", "--seed", "0", "--max-new-tokens", "80"]) == 0
    out = capsys.readouterr().out
    jsonschema.validate(json.loads(out[out.index("the cat") + len("the cat") :]), PERSON)
    assert main([*argv[:-1], str(tmp_path / "missing.json")]) == 2
    assert "--json-schema" in capsys.readouterr().err
