"""The shape of a Hugging Face family mapping: config <-> spec, and tensor names both ways.

One `FamilyMapping` per family module (``gpt2.py``, ``bert.py``, ``t5.py``, ...): declarative name maps plus
the explicit list of tensors that are transposed, fused or split. Nothing outside `zoo.io.hf` knows about
Hugging Face names.

The helpers below let a family say its tensor map as a table of `Rule` rows, one per zoo tensor:

    Rule("decoder.layers.0.self_attn.qkv_proj.weight", ("h.0.attn.c_attn.weight",), transpose=True)
    Rule("decoder.layers.0.ffn.up_proj.weight",
         ("layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight"), sizes=(F, F))

and `rules_to_zoo` / `rules_to_hf` apply the same table in either direction: a fused row is concatenated
on import and split by ``sizes`` on export; a transposed row (GPT-2's ``Conv1D`` stores (in, out)) is
transposed both ways.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from zoo.io.checkpoint.mapped import release, release_unless_shared
from zoo.spec import ModelSpec
from zoo.spec.errors import short_repr

StateDict = dict[str, torch.Tensor]


class NamesOnly(StateDict):
    """A model's state dict (meta tensors) given to a family's ``zoo_to_hf`` for the names it would write:
    what the export guard reads the config back with (`zoo.io.hf.faithful`). `rules_to_hf` maps names only,
    leaving out a rule whose zoo tensor the model lacks (a spec the family cannot express), where it would
    refuse: the read-back names what is lost, by its spec field."""

    def copy(self) -> NamesOnly:
        return NamesOnly(self)


@dataclass(frozen=True)
class FamilyMapping:
    """How one Hugging Face family maps onto zoo.

    config_to_spec(config, tensor_names): the HF ``config.json`` dict and the checkpoint's tensor names (to
        tell e.g. a headless ``BertModel`` from ``BertForMaskedLM``) -> a zoo `ModelSpec`.
    spec_to_config(spec): a zoo spec -> an HF ``config.json`` dict (``model_type``, ``architectures``, ...).
    hf_to_zoo(tensors, spec): HF state dict -> zoo state dict (every zoo tensor, tied ones once).
    zoo_to_hf(tensors, spec): zoo state dict -> HF state dict that ``from_pretrained`` loads with no missing
        or unexpected keys.
    ffn_kinds: the FFN spec kinds (``dense``, ``moe``) the family writes; export refuses any other before
        ``spec_to_config`` runs.
    embedding_kinds: the input front-ends (``tokens``, ``patches``) the family reads; export refuses any
        other before ``spec_to_config`` runs.
    exported_as(spec): the spec the written files describe, where the family re-expresses an option through
        the weights (Marian: the paper's interleaved sinusoids as its half layout, the residual stream
        reordered); the export guard (`zoo.io.hf.faithful`) reads the config back against it. None: ``spec``.
    """

    model_types: tuple[str, ...]
    config_to_spec: Callable[[dict[str, Any], set[str]], ModelSpec]
    spec_to_config: Callable[[ModelSpec], dict[str, Any]]
    hf_to_zoo: Callable[[StateDict, ModelSpec], StateDict]
    zoo_to_hf: Callable[[StateDict, ModelSpec], StateDict]
    ffn_kinds: tuple[str, ...] = ("dense",)
    embedding_kinds: tuple[str, ...] = ("tokens",)
    exported_as: Callable[[ModelSpec], ModelSpec] | None = None


def check_ffn_kinds(mapping: FamilyMapping, spec: ModelSpec) -> None:
    """HFError naming the first stack whose FFN kind ``mapping`` cannot write (experts in a dense family)."""
    family = "/".join(mapping.model_types)
    for stack in spec.stacks().values():
        if stack.ffn.kind not in mapping.ffn_kinds:
            field = f"{stack.sources['ffn']}.kind"
            raise HFError(
                f"{family} cannot express {field}={stack.ffn.kind!r}: Hugging Face {family} has "
                f"{' or '.join(mapping.ffn_kinds)} feed-forward layers only",
                fields=(field,),
            )


def check_embedding_kind(mapping: FamilyMapping, spec: ModelSpec) -> None:
    """HFError when ``mapping`` cannot read the spec's input front-end (image patches in a text family)."""
    kind = spec.embedding.kind
    if kind not in mapping.embedding_kinds:
        family = "/".join(mapping.model_types)
        raise HFError(
            f"{family} cannot express embedding.kind={kind!r}: Hugging Face {family} reads "
            f"{' or '.join(mapping.embedding_kinds)}",
            fields=("embedding.kind",),
        )


