"""`zoo generate` and `zoo translate` end to end, on tiny models saved with a trained tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import zoo
from zoo.cli import main
from zoo.io.tokenizer import train_tokenizer

CORPUS = [
    "the cat sat on the mat",
    "the dog sat on the log",
    "a cat and a dog met on the mat",
    "the bird sang on the log",
] * 5


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(iter(CORPUS), kind="bpe", vocab_size=60, min_frequency=1)


def _save(tmp_path: Path, name: str, spec: zoo.ModelSpec, tokenizer, lively, seed: int = 0):
    torch.manual_seed(seed)
    model = lively(zoo.build(spec).eval())
    directory = tmp_path / name
    zoo.save(model, directory, tokenizer=tokenizer)
    return directory, model


@pytest.fixture
def gpt(tmp_path: Path, tokenizer, lively):
    return _save(tmp_path, "gpt", zoo.preset("gpt2-tiny").override(vocab_size=64), tokenizer, lively)


@pytest.fixture
def translator(tmp_path: Path, tokenizer, lively):
    spec = zoo.preset("transformer-tiny").override(vocab_size=64, num_layers=2, max_positions=64)
    return _save(tmp_path, "mt", spec, tokenizer, lively, seed=4)  # a seed whose translation is not empty


def test_zoo_generate_prints_the_prompt_and_its_greedy_continuation(gpt, tokenizer, capsys):
    directory, model = gpt
    assert main(["generate", str(directory), "--prompt", "the cat", "--max-new-tokens", "6"]) == 0
    captured = capsys.readouterr()
    prompt = tokenizer.encode("the cat", add_bos=True, add_eos=False)
    new = model.generate(torch.tensor([prompt]), max_new_tokens=6)[0, len(prompt) :].tolist()
    expected = tokenizer.decode(new).strip()
    assert len(expected) > 3 and captured.out.startswith("the cat")
    assert " ".join(captured.out[len("the cat") :].split()) == " ".join(expected.split())
    assert "tokens in" in captured.err and "tokens/s" in captured.err


def test_zoo_generate_streams_text_with_its_spaces(gpt, tokenizer, capsys):
    """Printed piece by piece, the text is exactly the decoded prompt + continuation: no word runs into
    the next (a token decoded alone loses the space before its word)."""
    directory, model = gpt
    assert main(["generate", str(directory), "--prompt", "the cat", "--max-new-tokens", "8"]) == 0
    prompt = tokenizer.encode("the cat", add_bos=True, add_eos=False)
    new = model.generate(torch.tensor([prompt]), max_new_tokens=8)[0, len(prompt) :].tolist()
    eos = model.spec.eos_token_id
    new = new[: new.index(eos) + 1] if eos in new else new
    assert capsys.readouterr().out.rstrip("\n") == tokenizer.decode(prompt + new)


def test_zoo_generate_sampling_with_a_seed_is_reproducible(gpt, capsys):
    directory, _ = gpt
    argv = ["generate", str(directory), "--prompt", "a dog", "--max-new-tokens", "8", "--sample"]
    outputs = []
    for seed in ("1", "1", "2"):
        assert main([*argv, "--seed", seed, "--top-k", "20", "--temperature", "1.5"]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1]
    assert outputs[0] != outputs[2]


def test_zoo_generate_samples_when_given_a_sampling_setting_without_sample(gpt, capsys):
    """As vLLM's and llama.cpp's commands: --temperature, --top-k or --top-p samples (it ran greedy search)."""
    directory, _ = gpt
    argv = ["generate", str(directory), "--prompt", "a dog", "--max-new-tokens", "8"]
    for setting in (["--temperature", "1.5"], ["--top-k", "20"], ["--top-p", "0.95"]):
        outputs = []
        for flags in (["--sample", "--seed", "1"], ["--seed", "1"], ["--seed", "2"]):
            assert main([*argv, *setting, *flags]) == 0
            outputs.append(capsys.readouterr().out)
        assert outputs[0] == outputs[1] != outputs[2], setting


def test_zoo_generate_at_temperature_zero_is_greedy_search(gpt, capsys):
    directory, _ = gpt
    argv = ["generate", str(directory), "--prompt", "the cat", "--max-new-tokens", "6"]
    assert main(argv) == 0
    greedy = capsys.readouterr().out
    for flags in (["--temperature", "0"], ["--sample", "--temperature", "0", "--seed", "3"]):
        assert main([*argv, *flags]) == 0
        assert capsys.readouterr().out == greedy


def test_zoo_generate_refuses_top_p_at_temperature_zero(gpt, capsys):
    directory, _ = gpt
    argv = ["generate", str(directory), "--prompt", "the", "--temperature", "0", "--top-p", "0.9"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert "--top-p has no effect with --temperature 0, which is greedy search" in " ".join(err.split())


def test_zoo_generate_with_beams_prints_the_best_hypothesis(gpt, tokenizer, capsys):
    directory, model = gpt
    assert (
        main(["generate", str(directory), "--prompt", "the dog", "--max-new-tokens", "5", "--beams", "3"])
        == 0
    )
    prompt = tokenizer.encode("the dog", add_bos=True, add_eos=False)
    best = model.generate(torch.tensor([prompt]), max_new_tokens=5, num_beams=3)[0, len(prompt) :].tolist()
    out = capsys.readouterr().out
    assert " ".join(out[len("the dog") :].split()) == " ".join(tokenizer.decode(best).split())


def test_zoo_generate_reads_a_hugging_face_folder_as_its_zoo_checkpoint(gpt, tokenizer, tmp_path, capsys):
    """The folder `zoo chat`, `zoo serve` and `zoo eval` take (`zoo.load_pretrained`) is generate's too."""
    directory, model = gpt
    hf = zoo.to_hf(model, tmp_path / "hf", tokenizer=tokenizer)
    outputs = []
    for target in (directory, hf):
        assert main(["generate", str(target), "--prompt", "the cat", "--max-new-tokens", "6"]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and outputs[0].startswith("the cat")


def test_zoo_translate_streams_the_translation(translator, tokenizer, capsys):
    directory, model = translator
    assert main(["translate", str(directory), "the cat sat", "--max-new-tokens", "7"]) == 0
    source = tokenizer.encode("the cat sat", add_eos=True)
    new = model.generate(torch.tensor([source]), max_new_tokens=7)[0, 1:].tolist()
    expected = " ".join(tokenizer.decode(new).split())
    assert len(expected) > 3 and " ".join(capsys.readouterr().out.split()) == expected


def test_zoo_translate_refuses_a_decoder_checkpoint(gpt, capsys):
    directory, _ = gpt
    assert main(["translate", str(directory), "the cat"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "holds a decoder model" in err and "zoo generate" in err


def test_zoo_generate_reports_bad_settings_without_a_traceback(gpt, capsys):
    directory, _ = gpt
    assert main(["generate", str(directory), "--prompt", "the", "--sample", "--top-p", "1.5"]) == 2
    err = capsys.readouterr().err
    assert "top_p must be in (0, 1]" in " ".join(err.split()) and "Traceback" not in err


def test_zoo_generate_names_a_missing_checkpoint(tmp_path, capsys):
    assert main(["generate", str(tmp_path / "nope"), "--prompt", "hi"]) == 2
    assert "nope" in capsys.readouterr().err


@pytest.mark.parametrize("spelling", ["bf16", "bfloat16"])
def test_zoo_generate_and_translate_take_either_spelling_of_a_dtype(gpt, translator, capsys, spelling):
    argv = ["--max-new-tokens", "3", "--dtype", spelling]
    assert main(["generate", str(gpt[0]), "--prompt", "the cat", *argv]) == 0
    assert capsys.readouterr().out.startswith("the cat")
    assert main(["translate", str(translator[0]), "the cat sat", *argv]) == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_zoo_generate_on_cuda_without_cuda_is_a_one_line_error(gpt, capsys):
    directory, _ = gpt
    assert main(["generate", str(directory), "--prompt", "the", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "CUDA is not available" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_zoo_generate_refuses_an_unknown_device_before_loading(gpt, capsys):
    directory, _ = gpt
    with pytest.raises(SystemExit) as exit:
        main(["generate", str(directory), "--prompt", "the", "--device", "gpu0"])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and "invalid device 'gpu0'" in err and "Traceback" not in err


# -- everything is checked before the prompt is echoed ------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--beams", "0"],
        ["--max-new-tokens", "100000"],
        ["--sample", "--top-k", "-1"],
        ["--beams", "2", "--top-p", "2"],
    ],
)
def test_zoo_generate_checks_its_settings_before_echoing_the_prompt(gpt, capsys, argv):
    directory, _ = gpt
    assert main(["generate", str(directory), "--prompt", "the cat", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # nothing echoed: the error is the only output
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_zoo_generate_refuses_a_seed_torch_cannot_take(gpt, capsys):
    directory, _ = gpt
    with pytest.raises(SystemExit) as exit:
        main(["generate", str(directory), "--prompt", "the", "--sample", "--seed", str(2**80)])
    out, err = capsys.readouterr()
    assert exit.value.code == 2 and out == ""
    assert "invalid seed" in err and "0 to 2**64 - 1" in err


def _save_with(directory: Path, model, tokenizer, change) -> Path:
    with torch.no_grad():
        change(dict(model.named_parameters()))
    zoo.save(model, directory, tokenizer=tokenizer)
    return directory


@pytest.mark.parametrize("search", [[], ["--sample", "--seed", "0"], ["--beams", "2"]])
def test_zoo_generate_refuses_nan_weights_before_echoing(gpt, tokenizer, tmp_path, capsys, search):
    """NaN weights make every logit NaN: sampling failed with torch's RuntimeError midway, and greedy search
    printed token 0 (pad, nothing) over and over and exited 0."""
    _, model = gpt
    broken = _save_with(
        tmp_path / "nan", model, tokenizer, lambda p: p["embed.tokens.weight"].fill_(float("nan"))
    )
    assert main(["generate", str(broken), "--prompt", "the cat", *search]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "weight embed.tokens.weight holds NaN or inf" in " ".join(err.split())


def test_zoo_generate_sampling_from_overflowing_logits_names_the_step(gpt, tokenizer, tmp_path, capsys):
    """Finite weights, infinite logits (as fp16 overflow gives): torch.multinomial's RuntimeError becomes a
    one-line error that says what happened and where."""
    _, model = gpt
    huge = _save_with(
        tmp_path / "inf", model, tokenizer, lambda p: p["decoder.final_norm.weight"].fill_(3e38)
    )
    assert main(["generate", str(huge), "--prompt", "the cat", "--sample", "--seed", "0"]) == 2
    out, err = capsys.readouterr()
    assert out == "the cat\n"  # the echoed prompt, its line ended before the error
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "NaN/inf logits at step 1" in " ".join(err.split())
