"""``zoo presets``: the preset table."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from zoo.io.names import PRESET_COUNTS_NAME


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "presets", help="list the presets: family, layers, width, heads, parameters"
    )
    parser.set_defaults(run=run)


# Parameter counts of the presets are cached (PRESET_COUNTS_NAME) per (resolved spec, zoo's code): a meta
# build of all 51 takes ~0.25 s and importing torch 1.5 s more, which a listing should not pay every time.


def preset_rows() -> list[dict]:
    """One row per preset; parameters are counted on a meta-device build (`zoo.parameter_count`: no memory,
    not initialised), remembered in the user's cache until the spec or zoo's code changes (`parameter_counts`)."""
    import zoo

    specs = {name: zoo.preset(name) for name in zoo.list_presets()}
    counts = parameter_counts(specs)
    rows = []
    for name, spec in specs.items():
        stacks = spec.stacks()
        rows.append(
            {
                "name": name,
                "family": spec.family,
                "layers": "+".join(str(stack.num_layers) for stack in stacks.values()),
                "d_model": spec.d_model,
                "heads": next(iter(stacks.values())).attention.num_heads,
                "parameters": counts[name],
            }
        )
    return rows


def parameter_counts(specs: dict) -> dict[str, int]:
    """``{name: parameters}`` of each spec's meta-device build. A count is kept in
    ``$XDG_CACHE_HOME/zoo/preset-parameters.json`` (default ``~/.cache``) under the hash of the resolved
    spec, valid while zoo's own files are unchanged (their sizes and modification times); only the specs
    not found there are built, and torch is imported only then. An unreadable or unwritable cache is
    ignored: the counts are built."""
    import hashlib
    import json

    path = _cache_dir() / PRESET_COUNTS_NAME
    stamp = _code_stamp()
    keys = {name: hashlib.sha256(spec.model_dump_json().encode()).hexdigest() for name, spec in specs.items()}
    try:
        cached = json.loads(path.read_text())
        known = cached["counts"] if cached.get("code") == stamp else {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        known = {}
    counts = {name: known[key] for name, key in keys.items() if isinstance(known.get(key), int)}
    missing = [name for name in specs if name not in counts]
    if missing:
        import zoo

        for name in missing:
            counts[name] = zoo.parameter_count(specs[name])
        try:
            from zoo.io.atomic import write_text_atomic

            path.parent.mkdir(parents=True, exist_ok=True)
            entries = {keys[name]: counts[name] for name in specs}
            write_text_atomic(path, json.dumps({"code": stamp, "counts": entries}))
        except OSError:
            pass  # a read-only home: build again next time
    return counts


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "zoo"


def _code_stamp() -> str:
    """The size and modification time of every file of zoo's package: any edit, install or upgrade changes it."""
    import hashlib

    import zoo

    root = Path(zoo.__file__).parent
    digest = hashlib.sha256()
    for file in sorted(root.rglob("*.py")):
        info = file.stat()
        digest.update(f"{file.relative_to(root)}:{info.st_size}:{info.st_mtime_ns};".encode())
    return digest.hexdigest()


def run(args: argparse.Namespace) -> int:
    from zoo.cli.tables import Column, print_table

    columns = [Column(c, whole=True) for c in ("name", "family", "layers", "d_model", "heads")]
    columns.append(Column("parameters", whole=True, right=True))
    rows = [
        [*(str(row[c]) for c in ("name", "family", "layers", "d_model", "heads")), f"{row['parameters']:,}"]
        for row in preset_rows()
    ]
    print_table(columns, rows, title="zoo presets")
    return 0