class HFError(ValueError):
    """A Hugging Face checkpoint, config or spec zoo cannot convert; the message names the field or tensor.

    ``fields``: the spec fields an export refusal names (all of them, the message leads with the first);
    empty for other errors. ``complete``: they are every field the export would lose (the export guard's
    read-back); else the family stopped at what it could not write at all, and more may be lost.
    `NoFamilyError` ranks the families by both.
    """

    def __init__(self, message: str, *, fields: tuple[str, ...] = (), complete: bool = False) -> None:
        super().__init__(message)
        self.fields = fields
        self.complete = complete


class NoFamilyError(HFError):
    """No Hugging Face family can express a spec. ``reasons``: ``(family, reason)`` for each family, the
    closest first (`closeness`); the message lists them all, `summary` names the closest alone."""

    def __init__(self, reasons: list[tuple[str, ValueError]]) -> None:
        ranked = sorted(reasons, key=lambda item: closeness(item[1]))  # stable: family order breaks ties
        self.reasons = [(family, str(error)) for family, error in ranked]
        lines = "\n".join(f"  {family}: {reason}" for family, reason in self.reasons)
        super().__init__(f"no Hugging Face family can express this spec:\n{lines}")

    @property
    def summary(self) -> str:
        """One line: the closest family's reason."""
        return f"no Hugging Face family can express this spec; closest: {self.reasons[0][1]}"


def closeness(error: ValueError) -> tuple[int, bool, int]:
    """How far a family is from a spec, by its refusal: another model family (decoder for encoder-decoder)
    is farthest, then another kind of feed-forward (a Mixture-of-Experts family for a dense spec, or the
    reverse: its refusal stops at that one field); else a family that wrote a config and lost fields in it
    (`HFError.complete`: it names them all) before one that stopped at the first it could not write, and
    the fewer fields, the closer."""
    fields = getattr(error, "fields", ())
    other_ffn = any(field.endswith("ffn.kind") for field in fields)
    kind = 2 if "family" in fields else 1 if other_ffn else 0
    return (kind, not getattr(error, "complete", False), max(len(fields), 1))


# -- activations -------------------------------------------------------------------------------------------

ACTIVATIONS_FROM_HF = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",  # GPT-2's tanh approximation, written out in Python
    "gelu_pytorch_tanh": "gelu_tanh",  # the same function through torch's kernel
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
    "quick_gelu": "quick_gelu",  # CLIP's x * sigmoid(1.702 x)
}
ACTIVATIONS_TO_HF = {
    "gelu": "gelu",
    "gelu_tanh": "gelu_new",
    "relu": "relu",
    "silu": "silu",
    "quick_gelu": "quick_gelu",
}


def activation_from_hf(name: Any, *, field: str) -> str:
    """zoo's name for the HF activation ``name`` read from config field ``field``."""
    if not isinstance(name, str) or name not in ACTIVATIONS_FROM_HF:
        known = ", ".join(sorted(ACTIVATIONS_FROM_HF))
        raise HFError(
            f"config.json {field}={short_repr(name)} is not supported; supported activations: {known}"
        )
    return ACTIVATIONS_FROM_HF[name]


# -- config helpers ----------------------------------------------------------------------------------------


