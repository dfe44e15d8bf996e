"""What is wrong with an lm-eval task, said in one line naming the task and its file, before the model runs.

lm-eval reports a bad task file in its own words, or not at all: a file it cannot read is skipped with a log
line ("unknown task" follows), a task without ``dataset_path`` or with an empty data file fails inside
``datasets`` (a TypeError, a StopIteration), more few-shot examples than the task holds are "Sample larger
than population", an answer index past the choices is logged and scored as a miss (or, for
``generate_until``, an IndexError at scoring), an ``until`` that is not strings a TypeError mid-run.

    include_problems(folders)            task files whose ``include:`` chain loops or names no file
    why_not_loaded(manager, name)        why a task's data could not be loaded, when its file says
    check_loaded(task, manager, ...)     a loaded task's documents, few-shot pool, answers and ``until``

Each reads the task files as lm-eval does (``include:`` relative to the including file, its keys first and
the file's own winning), with YAML's safe loader (lm-eval's ``!function`` tags are read as nothing).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from zoo.evaluation.errors import EvaluationError

_INDEX = re.compile(r"-?\d+")
_SMALL_FILE = 1 << 20  # a data file this small is read to see whether it holds anything but blanks


# --- task files ----------------------------------------------------------------------------------------------


def _load(path: Path) -> Any:
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    return yaml.load(path.read_text(encoding="utf-8", errors="replace"), Loader=Loader)  # a SafeLoader


def _includes(config: Any, path: Path) -> list[Path]:
    """The files ``config`` (read from ``path``) includes, resolved as lm-eval resolves them."""
    if not isinstance(config, dict) or "include" not in config:
        return []
    items = config["include"] if isinstance(config["include"], list) else [config["include"]]
    return [Path(item) if Path(str(item)).is_absolute() else path.parent / str(item) for item in items]


def _shown(chain: Sequence[Path]) -> str:
    """``first -> second -> ...``: the first file in full, the others relative to its folder when inside it."""
    base = chain[0].parent
    rest = [str(p.relative_to(base)) if p.is_relative_to(base) else str(p) for p in chain[1:]]
    return " -> ".join([str(chain[0]), *rest])


def include_problems(folders: Iterable[str | Path]) -> list[str]:
    """``"a.yaml -> b.yaml -> a.yaml: includes itself"`` for each include cycle among the YAML files under
    ``folders`` (each cycle once), and ``"a.yaml -> gone.yaml: no such file"`` for an include that names none:
    lm-eval skips such a file with a log line."""
    problems: list[str] = []
    cycles: set[frozenset[Path]] = set()
    for folder in folders:
        for file in sorted(Path(folder).rglob("*.y*ml")):
            chain = [file.resolve()]
            shown = [file]
            _walk(chain, shown, problems, cycles)
    return problems


def _walk(chain: list[Path], shown: list[Path], problems: list[str], cycles: set[frozenset[Path]]) -> None:
    try:
        config = _load(chain[-1])
    except Exception:  # not YAML (reported by the caller's own scan), unreadable: lm-eval skips it too
        return
    for included, spelled in zip(_includes(config, chain[-1]), _includes(config, shown[-1])):
        target = included.resolve()
        if target in chain:  # a cycle: reported once, from its first file in the walk's order
            loop = chain[chain.index(target) :]
            if frozenset(loop) not in cycles and len(chain) == len(loop):
                cycles.add(frozenset(loop))
                problems.append(f"{_shown([*shown, spelled])}: includes itself")
            continue
        if not target.is_file():
            if len(chain) == 1:
                problems.append(f"{_shown([*shown, spelled])}: no such file")
            continue
        if len(chain) < 64:  # deeper chains are lm-eval's to refuse
            _walk([*chain, target], [*shown, spelled], problems, cycles)


def task_config(path: Path, depth: int = 0) -> dict[str, Any] | None:
    """The task file's settings with its includes merged (theirs first, its own winning); None when it or
    an include cannot be read."""
    try:
        config = _load(path)
    except Exception:
        return None
    if not isinstance(config, dict) or depth > 64:
        return None
    merged: dict[str, Any] = {}
    for included in _includes(config, path):
        inner = task_config(included, depth + 1) if included.is_file() else None
        if inner is None:
            return None
        inner.pop("task_list", None)
        merged.update(inner)
    merged.update({key: value for key, value in config.items() if key != "include"})
    return merged


def task_file(manager: Any, name: str) -> Path | None:
    """The YAML file lm-eval's index found task ``name`` in (None: none, or a task defined in Python)."""
    index = getattr(manager, "task_index", None) or {}
    entry = index.get(name)
    path = entry.get("yaml_path") if isinstance(entry, dict) else getattr(entry, "yaml_path", None)
    return Path(path) if isinstance(path, str | Path) and str(path) not in ("", "-1") else None


def _where(name: str, file: Path | None) -> str:
    return f"task {name!r} ({file})" if file is not None else f"task {name!r}"


# --- before loading: why the data could not be had -----------------------------------------------------------


def why_not_loaded(manager: Any, name: str) -> str | None:
    """What the task file of ``name`` says is wrong, when lm-eval could not load the task (None: nothing
    found, lm-eval's own error stands)."""
    file = task_file(manager, name)
    config = task_config(file) if file is not None else None
    if config is None or "task" not in config or "class" in config:
        return None
    where = _where(name, file)
    if not config.get("dataset_path"):
        return (
            f"{where}: no dataset_path: name the data set to read (json, csv or parquet with "
            "dataset_kwargs.data_files, or a Hugging Face data set)"
        )
    generation = config.get("generation_kwargs")
    if generation is not None and not isinstance(generation, dict):
        return (
            f"{where}: generation_kwargs must be a mapping (until, max_gen_toks, do_sample, ...); got "
            f"{generation!r}"
        )
    for data in _data_files(config):
        if not data.exists():
            return f"{where}: its data file {data} does not exist"
        if data.is_file() and _blank(data):
            return f"{where}: its data file {data} is empty (no documents)"
    return None


