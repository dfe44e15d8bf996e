"""`evaluate`: lm-evaluation-harness tasks run on a zoo model, in one call (what ``zoo eval`` runs).

    results = zoo.evaluation.evaluate("runs/gpt/final", tasks=["hellaswag", "arc_easy"], batch_size=16)
    results = zoo.evaluation.evaluate(model, tokenizer=tok, tasks=["my_task"], include_path="tasks/")
    for task, metric, value, stderr in zoo.evaluation.result_rows(results): ...

Tasks are found by lm-eval's `TaskManager`: the folders of ``include_path`` (YAML task files) first, then
lm-eval's built-in tasks, whose index (some 15,000 YAML files, a few seconds) is read only when a task is
not among the included ones. Each task is loaded on its own so that one whose data cannot be had (a
download while offline, a missing file) is one `EvaluationError` naming it. The results are lm-eval's own
dictionary (``results``, ``configs``, ``versions``, ``n-shot``, ``higher_is_better``, ...), as
``lm_eval.simple_evaluate`` returns it.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zoo.evaluation.errors import EvaluationError, LmEvalMissingError, missing_lm_eval
from zoo.evaluation.task_checks import check_loaded, include_problems, why_not_loaded

if TYPE_CHECKING:
    from zoo.io.tokenizer import Tokenizer
    from zoo.models.base import ZooModel

PathLike = str | os.PathLike[str]

# Result keys that are not metrics: a task's name, its alias, how many samples it scored.
_NOT_METRICS = ("alias", "name", "sample_len", "samples")
# lm-eval's seeds, all set by `evaluate`'s ``seed``
_SEEDS = ("random_seed", "numpy_random_seed", "torch_random_seed", "fewshot_random_seed")


def evaluate(
    model: PathLike | ZooModel | Any,
    tasks: str | Sequence[str],
    *,
    tokenizer: Tokenizer | PathLike | None = None,
    include_path: PathLike | Sequence[PathLike] | None = None,
    num_fewshot: int | None = None,
    limit: int | float | None = None,
    batch_size: int = 1,
    device: str | None = None,
    dtype: str | None = None,
    seed: int | None = None,
    bootstrap_iters: int = 100_000,
    log_samples: bool = False,
    gen_kwargs: dict[str, Any] | None = None,
    apply_chat_template: bool | str = False,
    fewshot_as_multiturn: bool = False,
    system_instruction: str | None = None,
) -> dict[str, Any]:
    """Run lm-eval ``tasks`` on ``model`` and return lm-eval's results dictionary.

    Args:
        model: a folder (zoo checkpoint or Hugging Face, with its tokenizer), a zoo decoder (with
            ``tokenizer``), or an lm-eval ``LM`` (a `ZooLM` built by hand, or any other).
        tasks: task, group or tag names (a list, or one string of names joined by commas).
        include_path: folders of task definitions (YAML files) of your own, e.g. local JSON data sets.
        num_fewshot: examples put before each question (None: the task's own setting).
        limit: documents per task, or a fraction of them when < 1 (None: all).
        batch_size, device, dtype: as `ZooLM` takes them.
        seed: seeds Python's, numpy's, torch's and the few-shot sampler's generators (None: lm-eval's
            defaults, 0 / 1234 / 1234 / 1234).
        bootstrap_iters: resamples for the standard errors of metrics without a closed form (0: none).
        log_samples: keep every request and response under ``"samples"``.
        gen_kwargs: generation settings that override the tasks' own (``{"max_gen_toks": 64}``).
        apply_chat_template: render each prompt with the tokenizer's chat template, as an instruction-tuned
            model is asked (True; or the name of one of its templates); zoo's default template for a tokenizer
            without one. ``fewshot_as_multiturn``: the few-shot examples as earlier turns of the chat;
            ``system_instruction``: a system message before them.
    """
    # Everything that can be checked without lm-eval first: importing it takes seconds, indexing its tasks
    # more, loading the model more still.
    names = _task_names(tasks)
    limit = _check_arguments(
        num_fewshot=num_fewshot,
        bootstrap_iters=bootstrap_iters,
        seed=seed,
        limit=limit,
        apply_chat_template=apply_chat_template,
        fewshot_as_multiturn=fewshot_as_multiturn,
    )
    _check_sources(model, names, include_path)
    lm_eval = _import_lm_eval()
    from zoo.evaluation.lm_eval import ZooLM

    manager, loaded, leaves = _load_tasks(names, include_path)  # before the model: a bad task costs nothing
    for task in leaves:  # what would fail inside lm-eval, or score in silence, said now
        check_loaded(task, manager, num_fewshot=num_fewshot, limit=limit, gen_kwargs=gen_kwargs)
    lm = (
        model
        if isinstance(model, lm_eval.api.model.LM)
        else ZooLM(model, tokenizer, batch_size=batch_size, device=device, dtype=dtype)
    )
    seeds = {} if seed is None else dict.fromkeys(_SEEDS, seed)
    results = lm_eval.simple_evaluate(
        model=lm,
        tasks=loaded,
        task_manager=manager,  # else lm-eval indexes its ~15,000 built-in task files again
        num_fewshot=num_fewshot,
        limit=limit,
        bootstrap_iters=bootstrap_iters,
        log_samples=log_samples,
        gen_kwargs=gen_kwargs,
        apply_chat_template=apply_chat_template,
        fewshot_as_multiturn=fewshot_as_multiturn,
        system_instruction=system_instruction,
        **seeds,
    )
    if results is None:  # only on a rank other than 0 of a distributed run, which this is not
        raise EvaluationError("lm-eval returned no results")
    return dict(results)


def _check_arguments(
    *,
    num_fewshot: int | None,
    bootstrap_iters: int,
    seed: int | None,
    limit: int | float | None,
    apply_chat_template: bool | str,
    fewshot_as_multiturn: bool,
) -> int | float | None:
    """`evaluate`'s numbers and chat settings, checked; returns ``limit`` as lm-eval takes it (a float of
    1 or more: a number of documents)."""
    _check_number(num_fewshot, "num_fewshot", minimum=0)
    _check_number(bootstrap_iters, "bootstrap_iters", minimum=0)
    _check_number(seed, "seed", minimum=0)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int | float) or limit <= 0):
        raise EvaluationError(
            f"limit must be a number of documents (>= 1) or a fraction (< 1); got {limit!r}"
        )
    if fewshot_as_multiturn and not apply_chat_template:
        raise EvaluationError("fewshot_as_multiturn needs apply_chat_template (the turns are a chat's)")
    return int(limit) if isinstance(limit, float) and limit >= 1 else limit


def _check_sources(
    model: object, names: Sequence[str], include_path: PathLike | Sequence[PathLike] | None
) -> None:
    """A model folder that is missing or lacks its tokenizer, and a task name that no task file holds: said
    in about a second, before lm-eval is imported or anything loads."""
    if isinstance(model, str | os.PathLike):
        from zoo.io.pretrained import pretrained_kind

        pretrained_kind(model)
    _refuse_unknown(names, _include_paths(include_path))


def load_tasks(names: Sequence[str], include_path: PathLike | Sequence[PathLike] | None = None) -> list[Any]:
    """lm-eval's task (or group) objects for ``names``, each loaded on its own, data included.

    An unknown name, or a task whose data cannot be loaded, is an `EvaluationError` naming the task.
    """
    return _load_tasks(_task_names(names), include_path)[1]


def _load_tasks(
    names: Sequence[str], include_path: PathLike | Sequence[PathLike] | None
) -> tuple[Any, list[Any], list[Any]]:
    """The `TaskManager` that found ``names``, their task (or group) objects (see `load_tasks`), and every
    task among them, groups' members included."""
    lm_eval = _import_lm_eval()
    folders = _include_paths(include_path)
    manager = None
    if folders:
        manager = lm_eval.tasks.TaskManager(include_path=folders, include_defaults=False)
    if manager is None or any(name not in manager.all_tasks for name in names):
        with _quiet("lm_eval"):  # the built-in index warns about its own duplicate names
            manager = lm_eval.tasks.TaskManager(include_path=folders or None)
    unknown = [name for name in names if name not in manager.all_tasks and not Path(name).is_file()]
    if unknown:
        where = f" nor in --include-path {', '.join(folders)}" if folders else ""
        broken = _unreadable_task_files(folders)  # lm-eval skips a file it cannot parse, with a log line
        why = f"; not valid YAML, so not read: {'; '.join(broken)}" if broken else ""
        looped = include_problems(folders)  # or whose include: chain loops or names no file
        why += f"; not read, for its include: {'; '.join(looped)}" if looped else ""
        raise EvaluationError(
            f"unknown task {', '.join(map(repr, unknown))}: not one of lm-eval's tasks, groups or tags{where} "
            f"(`lm-eval ls tasks` lists them){why}"
        )
    objects: list[Any] = []
    leaves: dict[str, Any] = {}
    for name in names:
        try:
            found = manager.load([name])
        except Exception as error:  # datasets raises many kinds (ConnectionError, its own, OSError...)
            said = why_not_loaded(manager, name)  # what the task file shows, where it shows it
            if said is not None:
                raise EvaluationError(said) from error
            raise EvaluationError(f"task {name!r}: its data could not be loaded: {_reason(error)}") from error
        if name in found["groups"]:
            objects.append(found["groups"][name])
        else:
            objects.extend(found["tasks"].values())
        leaves.update(found["tasks"])
    return manager, objects, list(leaves.values())