class TypedConfig(dict[str, Any]):
    """A config.json dict whose ``get(key, default)`` refuses a value of another JSON type than ``default``.

    Every family reads its fields with the transformers default beside the key (``config.get("n_layer",
    12)``), so the default says the type: an int default wants an integer (``true`` and ``12.0`` are not
    one), a float default a number (``true`` is not one), a bool default a boolean, a string default a
    string; ``null`` only where transformers reads it as "none" (`NULLABLE`; token ids: `token_id`). A
    ``None`` default checks nothing. Non-finite numbers never get here: the JSON reader refuses them,
    naming the key (`zoo.io.jsonfile`).
    """

    NULLABLE = frozenset(
        {
            "sliding_window",
            "num_key_value_heads",
            "head_dim",
            "rope_scaling",
            "q_lora_rank",
            "n_group",
            "topk_group",
            "attention_chunk_size",
        }
    )
    # Widths and counts: 0 or less is refused, naming the key, whatever the default. transformers fails on
    # most (an empty projection, a division by zero), and a family must not read 0 as "absent" (GPT-2's
    # ``n_inner or 4 * n_embd``, T5's ``num_decoder_layers or num_layers``).
    POSITIVE = frozenset({
        "vocab_size", "hidden_size", "n_embd", "d_model", "dim", "embedding_size", "word_embed_proj_dim",
        "intermediate_size", "d_ff", "dff", "n_inner", "hidden_dim", "ffn_dim", "encoder_ffn_dim",
        "decoder_ffn_dim", "moe_intermediate_size", "num_attention_heads", "n_head", "n_heads", "num_heads",
        "encoder_attention_heads", "decoder_attention_heads", "num_key_value_heads", "head_dim", "d_kv",
        "num_hidden_layers", "n_layer", "n_layers", "num_layers", "num_decoder_layers", "encoder_layers",
        "decoder_layers", "num_hidden_groups", "inner_group_num", "max_position_embeddings", "n_positions",
        "type_vocab_size", "num_local_experts", "num_experts", "num_experts_per_tok", "sliding_window_pattern",
        "global_attn_every_n_layers", "relative_attention_num_buckets", "relative_attention_max_distance",
        "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "n_routed_experts",
        "n_group", "topk_group",
    })  # fmt: skip

    def get(self, key: str, default: Any = None) -> Any:
        value = super().get(key, default)
        if key in self.POSITIVE and _is_number(value) and value <= 0:
            kind = "integer" if isinstance(value, int) else "number"
            raise HFError(f"config.json {key}={value!r}: a positive {kind} is expected")
        if default is None or value is default or (value is None and key in self.NULLABLE):
            return value
        expected = _expected_kind(default)
        if expected is not None and not _is_kind(value, default):
            raise HFError(f"config.json {key}: expected {expected}, got {json_kind(value)}")
        return value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _expected_kind(default: Any) -> str | None:
    if isinstance(default, bool):
        return "true or false"
    if isinstance(default, int):
        return "an integer"
    if isinstance(default, float):
        return "a number"
    return "a string" if isinstance(default, str) else None


def _is_kind(value: Any, default: Any) -> bool:
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if isinstance(default, int):
        return isinstance(value, int)
    if isinstance(default, float):
        return isinstance(value, int | float)
    return isinstance(value, str) if isinstance(default, str) else True


def json_kind(value: Any) -> str:
    """What a JSON value is, for messages: ``a string``, ``a list``, ``true``... (never the value itself)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    kinds = {type(None): "null", str: "a string", list: "a list", dict: "an object", float: "a number"}
    return kinds.get(type(value), "an integer" if isinstance(value, int) else type(value).__name__)


def architecture(config: Mapping[str, Any]) -> str | None:
    """The first entry of ``architectures`` (the head class that saved the checkpoint), if any."""
    names = config.get("architectures") or []
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise HFError(f"config.json architectures: expected a list of class names, got {json_kind(names)}")
    return names[0] if names else None


def has_lm_head(config: Mapping[str, Any], names: set[str], *, headed: str, prefix: str) -> bool:
    """Whether a decoder checkpoint has an LM head: saved by the ``headed`` class, holding ``lm_head.weight``,
    or (no ``architectures``) with the body under the head class's ``prefix`` (a tied head stores nothing)."""
    arch = architecture(config)
    return (
        arch == headed
        or "lm_head.weight" in names
        or (arch is None and any(n.startswith(prefix) for n in names))
    )


