"""The example spec files build, and the example script runs."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

import zoo

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("name", ["my_stack.yaml", "gpt_small.json"])
def test_example_spec_files_build(name):
    model = zoo.build(EXAMPLES / name, device="meta")
    assert model.num_parameters() > 0
    assert zoo.build(str(EXAMPLES / name), device="meta").spec == model.spec


def test_annotated_example_sets_every_top_level_field():
    import yaml

    written = set(yaml.safe_load((EXAMPLES / "my_stack.yaml").read_text()))
    spec_fields = set(type(zoo.load_spec(EXAMPLES / "my_stack.yaml")).model_fields)
    assert written == spec_fields, f"fields the annotated example leaves out: {spec_fields - written}"


def test_build_and_run_example_runs(capsys):
    runpy.run_path(str(EXAMPLES / "build_and_run.py"), run_name="__main__")
    assert "my_stack.yaml: encoder-decoder" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["translate.yaml", "classify.yaml", "finetune_lora.yaml", "gpt.yaml"])
def test_example_training_configs_validate_and_name_bundled_data(name):
    from zoo.training import TrainConfig

    config = TrainConfig.from_yaml(EXAMPLES / name)
    for split in (config.data.train, config.data.valid):
        assert isinstance(split, Path) and (EXAMPLES.parent / split).is_file(), split  # from the repo root
    if name == "finetune_lora.yaml":  # LoRA on the demo's run (`zoo demo` writes runs/demo)
        assert config.model.init_from == Path("runs/demo") and config.lora is not None

    if name == "gpt.yaml":  # the README's decoder: a causal LM on plain text, written to runs/gpt
        assert config.task is not None and config.task.kind == "causal_lm"
        assert config.output_dir == Path("runs/gpt")


@pytest.mark.parametrize("script", ["english_data.py", "sentiment_data.py", "negation_data.py"])
def test_example_data_scripts_write_exactly_the_bundled_files(script, tmp_path):
    runpy.run_path(str(EXAMPLES / script), run_name="not_main")["main"](tmp_path)
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written, f"{script} wrote nothing"
    for name in written:
        bundled = EXAMPLES / "data" / name
        assert bundled.read_bytes() == (tmp_path / name).read_bytes(), (
            f"{bundled} differs from what {script} writes"
        )


def test_instruct_example_runs_its_four_stages_quickly(tmp_path):
    """examples/instruct.py end to end at a few steps per stage: pretraining, chat SFT, DPO and GRPO each train and
    are scored on the held-out questions (the README's figures come from the full run)."""
    example = runpy.run_path(str(EXAMPLES / "instruct.py"), run_name="not_main")
    facts = example["facts"]()
    tune, held_out = example["split"](facts, 0)
    assert len(facts) == 610 and not {(f.a, f.op, f.b) for f in tune} & {(f.a, f.op, f.b) for f in held_out}
    results = example["main"](["--quick", "--out", str(tmp_path / "run")])
    assert set(results) == {"pretrained", "sft", "dpo", "grpo"}
    for name in ("pretrain", "sft", "dpo", "grpo"):
        assert (tmp_path / "run" / name / "model.safetensors").is_file()
    assert all(0.0 <= s.correct <= 1.0 and 0.0 <= s.short <= 1.0 for s in results.values())
    # the final chat model keeps the template SFT fine-tuned it with (what `zoo convert --to-hf` exports)
    sft, dpo, grpo = (zoo.load_tokenizer(tmp_path / "run" / name) for name in ("sft", "dpo", "grpo"))
    assert dpo.chat_template is not None and dpo.chat_template == sft.chat_template == grpo.chat_template
    rewards = [
        json.loads(line) for line in (tmp_path / "run" / "grpo" / "metrics.jsonl").read_text().splitlines()
    ]
    assert all(r["rewards/correct"] is not None for r in rewards if r["loss"] is not None)
