"""What a training run writes into its ``output_dir``: the training file names, each defined once.

    <output_dir>/
        model.safetensors, spec.json        the trained model (zoo.save); a LoRA run's with the adapters merged
        adapter.safetensors                 a LoRA run's adapters alone (zoo.lora.save; ``lora:`` in the config)
        tokenizer.json                      the target (or shared) tokenizer
        source_tokenizer.json               the source tokenizer, with separate vocabularies only
        train_config.yaml                   the full config, every default explicit
        run.json                            what the logged losses mean (task, label smoothing)
        metrics.jsonl                       one record a line (always written)
        metrics.csv, tensorboard/           the optional sinks (``log_sinks``)
        checkpoints/step-00000500/          resumable checkpoints (`zoo.training.checkpoints`):
            model.safetensors, spec.json, tokenizer.json     a loadable model on its own
            adapter.safetensors                              a LoRA run's adapters (what a resume loads)
            optimizer.safetensors                            Adam moments by parameter name
            rng.safetensors                                  every rank's RNG streams
            trainer_state.json                               step, data position, elapsed time (fp16:
                                                             and the loss scale)
        .zoo-train.lock                     the advisory lock of the run writing here (`zoo.training.rundir`)

The model's and tokenizer's own names (``model.safetensors``, ``spec.json``, ``tokenizer.json``) belong to
`zoo.io.names`; this module names only what training adds.
"""

from __future__ import annotations

SOURCE_TOKENIZER_NAME = "source_tokenizer.json"
CONFIG_NAME = "train_config.yaml"
RUN_NAME = "run.json"
ADAPTER_NAME = "adapter.safetensors"
METRICS_NAME = "metrics.jsonl"
CSV_NAME = "metrics.csv"
TENSORBOARD_DIR = "tensorboard"

CHECKPOINTS_DIR = "checkpoints"
STATE_NAME = "trainer_state.json"
OPTIMIZER_NAME = "optimizer.safetensors"
RNG_NAME = "rng.safetensors"
LOCK_NAME = ".zoo-train.lock"