def result_rows(results: dict[str, Any]) -> list[tuple[str, str, float | str, float | None]]:
    """(task, metric, value, stderr) for every metric in lm-eval's ``results``, groups included.

    The metric is lm-eval's name with its filter when that is not the default ``none``
    (``exact_match,strict-match``); stderr is None where lm-eval gives none ("N/A", or no bootstrap).
    """
    rows: list[tuple[str, str, float | str, float | None]] = []
    sections = [results.get("results", {}), results.get("groups", {})]
    seen: set[str] = set()
    for section in sections:
        for task, metrics in section.items():
            if task in seen:
                continue
            seen.add(task)
            for key, value in metrics.items():
                metric, _, filter_name = key.partition(",")
                if key in _NOT_METRICS or metric.endswith("_stderr") or not filter_name:
                    continue
                stderr = metrics.get(f"{metric}_stderr,{filter_name}")
                name = metric if filter_name == "none" else f"{metric},{filter_name}"
                ok = (
                    isinstance(stderr, int | float) and not isinstance(stderr, bool) and math.isfinite(stderr)
                )
                rows.append(
                    (str(metrics.get("alias", task)).strip(), name, value, float(stderr) if ok else None)
                )
    return rows


def _import_lm_eval() -> Any:
    try:
        import lm_eval
        import lm_eval.api.model
        import lm_eval.tasks
    except ModuleNotFoundError as error:
        if missing_lm_eval(error):
            raise LmEvalMissingError() from None
        raise
    return lm_eval


