"""`zoo eval` on hostile task files: each is one `EvaluationError` naming the task, its file and what is wrong,
said before the model runs, never lm-eval's internal text (StopIteration, IndexError, "Sample larger than
population"), an "unknown task" or a traceback; an answer out of range is never scored as a miss in silence.

The tasks are local JSON-lines tasks written here (no download); the model is a tiny Llama and a tokenizer
trained on the few words they use.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import zoo
from zoo.io.tokenizer import Tokenizer, train_tokenizer

lm_eval = pytest.importorskip("lm_eval")

WORDS = ["the", "cat", "dog", "sat", "on", "mat", "a", "big", "small", "red"]
MC = (
    'output_type: multiple_choice\ndoc_to_text: "{{question}}"\ndoc_to_target: "{{answer}}"\n'
    'doc_to_choice: "{{choices}}"\nmetric_list:\n  - metric: acc\n'
)
GEN = (
    'output_type: generate_until\ndoc_to_text: "{{question}}"\ndoc_to_target: "{{answer}}"\n'
    "metric_list:\n  - metric: exact_match\n"
)


def documents(count: int = 5, *, answer: int | None = None) -> list[dict[str, Any]]:
    rows = [
        {"question": f"the {WORDS[i]} sat on", "choices": ["the mat", "a dog", "red", "big"], "answer": i % 4}
        for i in range(count)
    ]
    if answer is not None:
        rows[2]["answer"] = answer
    return rows


def write_task(
    folder: Path, name: str, body: str, rows: list[dict[str, Any]] | None = None, **keys: str
) -> Path:
    """``folder/name.yaml``, a task reading ``folder/name.jsonl`` (``rows``; default `documents`); ``keys``
    replace the header's lines (``dataset_path=""`` leaves it out)."""
    folder.mkdir(exist_ok=True)
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in (documents() if rows is None else rows)))
    header = {"task": name, "dataset_path": "json", **keys}
    lines = [f"{key}: {value}" for key, value in header.items() if value]
    lines += [
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n  cache_dir: {folder / 'cache'}",
        "test_split: test",
    ]
    path = folder / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n" + body)
    return path


@pytest.fixture(scope="module")
def model() -> tuple[Any, Tokenizer]:
    tok = train_tokenizer(iter([" ".join(WORDS)] * 20), kind="bpe", vocab_size=60, min_frequency=1)
    ids = {f"{name}_token_id": tok.special_ids()[name] for name in ("pad", "bos", "eos")}
    torch.manual_seed(0)
    spec = zoo.preset("llama-tiny", vocab_size=tok.vocab_size, max_positions=64, **ids)
    return zoo.build(spec).eval(), tok


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf-home"),
    }.items():
        monkeypatch.setenv(name, value)


def run(model: tuple[Any, Tokenizer], tasks: str, folder: Path, **kw: Any) -> dict[str, Any]:
    from zoo.evaluation import evaluate

    return evaluate(model[0], tasks, tokenizer=model[1], include_path=folder, bootstrap_iters=0, **kw)


def refused(model: tuple[Any, Tokenizer], tasks: str, folder: Path, match: str, **kw: Any) -> str:
    """The one-line message of the `EvaluationError` that running ``tasks`` raises, checked against ``match``."""
    from zoo.evaluation import EvaluationError

    with pytest.raises(EvaluationError, match=match) as caught:
        run(model, tasks, folder, **kw)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_task_without_dataset_path_names_its_file(model: Any, tmp_path: Path) -> None:
    """It was "its data could not be loaded: TypeError: expected str, bytes or os.PathLike object"."""
    path = write_task(tmp_path, "no_path", MC, dataset_path="")
    refused(model, "no_path", tmp_path, rf"task 'no_path' \({path}\): no dataset_path")


def test_an_empty_data_file_is_named(model: Any, tmp_path: Path) -> None:
    """It was "its data could not be loaded: StopIteration"."""
    write_task(tmp_path, "empty", MC, rows=[])
    refused(
        model,
        "empty",
        tmp_path,
        rf"task 'empty' \(.*empty\.yaml\): its data file {tmp_path}/empty\.jsonl is empty",
    )


@pytest.mark.parametrize("answer", [7, -1])
def test_an_answer_index_out_of_range_is_named_with_its_document(
    model: Any, tmp_path: Path, answer: int
) -> None:
    """lm-eval logged a warning (hidden by zoo eval) and scored the document as a miss."""
    write_task(tmp_path, "mc", MC, rows=documents(answer=answer))
    refused(
        model,
        "mc",
        tmp_path,
        rf"task 'mc' \(.*mc\.yaml\): document 2's answer \({answer}\) is not an index into its 4 choices",
    )


def test_a_generated_answer_index_out_of_range_is_named_with_its_document(model: Any, tmp_path: Path) -> None:
    """generate_until with doc_to_choice reads choices[answer]: it was an IndexError traceback at scoring."""
    body = GEN + 'doc_to_choice: "{{choices}}"\ngeneration_kwargs:\n  until: ["."]\n  max_gen_toks: 2\n'
    write_task(tmp_path, "gen", body, rows=documents(answer=9))
    refused(model, "gen", tmp_path, r"task 'gen' \(.*gen\.yaml\): document 2's answer \(9\) is not an index")


