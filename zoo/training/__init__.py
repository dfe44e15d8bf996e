"""Training: configs, data, objectives, schedules, the loop (one process or torchrun), and the toy corpus.

    import zoo.training
    result = zoo.training.train("examples/translate.yaml")       # or a TrainConfig
    trainer = zoo.training.Trainer(config, callbacks=[MyCallback()], progress=False, sinks=["csv"])
    trainer.fit()

Names load on first use, so ``zoo.training.toy_corpus`` and ``zoo.training.bleu`` stay free of torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "TrainConfig": "zoo.training.config:TrainConfig",
    "ConfigError": "zoo.training.config:ConfigError",
    "DataError": "zoo.training.data:DataError",
    "Trainer": "zoo.training.loop:Trainer",
    "TrainResult": "zoo.training.records:TrainResult",
    "Callback": "zoo.training.records:Callback",
    "ProgressBar": "zoo.training.progress:ProgressBar",
    "CsvSink": "zoo.training.sinks:CsvSink",
    "JsonlSink": "zoo.training.sinks:JsonlSink",
    "TensorBoardSink": "zoo.training.sinks:TensorBoardSink",
    "SinkDependencyError": "zoo.training.sinks:SinkDependencyError",
    "train": "zoo.training.loop:train",
    "noam": "zoo.training.schedules:noam",
    "translate": "zoo.training.evaluate:translate",
    "corpus_bleu": "zoo.training.bleu:corpus_bleu",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'zoo.training' has no attribute {name!r}")
    module, attribute = _LAZY[name].split(":")
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