def _refuse_unknown(names: Sequence[str], folders: Sequence[str]) -> None:
    """An `EvaluationError` for the names that no file of lm-eval's tasks contains, found in about a second.

    lm-eval's index takes every task, group and tag name from its task files (``task:``, ``group:``,
    ``tag:``, in YAML files and the files they include, whatever their names); building it parses some
    15,000 files (ten seconds and more). A name that none of the files under lm-eval's ``tasks`` folder
    contains as text cannot be in it. With ``include_path`` folders this is not tried: their files may
    include files from anywhere; lm-eval's own check (`_load_tasks`) has the last word on every name.
    """
    import importlib.util

    found = importlib.util.find_spec("lm_eval")
    if found is None or not found.submodule_search_locations:
        raise LmEvalMissingError()
    wanted = {name: name.encode() for name in names if not Path(name).is_file()}
    if folders or not wanted:
        return
    for file in (Path(found.submodule_search_locations[0]) / "tasks").rglob("*"):
        if file.suffix in (".py", ".pyc") or not file.is_file():
            continue
        try:
            text = file.read_bytes()
        except OSError:  # unreadable: lm-eval's index cannot read it either
            continue
        wanted = {name: raw for name, raw in wanted.items() if raw not in text}
        if not wanted:
            return
    raise EvaluationError(
        f"unknown task {', '.join(map(repr, wanted))}: not one of lm-eval's tasks, groups or tags "
        "(`lm-eval ls tasks` lists them)"
    )