def test_more_fewshot_examples_than_the_task_holds_is_refused_naming_both(model: Any, tmp_path: Path) -> None:
    """It was lm-eval's "Sample larger than population or is negative", after the model was built."""
    write_task(tmp_path, "mc", MC)
    refused(
        model,
        "mc",
        tmp_path,
        r"task 'mc' \(.*mc\.yaml\): num_fewshot 100 is more than the 5 documents its few-shot examples are "
        r"drawn from",
        num_fewshot=100,
    )
    assert run(model, "mc", tmp_path, num_fewshot=5, limit=1)["n-shot"]["mc"] == 5  # all 5: still fine


def include_loops(folder: Path) -> None:
    (folder / "loop.yaml").write_text("include: loop.yaml\ntask: loop\n")
    (folder / "a.yaml").write_text("include: b.yaml\ntask: a_task\n")
    (folder / "b.yaml").write_text("include: a.yaml\n")
    (folder / "gone.yaml").write_text("include: nowhere.yaml\ntask: gone\n")
    (folder / "fine.yaml").write_text("include: b_fine.yaml\ntask: fine\n")
    (folder / "b_fine.yaml").write_text("dataset_path: json\n")


def test_include_loops_and_missing_includes_are_each_named_once(tmp_path: Path) -> None:
    from zoo.evaluation.task_checks import include_problems

    include_loops(tmp_path)
    assert include_problems([tmp_path]) == [
        f"{tmp_path}/a.yaml -> b.yaml -> a.yaml: includes itself",
        f"{tmp_path}/gone.yaml -> nowhere.yaml: no such file",
        f"{tmp_path}/loop.yaml -> loop.yaml: includes itself",
    ]


def test_task_files_that_are_not_yaml_are_each_named_with_their_line(tmp_path: Path) -> None:
    """What an unknown task's error adds (the whole error, which reads lm-eval's index, is in test_lm_eval,
    slow); lm-eval's own ``!function`` tag is YAML it reads."""
    from zoo.evaluation.harness import _unreadable_task_files

    (tmp_path / "broken.yaml").write_text("task: my_broken\ndataset_path: json\n  bad: [indent\n")
    (tmp_path / "fine.yaml").write_text("task: fine\nprocess_docs: !function utils.process\n")
    (tmp_path / "nested").mkdir()
    (tmp_path / "nested" / "tab.yml").write_text("task: tab\n\tdataset_path: json\n")
    assert _unreadable_task_files([str(tmp_path)]) == [
        f"{tmp_path}/broken.yaml: line 3: mapping values are not allowed here",
        f"{tmp_path}/nested/tab.yml: line 2: found character '\\t' that cannot start any token",
    ]


@pytest.mark.slow  # an unknown task reads lm-eval's index of its ~15,000 built-in task files (6 s or more)
def test_a_task_file_that_includes_itself_names_the_cycle(model: Any, tmp_path: Path) -> None:
    """lm-eval skipped the file (a log line), leaving "unknown task"."""
    include_loops(tmp_path)
    message = refused(model, "loop", tmp_path, r"unknown task 'loop'.*includes itself")
    assert f"{tmp_path}/loop.yaml -> loop.yaml" in message
    assert f"{tmp_path}/a.yaml -> b.yaml -> a.yaml" in message


@pytest.mark.parametrize(
    ("kwargs", "found"),
    [
        ("{until: 5, max_gen_toks: 2}", "5"),
        ("{until: {a: b}, max_gen_toks: 2}", r"\{'a': 'b'\}"),  # was read as its keys, ['a']
        ("{until: [1, 2], max_gen_toks: 2}", r"\[1, 2\]"),
    ],
)
def test_generate_until_whose_until_is_not_strings_is_refused_before_the_model_runs(
    model: Any, tmp_path: Path, kwargs: str, found: str
) -> None:
    write_task(tmp_path, "gen", GEN + f"generation_kwargs: {kwargs}\n")
    refused(
        model,
        "gen",
        tmp_path,
        rf"task 'gen' \(.*gen\.yaml\): generation_kwargs\.until must be a string or a list of strings; got {found}",
    )


def test_generation_kwargs_that_are_not_a_mapping_are_named(model: Any, tmp_path: Path) -> None:
    """It was "its data could not be loaded: TypeError: 'str' object does not support item assignment"."""
    write_task(tmp_path, "gen", GEN + "generation_kwargs: hello\n")
    refused(model, "gen", tmp_path, r"task 'gen' \(.*gen\.yaml\): generation_kwargs must be a mapping")


def test_a_chat_template_nested_past_pythons_stack_is_one_error_naming_it(model: Any, tmp_path: Path) -> None:
    """--apply-chat-template with a template nested thousands deep: Jinja's parser recursed into a raw
    RecursionError (a recursive macro was already one line: rendering was guarded, compiling was not)."""
    from zoo.io.tokenizer import ChatTemplateError

    write_task(tmp_path, "mc", MC)
    tok = Tokenizer(model[1].hf, chat_template="{{ " + "(" * 3000 + "1" + ")" * 3000 + " }}")
    tok.source = "deep/tokenizer_config.json"
    with pytest.raises(
        ChatTemplateError, match=r"deep/tokenizer_config.json: the chat template is nested too"
    ) as caught:
        run((model[0], tok), "mc", tmp_path, apply_chat_template=True, limit=1)
    assert "\n" not in str(caught.value)