def token_id(
    config: Mapping[str, Any],
    key: str,
    vocab_size: int,
    default: int | None = None,
    *,
    padding_idx: bool = True,
) -> int | None:
    """A special-token id from the config, or None when absent or outside the vocabulary.

    Small test configs often keep a family's default id (GPT-2's 50256) with a tiny vocabulary; such an id
    names no row of the embedding, so it is dropped rather than failing spec validation. A list (Llama 3's
    several end-of-turn ids) keeps its first entry.

    ``pad_token_id`` is the exception where ``padding_idx`` (the default): the family's transformers
    embedding takes it as its ``padding_idx``, which must lie in [-vocab_size, vocab_size) (torch's
    assertion), so an id outside is refused, naming it, as transformers fails on it. A negative id inside
    that range is torch's count from the end: it only keeps that row's gradient at zero, and is dropped.
    GPT-2, T5, CTRL and GPT-NeoX embed without a padding_idx, and MPNet's is always 1 (``padding_idx=False``).
    """
    value = config[key] if key in config else default  # noqa: SIM401 (not TypedConfig.get: null is "none")
    ids = value if isinstance(value, list) else [value]
    bad = [item for item in ids if item is not None and (isinstance(item, bool) or not isinstance(item, int))]
    if bad:
        got = f"a list holding {json_kind(bad[0])}" if isinstance(value, list) else json_kind(value)
        raise HFError(
            f"config.json {key}: expected a token id (an integer), a list of them or null, got {got}"
        )
    value = ids[0] if ids else None
    if (
        key == "pad_token_id"
        and padding_idx
        and isinstance(value, int)
        and not -vocab_size <= value < vocab_size
    ):
        raise HFError(
            f"config.json pad_token_id={value} is outside the vocabulary (vocab_size={vocab_size}); "
            "transformers' embedding takes it as its padding_idx and refuses it"
        )
    return value if isinstance(value, int) and 0 <= value < vocab_size else None


def reject(config: Mapping[str, Any], key: str, default: Any, *, why: str) -> None:
    """Fail when config field ``key`` holds anything but ``default`` (a feature zoo's spec cannot express)."""
    value = config.get(key, default)
    if value != default:
        raise HFError(
            f"config.json {key}={short_repr(value)} is not supported ({why}); zoo needs {default!r}"
        )


def require(family: str, checks: Iterable[tuple[str, Any, Any]]) -> None:
    """Raise naming the first spec field whose value the HF ``family``'s ``spec_to_config`` cannot work with.

    ``checks`` holds ``(dotted field, value, wanted)``; ``wanted`` is a value or a tuple of allowed values.
    A family lists only what it needs to write a config at all (a rope config needs rotary positions):
    everything else is the export guard's, which reads the config back (`zoo.io.hf.faithful`). Every check
    is made, so that the error's ``fields`` lists each field that differs (how far ``family`` is from the
    spec); the message names the first and counts the others.
    """
    failed: dict[str, tuple[Any, str]] = {}  # field -> (value, what is needed); a field twice counts once
    for field, value, wanted in checks:
        allowed = wanted if isinstance(wanted, tuple) else (wanted,)
        if value not in allowed:
            needs = " or ".join(repr(w) for w in allowed)
            failed.setdefault(field, (value, f": Hugging Face {family} needs {needs}"))
    if failed:
        raise refusal(family, failed)


def refusal(family: str, failed: dict[str, tuple[Any, str]], *, complete: bool = False) -> HFError:
    """The error for the spec fields ``family`` cannot express: ``failed`` maps each field to its value and
    why (``": Hugging Face gpt2 needs 'pre'"``, ``" (read back as 'pre')"``). The message names the first
    field and counts the others; ``fields`` holds them all (``complete``: see `HFError`)."""
    (field, (value, why)), *others = failed.items()
    more = [name for name, _ in others]
    also = f" (and {len(more)} more: {', '.join(more[:3])}{', ...' if len(more) > 3 else ''})" if more else ""
    message = f"{family} cannot express {field}={value!r}{why}{also}"
    return HFError(message, fields=tuple(failed), complete=complete)


def with_logits_bias(spec: ModelSpec) -> ModelSpec:
    """What a BART-shaped export describes (its `FamilyMapping.exported_as`): a head without
    ``lm_head.logits_bias`` is written with a zero ``final_logits_bias``, which transformers' head always
    has and which reads back as one: the same logits."""
    head = getattr(spec, "lm_head", None)
    return spec if head is None or head.logits_bias else spec.override(**{"lm_head.logits_bias": True})


# -- tensor tables -----------------------------------------------------------------------------------------

# Buffers some checkpoints carry that hold nothing learned: rotary inverse frequencies and position-id ranges.
COMMON_IGNORED = (r"(.+\.)?position_ids", r"(.+\.)?rotary_emb\.inv_freq")


