"""`zoo.from_hf` with a Hugging Face Hub id: read from a cache laid out as huggingface_hub lays it out.

The cache is built in the test (``models--org--name/{blobs, refs, snapshots/<commit>}``, snapshot files as
relative symbolic links to their blobs) and read offline (``HF_HUB_OFFLINE=1``): nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import torch
from support import padded_batch

import zoo
from zoo.cli import main
from zoo.io.hf.hub import HubDependencyError, parse_hub_id

transformers = pytest.importorskip("transformers")
pytest.importorskip("huggingface_hub")

GPT2 = dict(n_layer=2, n_embd=32, n_head=4, vocab_size=128, n_positions=32, bos_token_id=1, eos_token_id=2)
COMMIT_A, COMMIT_B = "a" * 40, "0123456789abcdef0123456789abcdef01234567"


def _gpt2(folder: Path, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2)).eval()
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[torch.nn.Module, Path]]:
    """Two different small GPT-2 checkpoints, saved by transformers."""
    root = tmp_path_factory.mktemp("saved")
    return {name: (_gpt2(root / name, seed), root / name) for seed, name in enumerate(("a", "b"))}


def cache_snapshot(
    cache: Path, repo_id: str, folder: Path, *, commit: str, refs: tuple[str, ...] = ()
) -> Path:
    """Put ``folder``'s files into ``cache`` as huggingface_hub stores a download of ``repo_id`` at
    ``commit``: contents in ``blobs/<sha256>``, ``snapshots/<commit>/<name>`` a relative link to its blob,
    ``refs/<branch or tag>`` holding the commit."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    for file in sorted(folder.iterdir()):
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / file.name).symlink_to(Path("..", "..", "blobs", blob.name))
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, models) -> Path:
    """An offline cache holding org/tiny-gpt2: main at commit A (model a), tag v2 at commit B (model b)."""
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache_snapshot(cache, "org/tiny-gpt2", models["a"][1], commit=COMMIT_A, refs=("main",))
    cache_snapshot(cache, "org/tiny-gpt2", models["b"][1], commit=COMMIT_B, refs=("v2",))
    return cache


def _assert_same_logits(model: zoo.ZooModel, hf: torch.nn.Module) -> None:
    ids, mask = padded_batch(GPT2["vocab_size"], [6, 3])
    with torch.no_grad():
        ours, theirs = model(ids, attention_mask=mask).logits, hf(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(ours[mask.bool()], theirs[mask.bool()], atol=1e-4, rtol=1e-4)


def test_hub_id_loads_its_cached_snapshot_offline(cache: Path, models) -> None:
    model = zoo.from_hf("org/tiny-gpt2")
    _assert_same_logits(model, models["a"][0])
    assert model.spec.name == "org/tiny-gpt2"
    assert zoo.read_hf_spec("org/tiny-gpt2") == model.spec


@pytest.mark.parametrize(
    ("revision", "expected"), [("v2", "b"), (COMMIT_B, "b"), (COMMIT_A, "a"), ("main", "a")]
)
def test_revision_pins_a_branch_tag_or_commit(cache: Path, models, revision: str, expected: str) -> None:
    _assert_same_logits(zoo.from_hf(f"org/tiny-gpt2@{revision}"), models[expected][0])


def test_an_id_not_in_the_cache_says_so_and_how_to_fetch_it(cache: Path) -> None:
    with pytest.raises(FileNotFoundError) as error:
        zoo.from_hf("org/elsewhere")
    message = str(error.value)
    assert f"'org/elsewhere' is not in the Hugging Face cache ({cache})" in message
    assert "downloads are off (HF_HUB_OFFLINE=1)" in message and "hf download org/elsewhere" in message
    with pytest.raises(FileNotFoundError, match=r"'org/tiny-gpt2@v3' is not in the Hugging Face cache"):
        zoo.from_hf("org/tiny-gpt2@v3")  # a revision never downloaded


def test_an_existing_folder_wins_over_a_hub_id(
    cache: Path, models, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "tiny-gpt2").symlink_to(models["b"][1])
    _assert_same_logits(zoo.from_hf("org/tiny-gpt2"), models["b"][0])


def test_a_missing_path_that_is_no_hub_id_keeps_the_folder_error(cache: Path, tmp_path: Path) -> None:
    for path in ("no such/folder", "./org/tiny-gpt2", str(tmp_path / "nowhere"), Path("org/tiny-gpt2")):
        with pytest.raises(FileNotFoundError, match="no such folder"):
            zoo.from_hf(path)


def test_org_name_under_a_folder_here_is_a_path_not_a_hub_id(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``runs/demo`` beside ``runs/``: a mistyped folder, not the Hub's (here: the cache's) ``runs/demo``."""
    assert zoo.from_hf("org/tiny-gpt2") is not None  # in the cache
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org").mkdir()
    with pytest.raises(FileNotFoundError, match=r"^org/tiny-gpt2: no such folder"):
        zoo.from_hf("org/tiny-gpt2")


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("gpt2", ("gpt2", None)),
        ("Helsinki-NLP/opus-mt-en-de", ("Helsinki-NLP/opus-mt-en-de", None)),
        ("org/name@v1.0", ("org/name", "v1.0")),
        ("org/name@refs/pr/3", ("org/name", "refs/pr/3")),
        ("org/sub/name", None),
        ("./name", None),
        ("/abs/name", None),
        ("org/na--me", None),
        ("org/..", None),
        ("name with space", None),
        ("org/name/", None),
    ],
)
def test_hub_ids_are_told_from_paths(text: str, parsed: tuple[str, str | None] | None) -> None:
    assert parse_hub_id(text) == parsed


def test_without_huggingface_hub_a_hub_id_says_what_to_install(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails as if not installed
    with pytest.raises(HubDependencyError, match=r"pip install -e '\.\[hub\]' in zoo's clone"):
        zoo.from_hf("org/tiny-gpt2")


def test_convert_from_hf_takes_a_hub_id(
    cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["convert", "--from-hf", "org/tiny-gpt2@v2", "--out", str(tmp_path / "zoo")]) == 0
    assert json.loads((tmp_path / "zoo" / "spec.json").read_text())["name"] == "org/tiny-gpt2"
    assert main(["convert", "--from-hf", "org/elsewhere", "--out", str(tmp_path / "nope")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "'org/elsewhere' is not in the Hugging Face cache" in err and "Traceback" not in err
    assert not (tmp_path / "nope").exists()


def test_show_and_diff_take_a_hub_id(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "org/tiny-gpt2"]) == 0
    assert "org/tiny-gpt2" in capsys.readouterr().out
    assert main(["diff", "org/tiny-gpt2", "org/tiny-gpt2@v2"]) in (0, 1)
    assert main(["show", "org/elsewhere"]) == 2
    assert "is not in the Hugging Face cache" in " ".join(capsys.readouterr().err.split())
    assert main(["show", "no/such-spec.yaml"]) == 2  # a file name keeps the file error
    assert "Hugging Face cache" not in capsys.readouterr().err