def _data_files(config: dict[str, Any]) -> list[Path]:
    """The local files named in ``dataset_kwargs.data_files`` (patterns and URLs left out)."""
    kwargs = config.get("dataset_kwargs")
    files = kwargs.get("data_files") if isinstance(kwargs, dict) else None
    values = files.values() if isinstance(files, dict) else [files]
    names = [n for v in values for n in (v if isinstance(v, list) else [v]) if isinstance(n, str)]
    return [Path(n).expanduser() for n in names if "://" not in n and not any(c in n for c in "*?[")]


def _blank(path: Path) -> bool:
    size = path.stat().st_size
    return size == 0 or (size < _SMALL_FILE and not path.read_bytes().strip())


# --- after loading: documents, few-shot examples, answers, generation settings -------------------------------


def check_loaded(
    task: Any,
    manager: Any,
    *,
    num_fewshot: int | None,
    limit: int | float | None,
    gen_kwargs: dict[str, Any] | None = None,
) -> None:
    """Refuse a loaded task whose run would fail inside lm-eval or score in silence: no documents, more
    few-shot examples than its pool holds, an answer that is no index into its choices, an ``until`` that
    is not strings. An `EvaluationError` naming the task and its file."""
    config = task.config
    name = str(getattr(task, "task_name", None) or config.task)
    where = _where(name, task_file(manager, name))
    docs = task.eval_docs
    if len(docs) == 0:
        raise EvaluationError(f"{where}: its evaluation split holds no documents")
    shots = _shots(config, num_fewshot)
    pool = _fewshot_pool(task) if shots else []
    if shots:
        available, drawn_from = len(pool), "documents its few-shot examples are drawn from"
        if _removes_the_question(task):
            available, drawn_from = available - 1, f"{drawn_from} (less the question itself)"
        if shots > available:
            raise EvaluationError(
                f"{where}: num_fewshot {shots} is more than the {available} {drawn_from}; give at most "
                f"{available} (--num-fewshot)"
            )
    output = getattr(task, "OUTPUT_TYPE", None) or config.output_type
    if output == "generate_until":
        _check_until({**(config.generation_kwargs or {}), **(gen_kwargs or {})}, where)
    scored = output == "multiple_choice"
    chooses = scored or (output == "generate_until" and config.doc_to_choice is not None)
    if chooses and not getattr(task, "multiple_input", False):
        for i, doc in enumerate(_first(docs, _count(len(docs), limit))):
            _check_answer(task, doc, f"{where}: document {i}'s", scored=scored)
        for i, doc in enumerate(pool):
            _check_answer(task, doc, f"{where}: few-shot document {i}'s", scored=scored)


def _shots(config: Any, num_fewshot: int | None) -> int:
    """The examples lm-eval will put before each question (``simple_evaluate``'s rule: a task whose own
    setting is 0 keeps it)."""
    own = getattr(config, "num_fewshot", None)
    if num_fewshot is not None and own != 0:
        return num_fewshot
    return own or 0


def _fewshot_pool(task: Any) -> list[Any]:
    sampler = getattr(task, "sampler", None)
    if sampler is not None and hasattr(sampler, "fewshot_docs"):
        return list(sampler.fewshot_docs())
    docs = task.fewshot_docs()
    return list(docs) if docs is not None else []


def _removes_the_question(task: Any) -> bool:
    """Whether lm-eval draws one extra few-shot example to leave out the question itself (the few-shot
    split is the one evaluated)."""
    settings = getattr(task, "fewshot_cfg", None)
    split = getattr(settings, "split", None) if settings is not None else None
    split = split if split is not None else getattr(task.config, "fewshot_split", None)
    return split is not None and split == task.config.test_split


def _count(total: int, limit: int | float | None) -> int:
    if limit is None:
        return total
    return min(total, math.ceil(total * limit) if limit < 1 else int(limit))


def _first(docs: Any, count: int) -> Iterable[Any]:
    for i, doc in enumerate(docs):
        if i >= count:
            return
        yield doc


def _check_answer(task: Any, doc: Any, whose: str, *, scored: bool) -> None:
    """An answer must be an index into the document's choices, or (``scored``: a multiple-choice task, which
    looks a text answer up) one of them."""
    try:
        choices, gold = task.doc_to_choice(doc), task.doc_to_target(doc)
    except Exception:  # a template that fails on this document: lm-eval says so, if it ever reads it
        return
    for answer in gold if isinstance(gold, list) else [gold]:
        if isinstance(answer, int) and not isinstance(answer, bool):
            if 0 <= answer < len(choices):
                continue
        elif scored and isinstance(answer, str) and answer in choices:
            continue
        index = isinstance(answer, int) or bool(_INDEX.fullmatch(str(answer)))
        what = f"an index into its {len(choices)} choices" if index else f"one of its {len(choices)} choices"
        raise EvaluationError(
            f"{whose} answer ({answer if index else repr(answer)}) is not {what} (lm-eval would score it as "
            "a miss, or fail)"
        )


def _check_until(generation: dict[str, Any], where: str) -> None:
    until = generation.get("until")
    if until is None or isinstance(until, str):
        return
    if not isinstance(until, list | tuple) or not all(isinstance(stop, str) for stop in until):
        raise EvaluationError(
            f"{where}: generation_kwargs.until must be a string or a list of strings; got {until!r}"
        )
