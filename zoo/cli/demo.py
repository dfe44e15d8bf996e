"""``zoo demo``: the main job on its embedded defaults.

Builds the canonical ``transformer-base`` (on CUDA when available), prints its summary, and runs one
forward + backward pass on a padded batch, showing the three masks of an encoder-decoder at work.
"""

from __future__ import annotations

import argparse
import time


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo", help="the main job: build transformer-base and run it on a padded batch"
    )
    parser.add_argument(
        "--preset", default="transformer-base", help="preset to build (default: transformer-base)"
    )
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch
    from rich.table import Table

    import zoo
    from zoo.blocks import masks
    from zoo.cli import console

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = zoo.build(args.preset, device=device)
    spec = model.spec
    console.print(
        f"[bold]{args.preset}[/] ({spec.family}) on [bold]{device}[/]: {model.num_parameters():,} parameters"
    )
    console.print(f"[dim]{spec.source}[/]")
    table = Table(title="parameters by component")
    table.add_column("component")
    table.add_column("parameters", justify="right")
    for name, child in model.named_children():
        table.add_row(name, f"{sum(p.numel() for p in child.parameters()):,}")
    console.print(table)

    # A batch of two source and two target sentences; the second of each is padded.
    src_mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], device=device)
    tgt_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], device=device)
    vocab = spec.vocab_size
    src = torch.randint(3, vocab, src_mask.shape, device=device) * src_mask
    labels = (torch.randint(3, vocab, tgt_mask.shape, device=device) * tgt_mask).masked_fill(
        tgt_mask == 0, -100
    )
    self_mask, _ = masks.self_attention_mask(tgt_mask, q_len=5, k_len=5, causal=True, device=device)
    for title, mask in (
        ("encoder self-attention: key padding (sentence 2)", masks.padding_mask(src_mask)[1, 0].expand(6, 6)),
        ("decoder self-attention: causal AND key padding (sentence 2)", self_mask[1, 0]),
        (
            "cross-attention: the encoder's key padding (sentence 2)",
            masks.padding_mask(src_mask)[1, 0].expand(5, 6),
        ),
    ):
        console.print(f"[bold]{title}[/] (1 = may attend)")
        console.print("\n".join("  " + " ".join(str(int(v)) for v in row) for row in mask.tolist()))

    start = time.perf_counter()
    out = model(src, attention_mask=src_mask, labels=labels, decoder_attention_mask=tgt_mask)
    out.loss.backward()
    elapsed = time.perf_counter() - start
    grad_norm = torch.sqrt(sum((p.grad.float() ** 2).sum() for p in model.parameters() if p.grad is not None))
    console.print(
        f"forward + backward: loss {out.loss.item():.3f} (ln V = {torch.log(torch.tensor(float(vocab))):.3f} at init), "
        f"logits {tuple(out.logits.shape)}, grad norm {grad_norm:.3f}, {elapsed * 1000:.0f} ms"
    )
    return 0
