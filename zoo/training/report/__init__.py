"""What a training run reports, and where it goes: records, callbacks, the progress bar, the sinks.

records     metric records, the `Callback` hooks that receive them, ``run.json``, `TrainResult`
reporting   `Reporter`: each event to the bar and the callbacks, then each record to every sink
sinks       ``metrics.jsonl`` (always), ``metrics.csv`` and TensorBoard (by choice), or your own
progress    the progress bar and plain progress lines
"""