@dataclass(frozen=True)
class Rule:
    """One zoo tensor and the Hugging Face tensor(s) it is made of.

    hf: one name, or several whose rows are concatenated (fused) in this order, e.g. q, k, v.
    transpose: HF stores the matrix as (in, out) (GPT-2's Conv1D); zoo's nn.Linear wants (out, in).
    sizes: rows of each fused part, to split the zoo tensor on export (one entry per ``hf`` name).
    interleave: ``(groups, parts)`` when the one HF tensor's rows are ``groups`` blocks each holding a slice
        of every part (GPT-NeoX's query_key_value: per head [q k v]) while zoo keeps each part whole
        ([q of all heads; k; v]): rows are regrouped both ways, (G, P, n) <-> (P, G, n).
    shape: the zoo tensor's shape when the concatenated rows are viewed as more dimensions (stacked
        experts: E × (gate, up) parts of (F, C) become one (E, 2F, C) tensor); export flattens it back.
    rows: a row permutation, zoo's row i being HF's row ``rows[i]`` (DeepSeek's interleaved rotary dims
        read into zoo's rotate-half layout); export applies the inverse.
    """

    zoo: str
    hf: tuple[str, ...]
    transpose: bool = False
    sizes: tuple[int, ...] | None = None
    interleave: tuple[int, int] | None = None
    shape: tuple[int, ...] | None = None
    rows: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if len(self.hf) > 1 and (self.sizes is None or len(self.sizes) != len(self.hf)):
            raise ValueError(f"Rule {self.zoo}: a fused tensor needs one size per part, got {self.sizes}")


def rename(zoo: str, hf: str) -> Rule:
    """A tensor that only changes its name."""
    return Rule(zoo, (hf,))


def linear(zoo: str, hf: str, *, bias: bool = True, transpose: bool = False) -> list[Rule]:
    """The weight (and bias) of one linear layer: ``zoo``/``hf`` are module paths without ``.weight``."""
    weight = Rule(f"{zoo}.weight", (f"{hf}.weight",), transpose=transpose)
    return [weight, rename(f"{zoo}.bias", f"{hf}.bias")] if bias else [weight]


def layernorm(zoo: str, hf: str, *, bias: bool = True) -> list[Rule]:
    """A norm's weight (and bias)."""
    return linear(zoo, hf, bias=bias)


def fused(zoo: str, hf: Sequence[str], sizes: Sequence[int]) -> Rule:
    """A zoo tensor whose rows are the HF tensors ``hf`` stacked in order (fused q/k/v, gate/up)."""
    return Rule(zoo, tuple(hf), sizes=tuple(sizes))


def stacked(zoo: str, hf: Sequence[str], sizes: Sequence[int], shape: Sequence[int]) -> Rule:
    """A zoo tensor of ``shape`` whose rows, flattened, are the HF tensors ``hf`` in order (stacked experts)."""
    return Rule(zoo, tuple(hf), sizes=tuple(sizes), shape=tuple(shape))


def fused_linear(zoo: str, hf: Sequence[str], sizes: Sequence[int], *, bias: bool = True) -> list[Rule]:
    """zoo's fused linear ``zoo`` from the separate HF linears ``hf`` (module paths), rows in that order."""
    params = ("weight", "bias") if bias else ("weight",)
    return [fused(f"{zoo}.{p}", [f"{module}.{p}" for module in hf], sizes) for p in params]


def interleaved_linear(zoo: str, hf: str, *, groups: int, parts: int, bias: bool = True) -> list[Rule]:
    """One linear whose HF rows interleave ``parts`` fused projections per group (`Rule.interleave`)."""
    params = ("weight", "bias") if bias else ("weight",)
    return [Rule(f"{zoo}.{p}", (f"{hf}.{p}",), interleave=(groups, parts)) for p in params]


