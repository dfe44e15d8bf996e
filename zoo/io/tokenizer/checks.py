"""Whether a tokenizer agrees with a model spec: its special ids and its vocabulary size."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zoo.io.tokenizer.specials import looked_for

if TYPE_CHECKING:
    from zoo.io.tokenizer.core import Tokenizer


def check_special_tokens(
    tokenizer: Tokenizer,
    *,
    pad_token_id: int | None,
    bos_token_id: int | None,
    eos_token_id: int | None,
    vocab_size: int,
    where: str,
) -> None:
    """Raise ``ValueError`` if ``tokenizer`` disagrees with a model spec's special ids or vocabulary size.

    A spec id of None is not checked. ``where`` names the spec in the message (e.g. a preset or file).
    """
    problems = []
    for name, spec_id in (("pad", pad_token_id), ("bos", bos_token_id), ("eos", eos_token_id)):
        if spec_id is None:
            continue
        tok_id = tokenizer.special_ids()[name]
        if tok_id is None:
            problems.append(
                f"{name}_token_id is {spec_id} but the tokenizer has no {name} token ({looked_for(name)})"
            )
        elif tok_id != spec_id:
            token = tokenizer.id_to_token(tok_id)
            problems.append(
                f"{name} token {token!r} has id {tok_id} in the tokenizer but {name}_token_id is {spec_id}"
            )
    if tokenizer.vocab_size > vocab_size:
        problems.append(
            f"the tokenizer has {tokenizer.vocab_size} tokens but vocab_size is {vocab_size}; "
            "larger ids would index past the embedding"
        )
    if problems:
        raise ValueError(f"{where}: tokenizer does not match the model spec: " + "; ".join(problems))
