"""Evaluation with lm-evaluation-harness: zoo models on lm-eval's tasks, scored as its ``hf`` model scores them.

    results = zoo.evaluation.evaluate("runs/gpt/final", tasks=["hellaswag"], batch_size=16)
    lm_eval.simple_evaluate(model="zoo", model_args="pretrained=runs/gpt/final", tasks=[...])  # after
    import zoo.evaluation.lm_eval                                                             # (registers "zoo")

One job a module:

    lm_eval.py     `ZooLM`, lm-eval's ``LM`` over a zoo decoder and tokenizer, registered as model "zoo"
    scoring.py     log-likelihoods of continuations: a batch of requests, one forward pass
    generating.py  generate_until: left-padded prompts, the KV cache, stop strings
    harness.py     `evaluate` (what ``zoo eval`` runs), task loading, `result_rows`
    task_checks.py what is wrong with a task file or a loaded task, said before the model runs
    errors.py      `EvaluationError`, and the one-line refusal when lm-eval is not installed

lm-evaluation-harness is the ``eval`` extra (``pip install -e '.[eval]'``), imported on first use.
docs/evaluation.md has the details and what matches lm-eval's ``hf`` model.
"""

from __future__ import annotations

from zoo._lazy import lazy_exports
from zoo.evaluation.errors import INSTALL_HINT, EvaluationError, LmEvalMissingError

_LAZY = {
    "ZooLM": "zoo.evaluation.lm_eval:ZooLM",
    "evaluate": "zoo.evaluation.harness:evaluate",
    "load_tasks": "zoo.evaluation.harness:load_tasks",
    "result_rows": "zoo.evaluation.harness:result_rows",
    "results_json": "zoo.evaluation.harness:results_json",
}

__all__ = ["INSTALL_HINT", "EvaluationError", "LmEvalMissingError", *_LAZY]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, eager=__all__)
