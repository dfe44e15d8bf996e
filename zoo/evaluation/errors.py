"""What `zoo.evaluation` raises: one error type for a task, a setting or a request it cannot evaluate, and the
one-line refusal when lm-evaluation-harness is not installed."""

from __future__ import annotations

from zoo._extras import install_hint

INSTALL_HINT = f"evaluation needs lm-evaluation-harness: {install_hint('eval')}"


class EvaluationError(ValueError):
    """A task, a setting or a request that cannot be evaluated; the message names it and what was expected
    (a ValueError, so the CLI reports it in one line)."""


class LmEvalMissingError(EvaluationError, ImportError):
    """lm-evaluation-harness is not installed (an ``ImportError`` too): the message says how to install it."""

    def __init__(self) -> None:
        super().__init__(INSTALL_HINT)


def missing_lm_eval(error: ModuleNotFoundError) -> bool:
    """Whether ``error`` is lm_eval itself being absent (not a module lm_eval failed to import)."""
    return (error.name or "").split(".")[0] == "lm_eval"
