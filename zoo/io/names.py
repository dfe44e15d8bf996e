"""The names of the files zoo reads and writes, each defined once: every folder zoo makes or reads, as a tree.

A model: zoo's checkpoint and Hugging Face's folder (`zoo.save`, `zoo.to_hf`, `zoo.io.checkpoint`)

    model.safetensors                   the weights (zoo and Hugging Face alike)
    model-00001-of-00003.safetensors    a Hugging Face shard, listed in model.safetensors.index.json
    model-00001-of-00003-9f2c41d0.safetensors
                                        a zoo shard: the suffix is unique to one save, so a save never
                                        overwrites a shard the current index still names
    spec.json                           zoo's spec, beside zoo's weights
    config.json                         a Hugging Face model config
    tokenizer.json                      a `tokenizers` file (zoo's and Hugging Face's)
    tokenizer_config.json               transformers' tokenizer settings
    generation_config.json              transformers' generation settings, carried as read (Whisper's prompt)
    special_tokens_map.json             transformers' special tokens
    chat_template.jinja                 a chat template (transformers >= 4.43 writes it beside the config)

Adapters: zoo's own file (`zoo.lora.save`) and PEFT's folder (`zoo.lora.to_peft`)

    adapter.safetensors                 zoo's LoRA adapters (the name a training run gives them)
    adapter_config.json, adapter_model.safetensors     PEFT's

A training run's ``output_dir`` (`zoo.training`)

    <output_dir>/
        model.safetensors, spec.json        the trained model (zoo.save); a LoRA run's: the adapters merged
        adapter.safetensors                 a LoRA run's adapters alone (zoo.lora.save), with ``lora:``
        tokenizer.json                      the target (or shared) tokenizer
        source_tokenizer.json               the source tokenizer, with separate vocabularies only
        train_config.yaml                   the full config, every default explicit
        run.json                            what the logged losses mean (task, label smoothing)
        metrics.jsonl                       one record a line (always written)
        metrics.csv, tensorboard/           the optional sinks (``log_sinks``)
        checkpoints/step-00000500/          resumable checkpoints (`zoo.training.run.checkpoints`):
            model.safetensors, spec.json, tokenizer.json     a loadable model on its own
            adapter.safetensors                              a LoRA run's adapters (what a resume loads)
            optimizer.safetensors                            Adam moments by parameter name
            rng.safetensors                                  every rank's RNG streams
            trainer_state.json                               step, data position, elapsed time (fp16:
                                                             and the loss scale)
        .zoo-train.lock                     the lock of the run writing here (`zoo.training.run.runlock`)
        data/train.tsv, data/valid.tsv      ``zoo demo``'s toy corpus (`zoo.demo`), in the demo's run only

Prepared data, one folder per split (`zoo.training.data.shards`, which names each side's files)

    manifest.json                       format, version, sides, counts, sources; written last
    origins.bin                         each example's source file and line
    <side>.tokens.bin, <side>.offsets.bin, <side>.values.bin

``zoo presets``' parameter counts, cached: ``$XDG_CACHE_HOME/zoo/preset-parameters.json``

Read only: a sentence-transformers folder (`zoo.embeddings`) and a ``datasets`` ``save_to_disk`` folder

    modules.json, config_sentence_transformers.json, <transformer>/sentence_bert_config.json,
    1_Pooling/config.json
    dataset_dict.json (a DatasetDict: refused, one split is named), state.json (a split's shards in order)

Imports nothing heavy, so the CLI and the training code can name files without loading torch.
"""

from __future__ import annotations

import re

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
HF_SHARD_PATTERN = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
SHARD_PATTERN = re.compile(r"model-\d{5}-of-\d{5}(-[0-9a-f]{8})?\.safetensors")  # Hugging Face's or zoo's
SPEC_NAME = "spec.json"
CONFIG_NAME = "config.json"
GENERATION_CONFIG_NAME = "generation_config.json"  # Hugging Face generation settings (Whisper's prompt)
TOKENIZER_NAME = "tokenizer.json"
TOKENIZER_CONFIG_NAME = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_NAME = "special_tokens_map.json"
CHAT_TEMPLATE_NAME = "chat_template.jinja"
HF_PICKLE_NAMES = ("pytorch_model.bin", "pytorch_model.bin.index.json")  # refused: unpickling runs code

ADAPTER_NAME = "adapter.safetensors"
PEFT_CONFIG_NAME = "adapter_config.json"
PEFT_WEIGHTS_NAME = "adapter_model.safetensors"

# A training run's output_dir (the demo's adds its corpus), then a checkpoint's folder under it.
SOURCE_TOKENIZER_NAME = "source_tokenizer.json"
TRAIN_CONFIG_NAME = "train_config.yaml"
RUN_INFO_NAME = "run.json"
METRICS_NAME = "metrics.jsonl"
METRICS_CSV_NAME = "metrics.csv"
TENSORBOARD_DIR = "tensorboard"
RUN_LOCK_NAME = ".zoo-train.lock"
DEMO_DATA_DIR = "data"
DEMO_TRAIN_NAME = "train.tsv"
DEMO_VALID_NAME = "valid.tsv"

CHECKPOINTS_DIR = "checkpoints"
STEP_DIR_PATTERN = re.compile(r"step-(\d+)")  # `step_dir_name`
STEP_DIR_GLOB = "step-*"
TRAINER_STATE_NAME = "trainer_state.json"
OPTIMIZER_NAME = "optimizer.safetensors"
RNG_NAME = "rng.safetensors"

# Prepared data (a split's folder); a sentence-transformers folder; a datasets save_to_disk folder.
PREPARED_MANIFEST_NAME = "manifest.json"
PREPARED_ORIGINS_NAME = "origins.bin"

ST_MODULES_NAME = "modules.json"
ST_CONFIG_NAME = "config_sentence_transformers.json"
SBERT_CONFIG_NAME = "sentence_bert_config.json"
POOLING_CONFIG_NAME = "config.json"
DATASET_DICT_NAME = "dataset_dict.json"
DATASET_STATE_NAME = "state.json"
PRESET_COUNTS_NAME = "preset-parameters.json"


def shard_name(index: int, count: int, tag: str | None = None) -> str:
    """``model-00001-of-00003.safetensors`` for index 0 of 3, as Hugging Face names shards; with ``tag``
    (8 hex digits, one save's own), ``model-00001-of-00003-<tag>.safetensors``."""
    return f"model-{index + 1:05d}-of-{count:05d}{f'-{tag}' if tag else ''}.safetensors"


def step_dir_name(step: int) -> str:
    """``step-00000500`` for step 500: a checkpoint's folder under ``checkpoints/`` (names sort by step)."""
    return f"step-{step:08d}"


def is_plain_file_name(name: object) -> bool:
    """Whether ``name`` is a bare file name: no folder part, not absolute, not ``.`` or ``..``, no drive.

    What an index may name: joined to the checkpoint folder it stays in that folder (the name itself cannot
    leave; a symlink there is followed only while it stays in the folder, or in Hugging Face's cache, whose
    snapshots link to its blobs: `zoo.io.paths.inside`).
    """
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(sep in name for sep in ("/", "\\", ":", "\0"))
    )
