"""`zoo show`, `zoo diff` and `zoo plot`: what they print, the JSON they emit, the PNGs they write, and
`zoo diff`'s exit status (as diff(1))."""

from __future__ import annotations

import json
import struct
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console
from rich.text import Text

import zoo
import zoo.cli
from zoo.analysis import diff_specs
from zoo.cli import main
from zoo.io.tokenizer import train_tokenizer
from zoo.viz import panel_inches

LINES = ["나는 학생이다", "i am a student", "고양이가 생선을 먹는다", "the cat eats fish"] * 3


def png_size(path: Path) -> tuple[int, int]:
    header = Path(path).read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", header[16:24])


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, zoo.Tokenizer]:
    """A tiny encoder-decoder (transformer-tiny shrunk) saved with a Korean/English tokenizer."""
    tokenizer = train_tokenizer(iter(LINES), kind="bpe", vocab_size=80, min_frequency=1)
    spec = zoo.preset(
        "transformer-tiny",
        vocab_size=tokenizer.vocab_size,
        d_model=32,
        num_layers=1,
        max_positions=32,
        **{"attention.num_heads": 2, "ffn.d_ff": 32},
    )
    directory = tmp_path_factory.mktemp("ckpt")
    zoo.save(zoo.build(spec), directory, tokenizer=tokenizer)
    return directory, tokenizer


def test_show_json_parses_and_counts_the_model(capsys) -> None:
    code, out, _ = run(capsys, "show", "gpt2-tiny", "--json", "--seq-len", "64", "--dtype", "bf16")
    data = json.loads(out)
    assert code == 0
    assert data["parameters"]["total"] == zoo.build("gpt2-tiny", device="meta").num_parameters()
    assert data["settings"]["dtype_bytes"] == 2 and data["settings"]["seq_len"] == 64
    assert data["memory_bytes"]["kv_cache_per_token"] == 2 * 2 * 64 * 2
    assert data["flops"]["training_per_token"] == 3 * data["flops"]["forward_per_token"]


def test_show_draws_the_tree_with_sharing_and_tying(capsys) -> None:
    code, out, _ = run(capsys, "show", "albert-base", "--seq-len", "128")
    assert code == 0
    assert "layers.0" in out and "run ×12" in out and "tied" in out
    assert "11,221,680" in out  # the total
    assert "KV cache" in out and "assumptions" in out


def test_show_counts_the_active_parameters_of_a_mixture_of_experts(capsys) -> None:
    code, out, _ = run(capsys, "show", "mixtral-8x7b", "--seq-len", "128")
    assert code == 0
    assert "active per token" in out and "12,879,925,248" in out and "46,702,792,704" in out
    assert "8 experts, top-2 per token" in out
    code, out, _ = run(capsys, "show", "moe-tiny", "--json")
    assert json.loads(out)["parameters"]["active"] == 140_096


def test_show_reads_a_checkpoint_directory(capsys, checkpoint) -> None:
    directory, _ = checkpoint
    code, out, _ = run(capsys, "show", str(directory), "--json")
    assert code == 0 and json.loads(out)["family"] == "encoder-decoder"


def test_show_of_an_unknown_preset_is_a_one_line_error(capsys) -> None:
    code, _, err = run(capsys, "show", "gpt5")
    assert code == 2 and "unknown preset 'gpt5'" in err and "Traceback" not in err


def test_diff_lists_fields_with_both_values(capsys) -> None:
    code, out, _ = run(capsys, "diff", "gpt2", "gpt2-medium")
    assert code == 1
    assert "decoder.num_layers" in out and "24" in out and "d_model" in out and "1024" in out
    code, out, _ = run(capsys, "diff", "gpt2", "gpt2-medium", "--json")
    assert code == 1
    rows = {row["field"]: row for row in json.loads(out)}
    assert rows["decoder.attention.num_heads"] == {"field": "decoder.attention.num_heads", "a": 12, "b": 16}


def test_diff_of_a_preset_with_itself_says_identical(capsys) -> None:
    code, out, _ = run(capsys, "diff", "t5-small", "t5-small")
    assert code == 0 and "identical" in out


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_diff_exit_status_is_that_of_diff1(capsys, json_flag) -> None:
    """0 the same, 1 different, 2 trouble: `zoo diff A B >/dev/null && echo same` works in scripts."""
    assert run(capsys, "diff", "t5-small", "t5-small", *json_flag)[0] == 0
    assert run(capsys, "diff", "t5-small", "t5-base", *json_flag)[0] == 1
    code, _, err = run(capsys, "diff", "t5-small", "gpt5", *json_flag)
    assert code == 2 and "unknown preset 'gpt5'" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("width", [80, 40])
