"""Input/output: zoo's checkpoints, Hugging Face interop and tokenizers.

    names.py       every file name zoo reads or writes, defined once
    atomic.py      the one atomic writer every file goes through
    jsonfile.py    the one bounded JSON reader (config.json, indexes, headers): errors name the file
    checkpoint/    zoo's own format: `save`, `load`, `read_spec`, `load_tokenizer`
    hf/            `from_hf` / `to_hf`: one declarative mapping per Hugging Face family
    tokenizer/     the `tokenizers` wrapper: train, load, batch, save for transformers

Nothing here prints; the CLI reports.
"""