def regroup(tensor: torch.Tensor, outer: int, inner: int) -> torch.Tensor:
    """Rows seen as (outer, inner, n) blocks, returned as (inner, outer, n): swap the two block levels."""
    rows = tensor.shape[0]
    if rows % (outer * inner):
        raise HFError(f"cannot regroup {rows} rows into {outer} x {inner} blocks")
    blocks = tensor.reshape(outer, inner, rows // (outer * inner), *tensor.shape[1:])  # (O, I, n, ...)
    return blocks.transpose(0, 1).reshape(tensor.shape)  # (I, O, n, ...) flattened back


def strip_prefix(tensors: StateDict, prefix: str) -> StateDict:
    """Drop ``prefix`` (a head class's base-model attribute, e.g. ``"bert."``) from names that carry it."""
    return {name.removeprefix(prefix): tensor for name, tensor in tensors.items()}


def rules_to_zoo(
    rules: Iterable[Rule],
    tensors: StateDict,
    *,
    ignore: Sequence[str] = (),
    tied: Mapping[str, str] | None = None,
) -> StateDict:
    """Apply a table to HF tensors -> zoo tensors. Every HF tensor must be used or match an ``ignore`` regex
    (or `COMMON_IGNORED`); every rule's HF tensors must exist and be floating point (fused parts of one
    dtype).

    ``tied``: HF tensors a tied config does not read, each the copy of a zoo tensor (``{"lm_head.weight":
    "embed.tokens.weight"}``). A file may store such a copy; it is used only when it equals that tensor
    (`check_tied_copies`).
    """
    out: StateDict = {}
    used: set[str] = set()
    missing: list[str] = []
    for rule in rules:
        absent = [name for name in rule.hf if name not in tensors]
        if absent:
            missing += [f"{name} (for zoo's {rule.zoo})" for name in absent]
            continue
        parts = [tensors[name] for name in rule.hf]
        for name, part in zip(rule.hf, parts):  # before any arithmetic: cat and scaling would promote ints
            if not part.is_floating_point():
                raise HFError(
                    f"{name} is {str(part.dtype).removeprefix('torch.')}: a floating-point weight is expected "
                    f"(for zoo's {rule.zoo})"
                )
        if len({part.dtype for part in parts}) > 1:
            dtypes = ", ".join(f"{n} {str(p.dtype).removeprefix('torch.')}" for n, p in zip(rule.hf, parts))
            raise HFError(f"cannot fuse {dtypes} into {rule.zoo}: their dtypes differ")
        if len(parts) > 1:
            widths = {part.shape[1:] for part in parts}
            if len(widths) > 1:
                shapes = ", ".join(f"{n} {tuple(p.shape)}" for n, p in zip(rule.hf, parts))
                raise HFError(f"cannot fuse {shapes} into {rule.zoo}: their trailing shapes differ")
            tensor = torch.cat(parts, dim=0)
        else:
            tensor = parts[0]
        if rule.interleave is not None:  # HF (groups, parts, n) rows -> zoo (parts, groups, n)
            tensor = regroup(tensor, *rule.interleave)
        if rule.rows is not None:
            if len(rule.rows) != tensor.shape[0]:
                raise HFError(
                    f"{rule.hf[0]} has {tensor.shape[0]} rows, expected {len(rule.rows)} for {rule.zoo}"
                )
            tensor = tensor[torch.tensor(rule.rows)]
        if rule.shape is not None:
            if tensor.numel() != math.prod(rule.shape):
                raise HFError(
                    f"cannot stack {tuple(tensor.shape)} from {rule.hf[0]}, ... into {rule.zoo} {rule.shape}"
                )
            tensor = tensor.reshape(rule.shape)
        out[rule.zoo] = tensor.t().contiguous() if rule.transpose else tensor
        release_unless_shared(parts, out[rule.zoo])  # fused or transposed: the file's pages of the parts go
        used.update(rule.hf)
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise HFError(f"the checkpoint lacks tensors: {', '.join(missing[:5])}{more}")
    used.update(check_tied_copies(rules, tensors, out, tied or {}))
    patterns = [re.compile(p) for p in (*COMMON_IGNORED, *ignore)]
    unused = [n for n in tensors if n not in used and not any(p.fullmatch(n) for p in patterns)]
    if unused:
        more = f" and {len(unused) - 5} more" if len(unused) > 5 else ""
        raise HFError(
            f"the checkpoint has tensors zoo's spec has no place for: {', '.join(sorted(unused)[:5])}{more}"
        )
    return out


def check_tied_copies(
    rules: Iterable[Rule], tensors: StateDict, converted: StateDict, tied: Mapping[str, str]
) -> list[str]:
    """The stored copies ``tied`` names (HF name -> the zoo tensor it copies), each checked equal to what
    zoo loads for that tensor; a copy that differs is refused, naming it.

    transformers 5 ties a head to the embeddings only when the file stores no head or an equal one: a
    different stored head is kept as a head of its own (with a warning), which a tied spec cannot hold.
    """
    sources = {rule.zoo: rule.hf[0] for rule in rules}
    found = [name for name in tied if name in tensors]
    for name in found:
        target = converted[tied[name]]
        copy = tensors[name]
        equal = copy.shape == target.shape and torch.equal(copy.to(target.dtype), target)
        release(copy)  # read once, never used: its file pages go (`zoo.io.checkpoint.mapped`)
        if not equal:
            raise HFError(
                f"{name} differs from {sources.get(tied[name], tied[name])}, but config.json ties them "
                "(tie_word_embeddings); transformers then keeps the stored one as its own head: set "
                "tie_word_embeddings to false to load it"
            )
    return found


def rules_to_hf(rules: Iterable[Rule], tensors: StateDict) -> StateDict:
    """Apply a table to zoo tensors -> HF tensors: fused rows split, transposes undone, no shared storage.

    A rule whose zoo tensor ``tensors`` lacks is an error. `NamesOnly` tensors give the names alone (each
    bound to its zoo tensor as it is): a rule whose zoo tensor is missing, or does not split as the rule
    says, is a spec the family cannot express, which the read-back names.
    """
    out: StateDict = {}
    names_only = isinstance(tensors, NamesOnly)
    for rule in rules:
        if names_only:
            out |= {name: tensors[rule.zoo] for name in rule.hf if rule.zoo in tensors}
            continue
        if rule.zoo not in tensors:
            raise HFError(f"the model has no tensor {rule.zoo}")
        tensor = tensors[rule.zoo].detach()
        if rule.interleave is not None:  # zoo (parts, groups, n) rows -> HF (groups, parts, n)
            groups, count = rule.interleave
            tensor = regroup(tensor, count, groups)
        if rule.rows is not None:  # zoo row i is HF row rows[i]: HF row rows[i] gets it back
            tensor = tensor[torch.tensor(rule.rows).argsort()]
        if rule.shape is not None:  # stacked: back to the rows of the parts
            tensor = tensor.reshape(-1, tensor.shape[-1])
        if rule.sizes is not None:
            if sum(rule.sizes) != tensor.shape[0]:
                raise HFError(
                    f"{rule.zoo} has {tensor.shape[0]} rows, expected {' + '.join(map(str, rule.sizes))}"
                )
            parts = tensor.split(list(rule.sizes), dim=0)
        else:
            parts = (tensor,)
        for name, part in zip(rule.hf, parts):
            part = part.t() if rule.transpose else part
            out[name] = (
                part.contiguous() if len(parts) == 1 else part.clone(memory_format=torch.contiguous_format)
            )
    return out


# -- decoder-only families ---------------------------------------------------------------------------------

DecoderRules = Callable[[Any, str], list[Rule]]  # (DecoderSpec, body prefix) -> the family's table


def decoder_converters(
    rules: DecoderRules,
    *,
    prefix: str,
    ignore: Sequence[str] = (),
    heads: Sequence[str] = ("lm_head.weight",),
) -> tuple[Callable[[StateDict, ModelSpec], StateDict], Callable[[StateDict, ModelSpec], StateDict]]:
    """``(hf_to_zoo, zoo_to_hf)`` for a decoder family whose head class keeps the body under ``prefix``.

    Import strips ``prefix`` wherever it appears (a headless ``*Model`` file and some original releases have
    none) and reads a tied head's stored copy of the embeddings (``heads``: its names) as transformers does:
    unused when it equals them, refused when it differs (`check_tied_copies`); export writes the prefix only
    when there is a head. ``ignore``: more regexes of tensors that hold nothing learned.
    """

    def hf_to_zoo(tensors: StateDict, spec: ModelSpec) -> StateDict:
        head = getattr(spec, "lm_head", None)
        tied = {name: "embed.tokens.weight" for name in heads} if head is None or head.tied else {}
        return rules_to_zoo(rules(spec, ""), strip_prefix(tensors, prefix), ignore=ignore, tied=tied)

    def zoo_to_hf(tensors: StateDict, spec: ModelSpec) -> StateDict:
        has_head = getattr(spec, "lm_head", None) is not None
        return rules_to_hf(rules(spec, prefix if has_head else ""), tensors)

    return hf_to_zoo, zoo_to_hf
