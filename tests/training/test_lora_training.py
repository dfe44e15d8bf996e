"""LoRA fine-tuning in the trainer (``lora:`` in the config): only the adapters train, the run saves them and
the merged model, prints and records what it trains, and resumes exactly; the shifted toy task it is shown on."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from training.conftest import tiny_config

import zoo
import zoo.lora
from zoo.demo import read_tsv, toy_corpus
from zoo.demo.corpus import _Clause, _NounPhrase
from zoo.demo.lexicon import LOCATIONS, NOUNS, PRONOUNS, VERBS
from zoo.demo.shifted import negate, negated_pairs, shifted_corpus
from zoo.io.tokenizer import train_tokenizer
from zoo.training import TrainConfig, train
from zoo.training.config import ConfigError
from zoo.training.evaluate import bleu
from zoo.training.report.progress import ProgressLines
from zoo.training.run.checkpoints import ResumeError, checkpoint_problem, latest_checkpoint

ROOT = Path(__file__).resolve().parents[2]
R = 4
# Adapter elements of the tiny model (2 + 2 layers, width 32) with r=4 on qkv and out: per layer,
# self-attention qkv (32 -> 96) r*(32+96) + out r*(32+32); the decoder's cross q (32->32), kv (32->64), out.
ENCODER_LAYER = R * (32 + 96) + R * (32 + 32)
DECODER_LAYER = ENCODER_LAYER + R * (32 + 32) + R * (32 + 64) + R * (32 + 32)
TINY_ADAPTER_ELEMENTS = 2 * ENCODER_LAYER + 2 * DECODER_LAYER  # 4,864


def losses(run: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["loss"] is not None}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, toy_files: tuple[Path, Path]) -> Path:
    """A tiny trained base model folder (4 steps: what matters is that it is not the initialisation)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run = tmp_path_factory.mktemp("lora") / "base"
        train(tiny_config(run, toy_files), progress=False)
    finally:
        torch.set_num_threads(threads)
    return run


@pytest.fixture
def lora_config(base: Path, toy_files: tuple[Path, Path], tmp_path: Path) -> Callable[..., TrainConfig]:
    """A LoRA run on ``base``: r=4 on qkv and out, a LoRA-sized constant rate; keywords are dotted overrides."""

    def make(output_dir: Path | None = None, **overrides: Any) -> TrainConfig:
        changes = {
            "model": {"init_from": str(base)},
            "lora": {"r": R, "alpha": 8, "targets": ["qkv", "out"]},
            "schedule": {"kind": "constant", "lr": 1e-2},
            "output_dir": str(output_dir or tmp_path / "lora"),
            **overrides,
        }
        return tiny_config(tmp_path / "lora", toy_files, **changes)

    return make


