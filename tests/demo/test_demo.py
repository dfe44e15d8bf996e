"""The demo's embedded defaults, and the save -> reload round trip it shows off."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

import zoo
import zoo.demo as tc
from zoo.demo.config import DEMO_SENTENCES, demo_config, write_toy_data
from zoo.training import train, translate
from zoo.training.config import NoamSchedule, TrainConfig
from zoo.training.task_settings import Seq2SeqSettings


def test_demo_sentences_are_grammatical_and_never_seen_in_training() -> None:
    corpus = tc.toy_corpus()
    seen = {src for src, _ in corpus.train + corpus.valid}
    for sentence in DEMO_SENTENCES:
        assert tc.translate(sentence)  # raises outside the grammar
        assert sentence not in seen


def test_demo_config_is_the_papers_recipe_on_transformer_tiny(tmp_path: Path) -> None:
    train_path, valid_path = write_toy_data(tmp_path / "data", train_size=50, valid_size=5)
    assert len(tc.read_tsv(train_path)) == 50 and len(tc.read_tsv(valid_path)) == 5
    config = demo_config(tmp_path / "run", train=train_path, valid=valid_path)
    assert config.model.preset == "transformer-tiny" and config.model.overrides == {"dropout": 0.1}
    assert isinstance(config.schedule, NoamSchedule)
    assert (
        config.loss.label_smoothing == 0.1 and config.optim.betas == (0.9, 0.98) and config.optim.eps == 1e-9
    )
    assert config.device == "auto" and config.task == Seq2SeqSettings(bleu=True, bleu_metric="sacrebleu")


def test_demo_schedule_warms_up_then_decays_within_the_run(tmp_path: Path) -> None:
    from zoo.training.schedules import noam

    config = demo_config(tmp_path / "run", train=tmp_path / "t.tsv", valid=tmp_path / "v.tsv")
    assert isinstance(config.schedule, NoamSchedule)
    warmup, steps = config.schedule.warmup_steps, config.max_steps
    rates = [noam(s, d_model=128, warmup=warmup, scale=config.schedule.scale) for s in range(1, steps + 1)]
    peak = max(range(steps), key=rates.__getitem__) + 1
    assert peak == warmup < steps / 2  # the peak comes early, so most of the run is spent decaying
    assert rates[-1] < 0.6 * rates[peak - 1]  # 1/sqrt(step): 300 steps end at sqrt(100/300) of the peak
    assert 2.5e-3 < rates[peak - 1] < 3e-3


def test_saved_model_translates_like_the_trained_one(make_config: Callable[..., TrainConfig]) -> None:
    result = train(make_config(max_steps=3))
    sources = [src for src, _ in tc.toy_corpus(train_size=0, valid_size=8).valid]
    kwargs = dict(source_tokenizer=result.tokenizer, target_tokenizer=result.tokenizer)
    before = translate(result.model, sources, **kwargs)
    reloaded, tokenizer = zoo.load(result.output_dir), zoo.load_tokenizer(result.output_dir)
    assert translate(reloaded, sources, source_tokenizer=tokenizer, target_tokenizer=tokenizer) == before
    beams = translate(result.model, sources, num_beams=3, **kwargs)
    assert len(beams) == len(sources) and all(isinstance(b, str) for b in beams)


def test_zoo_demo_runs_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from zoo.cli import main

    assert main(["demo", "--steps", "2", "--output-dir", str(tmp_path / "demo")]) == 0
    out = "".join(capsys.readouterr().out.split())
    assert "held-outBLEU" in out and "reloadedfromdisk:sametranslations" in out
    assert "nrefs:1|case:mixed" in out  # the BLEU is sacrebleu's, with its signature
    assert "1,000BPEtokens" in out and "3,003,392" in out  # why the count differs from the preset table
    assert (tmp_path / "demo" / "model.safetensors").is_file() and (
        tmp_path / "demo" / "tokenizer.json"
    ).is_file()


def test_zoo_demo_reruns_over_its_own_run_but_refuses_a_foreign_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from zoo.cli import main

    out = tmp_path / "demo"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"someone else's model")
    demo = ["demo", "--steps", "1", "--output-dir", str(out)]
    assert main(demo) == 2
    err = "".join(capsys.readouterr().err.split())
    assert "model.safetensors,whichthedemodidnotwrite" in err and "--overwrite" in err
    assert (out / "model.safetensors").read_bytes() == b"someone else's model"
    assert not (out / "data").exists()  # refused before anything was written

    assert main([*demo, "--overwrite"]) == 0  # replaced on request
    assert main(demo) == 0  # its own previous run: replaced without asking (`make demo` twice)
    records = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in records] == [1, 1]  # one run's records: started over
    assert zoo.load(out).num_parameters() > 0


def test_the_demo_recognises_only_its_own_config(tmp_path: Path) -> None:
    from zoo.demo.config import is_demo_run

    out = tmp_path / "run"
    out.mkdir()
    assert not is_demo_run(out)  # nothing there
    ours = demo_config(out, train=out / "data" / "train.tsv", valid=out / "data" / "valid.tsv")
    for config, expected in [
        (ours, True),
        (ours.override(max_steps=7, device="cpu", num_threads=2), True),  # the demo's own options
        (ours.override(**{"model.overrides.dropout": 0.3}), False),  # another recipe
        (ours.override(**{"data.train": str(tmp_path / "mine.tsv")}), False),  # other data
    ]:
        (out / "train_config.yaml").write_text(config.to_yaml(), encoding="utf-8")
        assert is_demo_run(out) is expected, config
    (out / "train_config.yaml").write_text("model: [", encoding="utf-8")
    assert not is_demo_run(out)


def test_toy_data_never_replaces_other_data_unless_asked(tmp_path: Path) -> None:
    data = tmp_path / "data"
    train_path, _ = write_toy_data(data, train_size=20, valid_size=5)
    mtime = train_path.stat().st_mtime_ns
    write_toy_data(data, train_size=20, valid_size=5)  # the same pairs: left as they are
    assert train_path.stat().st_mtime_ns == mtime
    train_path.write_text("my\tdata\n", encoding="utf-8")
    with pytest.raises(FileExistsError, match=r"train\.tsv holds other data than the demo's toy corpus"):
        write_toy_data(data, train_size=20, valid_size=5)
    assert train_path.read_text(encoding="utf-8") == "my\tdata\n"
    write_toy_data(data, train_size=20, valid_size=5, overwrite=True)
    assert len(tc.read_tsv(train_path)) == 20
    train_path.unlink()
    train_path.symlink_to(tmp_path / "elsewhere.tsv")
    with pytest.raises(ValueError, match="symbolic link"):
        write_toy_data(data, train_size=20, valid_size=5, overwrite=True)
    assert not (tmp_path / "elsewhere.tsv").exists()
