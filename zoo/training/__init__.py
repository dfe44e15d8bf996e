"""Training: configs, data, objectives, schedules, and the loop (one process or torchrun).

    import zoo.training
    result = zoo.training.train("examples/translate.yaml")       # or a TrainConfig
    trainer = zoo.training.Trainer(config, callbacks=[MyCallback()], progress=False, sinks=["csv"])
    trainer.fit()

Names load on first use, so ``zoo.training.config`` and ``zoo.training.bleu`` stay free of torch.
"""

from __future__ import annotations

from zoo._lazy import lazy_exports

_LAZY = {
    "TrainConfig": "zoo.training.config:TrainConfig",
    "ConfigError": "zoo.training.config:ConfigError",
    "DataError": "zoo.training.data:DataError",
    "Trainer": "zoo.training.loop:Trainer",
    "TrainResult": "zoo.training.records:TrainResult",
    "Callback": "zoo.training.records:Callback",
    "TrainerState": "zoo.training.state:TrainerState",
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


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