def test_diff_on_a_narrow_terminal_keeps_field_paths_whole(monkeypatch, width: int) -> None:
    out = StringIO()
    monkeypatch.setattr(zoo.cli, "console", Console(file=out, width=width, force_terminal=True))
    assert main(["diff", "transformer-base", "gpt2"]) == 1
    text = Text.from_ansi(out.getvalue()).plain
    for path, _, _ in diff_specs(zoo.preset("transformer-base"), zoo.preset("gpt2")):
        assert path in text, f"{path} cut at width {width}:\n{text}"


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gpt2-tiny as transformers would have it: config.json + model.safetensors, no spec.json."""
    directory = tmp_path_factory.mktemp("hf") / "tiny-gpt2"
    zoo.to_hf(zoo.build("gpt2-tiny"), directory)
    assert (directory / "config.json").is_file() and not (directory / "spec.json").exists()
    return directory


def test_show_reads_a_hugging_face_folder(capsys, hf_folder) -> None:
    code, out, err = run(capsys, "show", str(hf_folder), "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["name"] == "tiny-gpt2" and data["source"].startswith("Hugging Face")
    assert data["parameters"]["total"] == zoo.build("gpt2-tiny", device="meta").num_parameters()
    code, out, _ = run(capsys, "show", str(hf_folder))
    assert code == 0 and "tiny-gpt2" in out


def test_diff_of_a_hugging_face_folder_and_its_preset_notes_name_and_source_only(capsys, hf_folder) -> None:
    """name and source only label a model: listed (as metadata), not counted, exit 0."""
    code, out, err = run(capsys, "diff", str(hf_folder), "gpt2-tiny", "--json")
    assert code == 0, err
    assert {row["field"]: row.get("metadata") for row in json.loads(out)} == {"name": True, "source": True}
    code, out, _ = run(capsys, "diff", str(hf_folder), "gpt2-tiny")
    assert code == 0 and "note: name differs" in out and "specs identical" in out
    code, out, _ = run(capsys, "diff", str(hf_folder), str(hf_folder))
    assert code == 0 and "identical" in out


def test_show_estimates_with_either_spelling_of_a_dtype(capsys) -> None:
    results = {}
    for dtype in ("bf16", "bfloat16", "fp16", "float16", "fp32", "float32"):
        code, out, _ = run(capsys, "show", "gpt2-tiny", "--json", "--dtype", dtype)
        assert code == 0
        results[dtype] = json.loads(out)["settings"]
    assert (
        results["bf16"] == results["bfloat16"] == {**results["bf16"], "dtype": "bfloat16", "dtype_bytes": 2}
    )
    assert results["fp16"] == results["float16"] and results["fp32"] == results["float32"]


def test_show_refuses_an_unknown_dtype_listing_the_choices(capsys) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["show", "gpt2-tiny", "--dtype", "int8"])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and "Traceback" not in err
    assert "invalid dtype 'int8'" in err and "bf16, bfloat16" in err


def test_plot_attention_writes_heads_by_layer_panels(capsys, checkpoint, tmp_path) -> None:
    directory, tokenizer = checkpoint
    source, target = "고양이가 생선을 먹는다", "the cat eats fish"
    out = tmp_path / "att.png"
    code, printed, _ = run(
        capsys,
        "plot",
        "attention",
        str(directory),
        source,
        "--target",
        target,
        "--out",
        str(out),
        "--dpi",
        "20",
    )
    assert code == 0 and str(out) in printed
    longest = max(len(tokenizer.encode(source)), len(tokenizer.encode(target)))
    side = panel_inches(longest) * 20
    assert png_size(out) == (round(2 * side), round(3 * side))  # 2 heads; 3 kinds × 1 layer


def test_plot_attention_generates_a_target_when_none_is_given(capsys, checkpoint, tmp_path) -> None:
    directory, _ = checkpoint
    out = tmp_path / "gen.png"
    code, _, _ = run(
        capsys, "plot", "attention", str(directory), "나는 학생이다", "--max-new-tokens", "4",
        "--out", str(out), "--dpi", "20",
    )  # fmt: skip
    width, height = png_size(out)
    assert code == 0 and abs(height / width - 3 / 2) < 0.02


@pytest.mark.parametrize(
    ("argv", "size"),
    [
        (["masks", "transformer-tiny"], (3 * 64, 2 * 64 + 8)),
        (["masks", "gpt2-tiny"], (64, 2 * 64 + 8)),
        (["positions", "--d-model", "32", "--length", "10"], (180, 100)),
        (["schedule", "--d-model", "128", "--warmup", "50"], (160, 90)),
    ],
)
def test_plot_commands_write_pngs_of_the_stated_size(capsys, tmp_path, argv, size) -> None:
    out = tmp_path / "plot.png"
    code, printed, _ = run(capsys, "plot", *argv, "--out", str(out), "--dpi", "20")
    assert code == 0 and f"wrote {out}" in printed.replace("\n", "")
    assert png_size(out) == size


def test_plot_training_defaults_into_the_run_folder_and_reports_skipped_lines(capsys, tmp_path) -> None:
    records = [{"step": s, "loss": 5 - s, "lr": 1e-3} for s in range(1, 5)] + [{"step": 4, "val_bleu": 3.0}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(map(json.dumps, records)) + "\nnot json\n")
    code, _, err = run(capsys, "plot", "training", str(tmp_path), "--dpi", "20")
    assert code == 0 and "skipped 1" in err
    assert png_size(tmp_path / "training.png") == (200, 140)


def test_plot_without_matplotlib_says_what_to_install(capsys, monkeypatch, tmp_path) -> None:
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    code, _, err = run(capsys, "plot", "positions", "--out", str(tmp_path / "p.png"))
    assert code == 2 and "pip install matplotlib" in err and not (tmp_path / "p.png").exists()