def _task_names(tasks: str | Sequence[str]) -> list[str]:
    items = tasks.split(",") if isinstance(tasks, str) else list(tasks)
    if not all(isinstance(item, str) for item in items):
        raise EvaluationError(f"tasks must be task names (strings); got {tasks!r}")
    names = [item.strip() for item in items if item.strip()]
    if not names:
        raise EvaluationError("tasks: no task named (e.g. tasks=['hellaswag'] or 'arc_easy,piqa')")
    return list(dict.fromkeys(names))  # a task named twice runs once


def _unreadable_task_files(folders: Sequence[str]) -> list[str]:
    """``"file: line N: problem"`` for each YAML file under ``folders`` that does not parse (lm-eval's own
    tags, ``!function``, are accepted as they are)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    broken = []
    for folder in folders:
        for file in sorted(Path(folder).rglob("*.y*ml")):
            try:
                yaml.load(file.read_text(encoding="utf-8", errors="replace"), Loader=Loader)  # a SafeLoader
            except yaml.YAMLError as error:
                mark = getattr(error, "problem_mark", None)
                line = f"line {mark.line + 1}: " if mark is not None else ""
                broken.append(f"{file}: {line}{getattr(error, 'problem', None) or error}")
    return broken


def _include_paths(include_path: PathLike | Sequence[PathLike] | None) -> list[str]:
    if include_path is None:
        return []
    items = [include_path] if isinstance(include_path, str | os.PathLike) else list(include_path)
    folders = []
    for item in items:
        path = Path(item).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"--include-path {path}: no such folder (of lm-eval task YAML files)")
        if not path.is_dir():  # lm-eval walks folders: a file given here was never read
            raise EvaluationError(
                f"--include-path {path}: a file; give the folder that holds it (lm-eval reads the task "
                "files of a folder)"
            )
        folders.append(str(path))
    return folders


def _check_number(value: object, name: str, *, minimum: int) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
        raise EvaluationError(f"{name} must be an int >= {minimum} or None; got {value!r}")


def _reason(error: BaseException) -> str:
    """An exception's first line, with its type when the message alone says little."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class _quiet:
    """Raise a logger's level to ERROR inside a ``with`` block."""

    def __init__(self, name: str) -> None:
        self.logger = logging.getLogger(name)

    def __enter__(self) -> None:
        self.level = self.logger.level
        self.logger.setLevel(logging.ERROR)

    def __exit__(self, *exc: object) -> None:
        self.logger.setLevel(self.level)


def results_json(results: dict[str, Any]) -> str:
    """lm-eval's results as JSON text (numpy numbers as numbers; anything else JSON lacks as its str)."""
    import json

    def plain(value: Any) -> Any:
        item = getattr(value, "item", None)  # numpy and torch scalars
        if callable(item):
            try:
                return item()
            except (TypeError, ValueError):
                pass
        return str(value)

    return json.dumps(results, indent=2, ensure_ascii=False, default=plain) + "\n"
