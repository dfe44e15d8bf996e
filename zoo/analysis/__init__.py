"""Look inside a model: its module tree, parameter counts and cost estimates, without running it.

    s = zoo.summary("gpt2", seq_len=1024, batch=8, dtype="bf16")   # built on the meta device: instant
    s.parameters.total, s.flops.forward, s.activations, s.kv_cache_per_token
    s.to_dict()                                                     # what `zoo show --json` prints

A spec, preset name, spec file or saved checkpoint directory is built on the meta device (no memory, no
initialisation); a built model is read as it is. The formulas and what they assume are in
`zoo.analysis.costs` and in ``ModelSummary.assumptions``.
"""

from __future__ import annotations

from zoo.analysis.diff import METADATA_FIELDS, diff_specs, is_metadata, spec_fields
from zoo.analysis.model_summary import DTYPES, ModelSummary, dtype_info, load_target_spec, summary
from zoo.analysis.weights import TensorDiff, WeightsDiff, WeightsError, diff_weights, load_target_weights

__all__ = [
    "DTYPES",
    "METADATA_FIELDS",
    "ModelSummary",
    "TensorDiff",
    "WeightsDiff",
    "WeightsError",
    "diff_specs",
    "diff_weights",
    "dtype_info",
    "is_metadata",
    "load_target_spec",
    "load_target_weights",
    "spec_fields",
    "summary",
]
