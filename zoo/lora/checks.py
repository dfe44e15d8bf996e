"""What `zoo.lora.apply` accepts, checked before anything is allocated: its arguments, one line each naming
the argument and what it takes, and the rank against each targeted layer.

A rank above ``min(in_features, out_features)`` of a projection buys nothing (``B @ A`` cannot have a higher
rank than that) and costs memory without bound: ``r=10_000_000`` on a 64-wide model asks for gigabytes per
matrix. So ``r`` is refused when it exceeds the smallest targeted layer's, naming that layer and its sizes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from torch import nn

from zoo.blocks.moe import StackedLinear
from zoo.lora.errors import LoraError
from zoo.lora.nf4 import Nf4Linear
from zoo.spec import LoraSpec
from zoo.spec.errors import clip, number, short_repr
from zoo.spec.lora import TARGET_GRAMMAR

# What each argument takes, for the messages.
ACCEPTED = {
    "r": "an integer >= 1 (the adapters' rank)",
    "alpha": "a finite number > 0 (the update is scaled by alpha / r)",
    "dropout": "a number in [0, 1)",
    "targets": f"a non-empty list of target names, each {TARGET_GRAMMAR}",
    "dora": "True or False",
    "quantize_base": "'nf4' or None (QLoRA: the frozen base projections stored 4-bit)",
}


def spec_from_arguments(arguments: Mapping[str, Any], *, where: str, model_has: str) -> LoraSpec:
    """``arguments`` (``r``, ``alpha``, ``targets``, ``dropout``, ``dora``, ``quantize_base``) as a `LoraSpec`; else one
    `LoraError` line naming the first bad argument and what it takes (``model_has``: the model's attention
    and FFN blocks, said with a bad target)."""
    unknown = sorted(set(arguments) - set(ACCEPTED))
    if unknown:
        raise LoraError(f"{where}: unknown argument {unknown[0]!r}; the arguments are {', '.join(ACCEPTED)}")
    data = dict(arguments)
    targets = data.get("targets")
    if isinstance(targets, str) or not isinstance(targets, list | tuple):
        got = f"the string {targets!r:.60} (write [{targets!r:.60}])" if isinstance(targets, str) else None
        raise LoraError(f"{where}: targets must be {ACCEPTED['targets']}, got {got or short_repr(targets)}")
    data["targets"] = list(targets)
    try:
        return LoraSpec(**data)
    except ValidationError as error:
        problem, field = spec_problem(error)
        raise LoraError(
            f"{where}: {problem}{f'; this model has {model_has}' if field == 'targets' else ''}"
        ) from None


def spec_problem(error: ValidationError) -> tuple[str, str]:
    """(the first problem of a `LoraSpec` validation as ``field must be ..., got ...``, the field)."""
    item = error.errors(include_url=False, include_context=False)[0]
    field = ".".join(str(part) for part in item["loc"])
    if field.startswith("targets") and item["type"] == "value_error":  # our validator names the target
        return clip(item["msg"].removeprefix("Value error, ")), "targets"
    if field not in ACCEPTED:  # not one of the fields (an unknown key in a file): pydantic's words, no input
        return f"{clip(field) or 'lora_spec'}: {clip(item['msg'])}", field
    return f"{field} must be {ACCEPTED[field]}, got {short_repr(item.get('input'))}", field


def check_rank(targeted: Mapping[str, nn.Linear | Nf4Linear | StackedLinear], r: int) -> None:
    """Refuse ``r`` above ``min(in_features, out_features)`` of a targeted layer, naming the narrowest (an
    ``nn.Linear``, or a `StackedLinear` of experts: the bound holds per expert)."""
    if not targeted:
        return
    name, linear = min(targeted.items(), key=lambda item: min(item[1].in_features, item[1].out_features))
    most = min(linear.in_features, linear.out_features)
    if r > most:
        raise LoraError(
            f"lora r ({number(r)}) is more than the targeted layer {name} can use: it maps {linear.in_features} "
            f"-> {linear.out_features} features, so an update's rank is at most {most}; choose r <= {most}",
            field="r",
        )