def logits(model: torch.nn.Module) -> torch.Tensor:
    model.eval()
    ids = torch.tensor([[5, 9, 14, 2], [7, 8, 2, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        return model(ids, attention_mask=mask, decoder_input_ids=ids[:, :3]).logits


# --- config -----------------------------------------------------------------------------------------------


def test_lora_without_a_trained_base_is_refused_naming_both_fields(toy_files: tuple[Path, Path], tmp_path):
    with pytest.raises(ConfigError, match=r"lora needs model\.init_from"):
        tiny_config(tmp_path, toy_files, lora={"r": 8})


def test_lora_with_fsdp_is_refused_at_config_time(lora_config: Callable[..., TrainConfig]) -> None:
    with pytest.raises(ConfigError, match=r"lora with distributed\.strategy fsdp is not supported: use ddp"):
        lora_config(distributed={"strategy": "fsdp"})


def test_a_bad_lora_field_names_its_dotted_path(lora_config: Callable[..., TrainConfig]) -> None:
    with pytest.raises(ConfigError, match=r"lora\.targets: .*'mlp' is not a target"):
        lora_config(**{"lora.targets": ["mlp"]})
    with pytest.raises(ConfigError, match=r"lora\.rank: Extra inputs are not permitted"):
        lora_config(**{"lora.rank": 8})


def test_init_from_on_the_command_line_completes_a_lora_config(base: Path, tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "model: {preset: transformer-tiny, overrides: {dropout: 0.0}}\nlora: {r: 4}\n"
        "data: {train: t.tsv}\nmax_steps: 1\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match=r"lora needs model\.init_from"):
        TrainConfig.from_yaml(path)
    config = TrainConfig.from_yaml(path, init_from=base, **{"lora.r": 16})
    assert config.model.init_from == base and config.model.overrides == {"dropout": 0.0}
    assert config.lora is not None and config.lora.r == 16
    assert TrainConfig.from_yaml(path, init_from=base).to_yaml().count("lora:") == 1


def test_a_target_the_model_lacks_is_refused_before_anything_is_written(
    lora_config: Callable[..., TrainConfig],
) -> None:
    config = lora_config(**{"lora.targets": ["qkv", "encoder.cross.qkv"]})
    with pytest.raises(
        ConfigError, match=r"lora\.targets: lora target 'encoder\.cross\.qkv' matches nothing"
    ):
        train(config, progress=False)
    assert {p.name for p in config.output_dir.glob("*")} <= {".zoo-train.lock"}  # no tokenizer, no config


def test_lora_on_a_model_the_task_gives_a_new_head_is_refused(tmp_path: Path) -> None:
    from training.test_classification import pretrained_mlm, sentiment_config

    folder, _ = pretrained_mlm(tmp_path / "mlm", hf=False)
    config = sentiment_config(tmp_path, max_steps=1).starting_from(folder).override(lora={"r": 4})
    with pytest.raises(
        ConfigError, match=r"lora: the task adds head tensors .*classifier\..* LoRA would keep"
    ):
        train(config, progress=False)


# --- training ---------------------------------------------------------------------------------------------


def test_only_the_adapters_train_and_the_run_saves_them_and_the_merged_model(
    lora_config: Callable[..., TrainConfig], base: Path
) -> None:
    config = lora_config()
    out = io.StringIO()
    result = train(config, callbacks=[ProgressLines(file=out)], progress=False)
    model = result.model
    base_model = zoo.load(base)
    # The base tensors are untouched; every adapter B moved off zero.
    adapters = zoo.lora.adapter_state(model)
    for name, tensor in base_model.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    assert all(t.abs().sum() > 0 for name, t in adapters.items() if name.endswith("lora_B"))
    # The count: printed at the start, recorded in run.json and the state.
    trainable, total = zoo.lora.trainable_parameters(model)
    assert trainable == TINY_ADAPTER_ELEMENTS == 4864
    assert total == base_model.num_parameters() + 4864
    line = f"trainable parameters: 4,864 of {total:,} ({100 * 4864 / total:.2f}%) — LoRA r=4 on qkv, out"
    assert out.getvalue().splitlines()[1] == line  # after the header line
    info = json.loads((config.output_dir / "run.json").read_text())
    assert info["parameters"] == {"trainable": 4864, "total": total}
    assert info["lora"]["r"] == R and info["init_from"] == str(base)
    # The adapter file: only the adapters (float32), the base named as given.
    adapter = zoo.lora.read_adapter(config.output_dir / "adapter.safetensors")
    assert adapter.bytes == 4 * 4864 and adapter.base_id == str(base) and adapter.spec == config.lora
    # The run's model.safetensors is the merged model: the same logits as the trained adapters.
    merged = zoo.load(config.output_dir)
    assert not zoo.lora.adapter_modules(merged)
    torch.testing.assert_close(logits(merged), logits(model), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(logits(merged), logits(base_model), atol=1e-3)  # and it did learn something
    # ...and the adapters alone put back on the base give them too.
    reloaded = zoo.lora.load(zoo.load(base), config.output_dir / "adapter.safetensors")
    torch.testing.assert_close(logits(reloaded), logits(model), atol=1e-6, rtol=1e-6)


def test_the_optimizer_holds_only_the_adapters(lora_config: Callable[..., TrainConfig]) -> None:
    from zoo.training import Trainer

    trainer = Trainer(lora_config(), progress=False)
    try:
        held = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
        adapters = {id(p) for p in zoo.lora.adapter_state(trainer.model).values()}
        assert held == adapters and len(held) == 2 * 14  # lora_A and lora_B of 2 * 2 + 2 * 5 projections
        state = trainer.state
        assert (state.trainable_parameters, state.lora) == (4864, trainer.config.lora)
    finally:
        trainer.close()


def test_a_full_run_prints_no_count_line_and_records_its_parameters(
    make_config: Callable[..., TrainConfig],
) -> None:
    out = io.StringIO()
    config = make_config(max_steps=1)
    result = train(config, callbacks=[ProgressLines(file=out)], progress=False)
    assert "trainable parameters" not in out.getvalue()
    n = result.model.num_parameters()
    assert json.loads((config.output_dir / "run.json").read_text())["parameters"] == {
        "trainable": n,
        "total": n,
    }
    assert not (config.output_dir / "adapter.safetensors").exists()


def test_a_lora_run_resumes_exactly(lora_config: Callable[..., TrainConfig], tmp_path: Path) -> None:
    def make(run: Path, steps: int) -> TrainConfig:
        return lora_config(
            run,
            max_steps=steps,
            checkpoint={"every_steps": 3, "keep_last": 5},
            **{"lora.dropout": 0.1, "batch.max_tokens": 1500, "batch.grad_accum": 2},  # RNG and accumulation
        )

    straight = train(make(tmp_path / "straight", 6), progress=False)
    train(make(tmp_path / "split", 3), progress=False)
    checkpoint = latest_checkpoint(tmp_path / "split")
    assert checkpoint is not None and (checkpoint / "adapter.safetensors").is_file()
    assert checkpoint_problem(checkpoint) is None
    second = train(make(tmp_path / "split", 6), resume=True, progress=False)
    expected, got = losses(tmp_path / "straight"), losses(tmp_path / "split")
    assert sorted(got) == [1, 2, 3, 4, 5, 6]
    for step in (4, 5, 6):
        assert abs(expected[step] - got[step]) < 1e-6, step
    for name, tensor in zoo.lora.adapter_state(straight.model).items():
        torch.testing.assert_close(zoo.lora.adapter_state(second.model)[name], tensor, atol=1e-6, rtol=0)
    torch.testing.assert_close(
        logits(zoo.load(tmp_path / "split")), logits(zoo.load(tmp_path / "straight")), atol=1e-5, rtol=0
    )


def test_a_qlora_run_trains_on_an_nf4_base_and_resumes_exactly(
    lora_config: Callable[..., TrainConfig], base: Path, tmp_path: Path
) -> None:
    pytest.importorskip("torchao")
    from zoo.lora.nf4 import is_nf4

    def make(run: Path, steps: int, **overrides: Any) -> TrainConfig:
        return lora_config(
            run,
            max_steps=steps,
            checkpoint={"every_steps": 2, "keep_last": 5},
            **{"lora.quantize_base": "nf4", "lora.dropout": 0.1, **overrides},
        )

    straight = train(make(tmp_path / "straight", 4), progress=False)
    assert any(is_nf4(p) for p in straight.model.parameters())  # the base the run trained on was NF4
    train(make(tmp_path / "split", 2), progress=False)
    second = train(make(tmp_path / "split", 4), resume=True, progress=False)
    expected, got = losses(tmp_path / "straight"), losses(tmp_path / "split")
    for step in (3, 4):
        assert abs(expected[step] - got[step]) < 1e-6, step
    for name, tensor in zoo.lora.adapter_state(straight.model).items():
        torch.testing.assert_close(zoo.lora.adapter_state(second.model)[name], tensor, atol=1e-6, rtol=0)
    # The saved model is merged and dense; the adapters load onto the dense base (same fingerprint).
    merged = zoo.load(tmp_path / "split")
    assert not any(is_nf4(p) for p in merged.parameters())
    torch.testing.assert_close(logits(merged), logits(second.model), atol=1e-5, rtol=1e-5)
    zoo.lora.load(zoo.load(base), tmp_path / "split" / "adapter.safetensors")
    with pytest.raises(ResumeError, match=r"lora section differs from this config's in: quantize_base"):
        train(make(tmp_path / "split", 6, **{"lora.quantize_base": None}), resume=True, progress=False)


def test_quantize_base_takes_only_nf4(lora_config: Callable[..., TrainConfig]) -> None:
    with pytest.raises(ConfigError, match=r"lora.quantize_base: Input should be 'nf4'"):
        lora_config(**{"lora.quantize_base": "int4"})


def test_a_lora_checkpoint_resumes_only_with_the_same_adapters_on_the_same_base(
    lora_config: Callable[..., TrainConfig], base: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    train(lora_config(run, max_steps=2, checkpoint={"every_steps": 2}), progress=False)
    with pytest.raises(ResumeError, match=r"lora section differs from this config's in: r"):
        train(lora_config(run, max_steps=4, **{"lora.r": 8}), resume=True, progress=False)
    plain = lora_config(run, max_steps=4).model_dump(mode="json", exclude_unset=True)
    del plain["lora"]
    with pytest.raises(ResumeError, match=r"holds LoRA adapters .* but this config has no lora section"):
        train(TrainConfig.from_dict(plain), resume=True, progress=False)
    other_base = tmp_path / "other-base"
    model = zoo.load(base)
    with torch.no_grad():
        model.encoder.layers[0].self_attn.qkv_proj.weight.add_(0.1)
    zoo.save(model, other_base, tokenizer=zoo.load_tokenizer(base))
    moved = lora_config(run, max_steps=4, model={"init_from": str(other_base)})
    with pytest.raises(ResumeError, match="the adapters were trained on another base"):
        train(moved, resume=True, progress=False)
    checkpoint = latest_checkpoint(run)
    assert checkpoint is not None
    (checkpoint / "adapter.safetensors").unlink()
    assert checkpoint_problem(checkpoint) == "adapter.safetensors missing"


@pytest.mark.slow
def test_two_ddp_processes_train_lora_like_one_process(
    lora_config: Callable[..., TrainConfig], toy_files: tuple[Path, Path], tmp_path: Path
) -> None:
    fixed = {"data.valid": None, "batch.max_tokens": 600, "optim.eps": 1e-6, "max_steps": 3}
    single = train(lora_config(tmp_path / "single", **fixed, **{"batch.grad_accum": 2}), progress=False)
    config = lora_config(tmp_path / "ddp", **fixed)
    (tmp_path / "ddp.yaml").write_text(config.to_yaml(), encoding="utf-8")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += ["-m", "zoo", "train", str(tmp_path / "ddp.yaml"), "--no-progress"]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("trainable parameters: 4,864 of") == 1  # rank 0 only
    ddp = zoo.lora.read_adapter(tmp_path / "ddp" / "adapter.safetensors")
    assert ddp.tensors == 28
    from safetensors.torch import load_file

    theirs = load_file(str(tmp_path / "ddp" / "adapter.safetensors"))
    for name, tensor in zoo.lora.adapter_state(single.model).items():
        torch.testing.assert_close(theirs[name], tensor.detach(), atol=1e-5, rtol=0)


# --- the shifted toy task ---------------------------------------------------------------------------------


def _noun(en: str):
    return next(n for n in NOUNS if n.en == en)


def _verb(en: str):
    return next(v for v in VERBS if v.en == en)


@pytest.mark.parametrize(
    ("subject", "verb", "tense", "obj", "location", "expected"),
    [
        (_NounPhrase("the", _noun("cat")), "eat", "present", _NounPhrase("mass", _noun("fish")), None,
         ("the cat does not eat fish", "고양이가 생선을 안 먹는다")),
        (_NounPhrase("plural", _noun("dog")), "chase", "past", _NounPhrase(2, _noun("cat")), None,
         ("the dogs did not chase two cats", "개들이 고양이 두 마리를 안 쫓았다")),
        (_NounPhrase("pronoun", pronoun=PRONOUNS[3]), "cook", "future", _NounPhrase("mass", _noun("fish")),
         LOCATIONS[2], ("she will not cook fish in the kitchen", "그녀는 부엌에서 생선을 요리 안 할 것이다")),
        (_NounPhrase("pronoun", pronoun=PRONOUNS[0]), "cook", "past", _NounPhrase("a", _noun("egg")), None,
         ("i did not cook an egg", "나는 달걀을 요리 안 했다")),
        (_NounPhrase("pronoun", pronoun=PRONOUNS[4]), "drink", "present", _NounPhrase("mass", _noun("milk")),
         None, ("they do not drink milk", "그들은 우유를 안 마신다")),
    ],
)  # fmt: skip
def test_negation_moves_tense_to_do_support_and_puts_an_before_the_korean_verb(
    subject, verb, tense, obj, location, expected
) -> None:
    assert negate(_Clause(subject, _verb(verb), tense, obj, location)) == expected


def test_the_shifted_task_is_new_to_the_demo_and_its_splits_are_disjoint() -> None:
    corpus = shifted_corpus(seed=0, train_size=400, valid_size=50, affirmative_share=0.25)
    assert len(corpus.train) == 400 and len(corpus.valid) == 50
    assert all(" not " in en and " 안 " in ko for en, ko in corpus.valid)
    assert sum(" not " not in en for en, _ in corpus.train) == 100  # the demo's own pairs
    assert not {en for en, _ in corpus.train} & {en for en, _ in corpus.valid}
    demo = toy_corpus(seed=0)
    assert not {en for en, _ in corpus.train} & {en for en, _ in demo.valid}  # its held-out split stays so
    assert all(" not " not in en for en, _ in demo.train + demo.valid)  # the demo never saw a negation
    assert negated_pairs(30, seed=3)[:10] == negated_pairs(10, seed=3)


def test_the_demo_tokenizer_covers_the_shifted_task_without_unknowns() -> None:
    # Trained as `zoo demo` trains its tokenizer: BPE, 1,000 tokens, on the demo's training split.
    demo = toy_corpus(seed=0)
    tokenizer = train_tokenizer(
        iter([text for pair in demo.train for text in pair]), kind="bpe", vocab_size=1000, min_frequency=2
    )
    corpus = shifted_corpus()
    ids = tokenizer.encode_batch([text for pair in corpus.train + corpus.valid for text in pair])
    assert tokenizer.unk_id is not None
    assert not any(tokenizer.unk_id in row for row in ids)


def test_the_committed_example_data_is_what_the_script_writes(tmp_path: Path) -> None:
    import runpy

    script = runpy.run_path(str(ROOT / "examples" / "negation_data.py"))
    script["main"](tmp_path)
    for split in ("train", "valid"):
        name = f"negation.{split}.tsv"
        assert (tmp_path / name).read_bytes() == (ROOT / "examples" / "data" / name).read_bytes(), name
    assert len(read_tsv(ROOT / "examples" / "data" / "negation.train.tsv")) == 2000


# --- the bar: a LoRA fine-tune of the demo model learns the shifted task ---------------------------------------


@pytest.mark.slow
def test_the_example_lora_fine_tune_raises_held_out_bleu_on_the_shifted_task(tmp_path: Path) -> None:
    """Trains the demo model (`zoo demo`'s config, 300 steps), then runs examples/finetune_lora.yaml on it."""
    from zoo.demo.config import demo_config, write_toy_data

    # One thread, as the demo and the example use: on a busy 2-core machine a second one costs ~10x.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        demo_train, demo_valid = write_toy_data(tmp_path / "demo" / "data")
        base = train(demo_config(tmp_path / "demo", train=demo_train, valid=demo_valid), progress=False)
        shifted = read_tsv(ROOT / "examples" / "data" / "negation.valid.tsv")
        original = read_tsv(demo_valid)
        tok = base.tokenizer

        def score(model: torch.nn.Module, pairs: list[tuple[str, str]]) -> float:
            return bleu(model, pairs, source_tokenizer=tok, target_tokenizer=tok)

        before, before_original = score(base.model, shifted), score(base.model, original)
        config = TrainConfig.from_yaml(
            ROOT / "examples" / "finetune_lora.yaml",
            init_from=tmp_path / "demo",
            output_dir=str(tmp_path / "lora"),
            **{
                "data.train": str(ROOT / "examples" / "data" / "negation.train.tsv"),
                "data.valid": str(ROOT / "examples" / "data" / "negation.valid.tsv"),
                "checkpoint.every_steps": None,
            },
        )
        result = train(config, progress=False)
    finally:
        torch.set_num_threads(threads)
    after = result.final["val_bleu"]
    merged = zoo.load(tmp_path / "lora")
    after_original = score(merged, original)
    # Measured: 38.5 -> 96.4 on the shifted held-out set; the demo's own 98.1 -> 99.1.
    assert before < 60 and after > 90 and after - before > 30, (before, after)
    assert after_original > before_original - 3, (before_original, after_original)
    assert abs(score(merged, shifted) - after) < 0.5  # the merged model is the trained one
