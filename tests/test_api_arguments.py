"""The Python API with arguments of the wrong type or value: one line naming the argument and what it
accepts (a TypeError/ValueError the CLI prints), never torch's or pydantic's words from deep inside; and
``zoo.build`` respects the ambient device and dtype as ``nn.Module`` construction does."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

import zoo
from zoo.cli.errors import is_user_error, one_line
from zoo.devices import ArgumentTypeError
from zoo.generation.config import GenerationConfig
from zoo.spec import DecoderSpec, NormSpec


def absent_cuda() -> str:
    """A CUDA device this machine does not have (all of CUDA on a CPU machine)."""
    return f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda:7"


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("api")
    model = zoo.build("gpt2-tiny")
    zoo.save(model, root / "ckpt")
    zoo.to_hf(model, root / "hf")
    return {"zoo": root / "ckpt", "hf": root / "hf"}


def assert_one_clean_line(error: BaseException) -> None:
    """What the CLI would print: a user error, one line, no pydantic link or input repr."""
    assert is_user_error(error)
    text = one_line(error)
    assert "\n" not in text and "errors.pydantic.dev" not in text and "input_value" not in text


# -- zoo.build ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [42, None, 3.5, [1, 2], b"gpt2-tiny"])
def test_build_names_a_spec_of_the_wrong_type(spec: object) -> None:
    with pytest.raises(
        ArgumentTypeError, match=r"^spec must be a preset name, a spec file path .*; got"
    ) as error:
        zoo.build(spec)  # type: ignore[arg-type]
    assert isinstance(error.value, TypeError) and isinstance(error.value, ValueError)
    assert_one_clean_line(error.value)


def test_build_refuses_a_cuda_device_that_is_not_there() -> None:
    with pytest.raises(ValueError, match=rf"device '{absent_cuda()}' requested but"):
        zoo.build("gpt2-tiny", device=absent_cuda())


@pytest.mark.parametrize(
    ("dtype", "message"),
    [
        (torch.int64, r"dtype torch\.int64 is not a floating-point dtype"),
        (torch.bool, r"dtype torch\.bool is not a floating-point dtype"),
        ("int8", r"dtype 'int8' is not a dtype zoo builds in"),
        (5, r"dtype must be torch\.float32, .*; got int 5"),
    ],
)
def test_build_refuses_a_dtype_a_model_cannot_compute_in(dtype: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        zoo.build("gpt2-tiny", dtype=dtype)  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "dtype"), [("float16", torch.float16), ("bf16", torch.bfloat16)])
def test_build_takes_a_dtype_by_name(name: str, dtype: torch.dtype) -> None:
    model = zoo.build("gpt2-tiny", dtype=name)
    assert {p.dtype for p in model.parameters()} == {dtype}


@pytest.mark.parametrize("device", [3.5, object(), ["cpu"]])
def test_build_names_a_device_of_the_wrong_type(device: object) -> None:
    with pytest.raises(ArgumentTypeError, match=r"^device must be auto, cpu, cuda, cuda:N, mps or meta"):
        zoo.build("gpt2-tiny", device=device)  # type: ignore[arg-type]


def test_build_respects_an_ambient_meta_device() -> None:
    with torch.device("meta"):
        model = zoo.build("gpt2-tiny")
    assert {t.device.type for t in [*model.parameters(), *model.buffers()]} == {"meta"}


def test_an_explicit_device_wins_over_the_ambient_one() -> None:
    with torch.device("meta"):
        model = zoo.build("gpt2-tiny", device="cpu")
    assert {p.device.type for p in model.parameters()} == {"cpu"}


def test_build_respects_the_default_dtype_and_an_explicit_dtype_wins() -> None:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert {p.dtype for p in zoo.build("gpt2-tiny").parameters()} == {torch.float64}
        assert {p.dtype for p in zoo.build("gpt2-tiny", dtype=torch.float32).parameters()} == {torch.float32}
    finally:
        torch.set_default_dtype(previous)


# -- zoo.load, zoo.read_spec, zoo.from_hf --------------------------------------------------------------------


@pytest.mark.parametrize("read", [zoo.load, zoo.read_spec, zoo.from_hf, zoo.read_hf_spec])
@pytest.mark.parametrize("path", [5, None, 2.5])
def test_loaders_name_a_path_of_the_wrong_type(read, path: object) -> None:
    with pytest.raises(ArgumentTypeError, match=r"^zoo\.\w+: path must be a folder or file path"):
        read(path)


@pytest.mark.parametrize("kind", ["zoo", "hf"])
def test_loaders_refuse_an_integer_dtype(folders, kind: str) -> None:
    read = zoo.load if kind == "zoo" else zoo.from_hf
    with pytest.raises(ValueError, match=r"dtype torch\.int8 is not a floating-point dtype"):
        read(folders[kind], dtype=torch.int8)


@pytest.mark.parametrize("kind", ["zoo", "hf"])
def test_loaders_refuse_an_absent_cuda_device_in_one_line(folders, kind: str) -> None:
    """zoo.from_hf used to end in torch's `AssertionError: Torch not compiled with CUDA enabled`."""
    read = zoo.load if kind == "zoo" else zoo.from_hf
    with pytest.raises(ValueError, match=rf"device '{absent_cuda()}' requested but") as error:
        read(folders[kind], device=absent_cuda())
    assert_one_clean_line(error.value)


@pytest.mark.parametrize("kind", ["zoo", "hf"])
def test_loaders_under_an_ambient_meta_device_give_the_structure_without_reading(folders, kind: str) -> None:
    read = zoo.load if kind == "zoo" else zoo.from_hf
    with torch.device("meta"):
        model = read(folders[kind])
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert model.spec == zoo.build("gpt2-tiny").spec.model_copy(
        update={"name": model.spec.name, "source": model.spec.source}
    )
    assert {p.device.type for p in read(folders[kind], device="cpu").parameters()} == {"cpu"}


# -- pydantic models users construct ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "line"),
    [
        (lambda: GenerationConfig(num_beams=0), "num_beams: num_beams must be an int >= 1, got 0"),
        (lambda: GenerationConfig(top_k="5"), "top_k: top_k must be None or an int >= 0"),
        (
            lambda: GenerationConfig(repetition_penalty=math.inf),
            "repetition_penalty: Input should be a finite",
        ),
        (lambda: NormSpec(eps=-1.0), "eps: Input should be greater than 0"),
        (lambda: DecoderSpec(vocab_size=True), "vocab_size: Input should be a valid integer"),
        (lambda: NormSpec.model_validate({"eps": [1] * 10_000}), "eps: Input should be a valid number"),
    ],
)
def test_public_models_raise_a_clean_validation_error(make, line: str) -> None:
    with pytest.raises(ValidationError) as error:  # still pydantic's class, for existing `except`s
        make()
    text = str(error.value)
    assert line in text
    assert "errors.pydantic.dev" not in text and "input_value" not in text and "[1, 1, 1" not in text
    assert isinstance(error.value, ValueError)
    assert_one_clean_line(error.value)


def test_a_training_config_section_raises_a_clean_validation_error() -> None:
    from zoo.training.config import OptimConfig

    with pytest.raises(ValidationError) as error:
        OptimConfig(betas=(0.9, math.nan))
    assert str(error.value) == "invalid OptimConfig:\n  betas.1: Input should be a finite number"
