"""Hugging Face tensors -> GGUF tensors: llama.cpp's names (the ``gguf`` package's `TensorNameMap`, the
table its converter uses), the layout changes each architecture needs (`arches.Arch`) and the stored type.

    model.layers.0.self_attn.q_proj.weight ──name map──> blk.0.attn_q.weight ──permute (llama)──> (F, C)
    model.layers.0.mlp.experts.{e}.gate_proj.weight ──stack over e──> blk.0.ffn_gate_exps.weight (E, F, C)

Arrays keep PyTorch's (out, in) order: GGUF lists dimensions innermost first, so a numpy (out, in) array is
ggml's ``ne = [in, out]``, what llama.cpp expects. Types: 1-D tensors (norms, biases), the router, learned
positions and rope factors stay float32 whatever ``--type`` says, as llama.cpp's converter keeps them; with
q8_0, a tensor whose rows are not a multiple of 32 wide (Q8_0's block) is stored float16.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from zoo.export.errors import ExportError
from zoo.export.gguf.arches import Arch, Config, rotary_dims
from zoo.export.gguf.rope import llama3_factors, scaling_kind

GGUFType = Literal["f32", "f16", "bf16", "q8_0"]
GGUF_TYPES: tuple[GGUFType, ...] = ("f32", "f16", "bf16", "q8_0")

# An expert's tensor in a Hugging Face checkpoint: experts.{e}.<name>; GGUF stacks them, experts first.
_EXPERT = re.compile(r"^(?P<head>.+\.experts)\.(?P<e>\d+)\.(?P<tail>.+)$")
# GGUF names kept float32 whatever the type (besides every 1-D tensor): the router, learned positions
_KEEP_F32 = re.compile(r"(^position_embd\.|\.ffn_gate_inp\.|^rope_freqs\.|\.ffn_gate_inp_shexp\.)")


def stack_experts(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each expert's matrices stacked into one (E, ...) tensor under the name without the expert index, in
    expert order; every other tensor as it is."""
    out: dict[str, torch.Tensor] = {}
    groups: dict[str, dict[int, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        if (m := _EXPERT.match(name)) is None:
            out[name] = tensor
            continue
        groups.setdefault(f"{m['head']}.{m['tail']}", {})[int(m["e"])] = tensor
    for name, experts in groups.items():
        if sorted(experts) != list(range(len(experts))):
            raise ExportError(f"{name}: experts {sorted(experts)} are not numbered 0 to {len(experts) - 1}")
        out[name] = torch.stack([experts[e] for e in range(len(experts))])  # (E, out, in)
    return out


def permute_rotary(weight: np.ndarray, heads: int) -> np.ndarray:
    """q or k rows from HF's rotary layout (each head's first half rotates with its second) to llama.cpp's
    ``llama`` one (adjacent pairs rotate together); a bias (1-D) likewise."""
    rows = weight.shape[0]
    half = rows // heads // 2
    # (heads, 2, half, ...) -> (heads, half, 2, ...): row i of a half pairs with row i of the other, adjacent
    return weight.reshape(heads, 2, half, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


@dataclass(frozen=True)
class Planned:
    """One GGUF tensor before its data is made: its name, source, shape as stored (outermost first) and
    ggml type. Planning every tensor first lets the writer stream the data one tensor at a time."""

    name: str
    hf_name: str
    source: torch.Tensor
    shape: tuple[int, ...]
    qtype: Any  # gguf.GGMLQuantizationType

    @property
    def nbytes(self) -> int:
        from gguf import GGML_QUANT_SIZES

        block, size = GGML_QUANT_SIZES[self.qtype]
        return math.prod(self.shape) // block * size


def plan(arch: Arch, config: Config, tensors: Mapping[str, torch.Tensor], kind: GGUFType) -> list[Planned]:
    """Every Hugging Face tensor's GGUF tensor, in order; a tensor the name map does not know is refused by
    name (never left out). Llama 3's rope scaling comes first, as ``rope_freqs.weight`` (`rope`)."""
    import gguf

    arch_id = next((a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == arch.name), None)
    if arch_id is None:  # an older gguf package
        raise ExportError(f"the installed gguf package does not know llama.cpp's {arch.name!r} architecture")
    layers = int(config.get("num_hidden_layers") or config.get("n_layer") or 0)
    names = gguf.get_tensor_name_map(arch_id, layers)
    tied = config.get("tie_word_embeddings", True)
    planned = []
    if scaling_kind(config) == "llama3":  # refused for every architecture but llama (`arches.refusals`)
        factors = llama3_factors(config, rotary_dims(config))  # (rotary dims / 2,)
        freqs = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight"
        shape = tuple(factors.shape)
        planned.append(Planned(freqs, "rope_scaling", factors, shape, _qtype(freqs, shape, kind)))
    for hf_name, tensor in stack_experts(tensors).items():
        if (
            tied and hf_name == "lm_head.weight"
        ):  # llama.cpp uses the embeddings where output.weight is absent
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ExportError(
                f"{hf_name}: no tensor of llama.cpp's {arch.name} architecture holds it (gguf's name map)"
            )
        shape = tuple(tensor.shape)
        if _kind(name) in arch.transposed and name.endswith(".weight"):
            shape = shape[::-1]
        if _kind(name) == "ffn_gate_inp_shexp":
            shape = (math.prod(shape),)
        planned.append(Planned(name, hf_name, tensor, shape, _qtype(name, shape, kind)))
    return planned


def tensor_data(arch: Arch, config: Config, planned: Planned) -> np.ndarray:
    """A planned tensor's data: in the layout llama.cpp's ``arch`` reads, stored as its type."""
    from gguf.quants import quantize

    name, array = planned.name, planned.source.float().numpy()
    kind = _kind(name)
    if arch.rope_permute and kind in ("attn_q", "attn_k"):
        heads = config["num_attention_heads"] if kind == "attn_q" else config.get("num_key_value_heads")
        array = permute_rotary(array, int(heads or config["num_attention_heads"]))
    if arch.norm_offset and planned.hf_name.endswith("norm.weight"):
        array = array + 1.0  # HF's RMSNorm scales by 1 + weight, llama.cpp's by the weight
    if kind in arch.transposed and name.endswith(".weight"):
        array = array.T  # Conv1D (in, out) -> (out, in)
    array = np.ascontiguousarray(array.reshape(planned.shape), dtype=np.float32)
    return quantize(array, planned.qtype)


def _kind(name: str) -> str:
    """A GGUF tensor's kind: ``blk.0.attn_q.weight`` -> ``attn_q``, ``token_embd.weight`` -> ``token_embd``."""
    return name.split(".")[-2]


def _qtype(name: str, shape: tuple[int, ...], kind: GGUFType) -> Any:
    """The ggml type a tensor is stored as for ``kind`` (see the module's note on types)."""
    from gguf import GGMLQuantizationType as Q

    wanted = {"f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16, "q8_0": Q.Q8_0}[kind]
    if len(shape) < 2 or _KEEP_F32.search(name):
        return Q.F32
    if wanted == Q.Q8_0 and shape[-1] % 32:
        return Q.F16
    return wanted
