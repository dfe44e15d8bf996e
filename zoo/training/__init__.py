"""Training: configs, data, objectives, schedules, and the loop (one process or torchrun).

    import zoo.training
    result = zoo.training.train("examples/translate.yaml")       # or a TrainConfig
    trainer = zoo.training.Trainer(config, callbacks=[MyCallback()], progress=False, sinks=["csv"])
    trainer.fit()

The package follows a run, in order:

    config.py, task_settings.py   the config (no torch): every setting, each task's own under ``task:``
    setup.py                      everything resolved before the first step: task, tokenizers, spec, data
                                  (`pretrained`: ``init_from``; `corpus`: the splits as prepared shards;
                                  `threads`: how many CPU threads)
    loop.py                       `Trainer`: the steps, with what they use beside it: `batching`,
                                  `objectives`, `optim`, `schedules`, `precision`, `distributed`,
                                  `stopping`, `evaluate` (and `bleu`)
    run/                          the run folder: the lock, checkpoints, resume, the trainer's state
    report/                       records, callbacks, sinks, the progress bar
    tasks/, data/                 one module per task; the data readers, shards and batch planning

Names load on first use, so ``zoo.training.config`` and ``zoo.training.bleu`` stay free of torch.
"""

from __future__ import annotations

from zoo._lazy import lazy_exports

_LAZY = {
    "TrainConfig": "zoo.training.config:TrainConfig",
    "ConfigError": "zoo.training.config:ConfigError",
    "DataError": "zoo.training.data:DataError",
    "Trainer": "zoo.training.loop:Trainer",
    "TrainResult": "zoo.training.report.records:TrainResult",
    "Callback": "zoo.training.report.records:Callback",
    "TrainerState": "zoo.training.run.state:TrainerState",
    "ProgressBar": "zoo.training.report.progress:ProgressBar",
    "CsvSink": "zoo.training.report.sinks:CsvSink",
    "JsonlSink": "zoo.training.report.sinks:JsonlSink",
    "TensorBoardSink": "zoo.training.report.sinks:TensorBoardSink",
    "SinkDependencyError": "zoo.training.report.sinks:SinkDependencyError",
    "train": "zoo.training.loop:train",
    "noam": "zoo.training.schedules:noam",
    "translate": "zoo.training.evaluate:translate",
    "corpus_bleu": "zoo.training.bleu:corpus_bleu",
}

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
