"""``zoo presets``: the preset table."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "presets", help="list the presets: family, layers, width, heads, parameters"
    )
    parser.set_defaults(run=run)


def preset_rows() -> list[dict]:
    """One row per preset; parameters are counted on a meta-device build (no memory; not initialised: a
    meta tensor has no values, and initialising 51 models on it took longer than importing torch)."""
    import zoo

    rows = []
    for name in zoo.list_presets():
        spec = zoo.preset(name)
        stacks = spec.stacks()
        model = zoo.build(spec, device="meta", init=False)
        rows.append(
            {
                "name": name,
                "family": spec.family,
                "layers": "+".join(str(stack.num_layers) for stack in stacks.values()),
                "d_model": spec.d_model,
                "heads": next(iter(stacks.values())).attention.num_heads,
                "parameters": model.num_parameters(),
            }
        )
    return rows


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
