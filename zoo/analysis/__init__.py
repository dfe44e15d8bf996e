"""Look inside a model: its module tree, parameter counts and cost estimates, without running it.

    s = zoo.summary("gpt2", seq_len=1024, batch=8, dtype="bf16")   # built on the meta device: instant
    s.parameters.total, s.flops.forward, s.activations, s.kv_cache_per_token
    s.to_dict()                                                     # what `zoo show --json` prints

A spec, preset name, spec file or saved checkpoint directory is built on the meta device (no memory, no
initialisation); a built model is read as it is. The formulas and what they assume are in
`zoo.analysis.costs` and in ``ModelSummary.assumptions``.
"""

from __future__ import annotations

from zoo.analysis.diff import diff_specs, spec_fields
from zoo.analysis.model_summary import DTYPES, ModelSummary, dtype_info, load_target_spec, summary

__all__ = ["DTYPES", "ModelSummary", "diff_specs", "dtype_info", "load_target_spec", "spec_fields", "summary"]
