"""How to install an optional extra, as every "needs X" message says it.

zoo is installed from its clone (``pip install -e .``, which ``make demo`` runs), so an extra is added the same
way, ``pip install -e '.[serve]'``; the packages are named too, for an environment that has zoo otherwise.
"""

from __future__ import annotations

# extra -> the packages it brings (pyproject.toml's [project.optional-dependencies])
PACKAGES = {
    "serve": "fastapi uvicorn",
    "metrics": "prometheus-client",
    "grammar": "llguidance",
    "eval": "lm-eval",
    "onnx": "onnx onnxscript onnxruntime",
    "gguf": "gguf",
    "quant": "torchao",
    "data": "pyarrow",
    "hub": "huggingface_hub",
    "viz": "matplotlib",
    "tensorboard": "tensorboard",
    "vision": "pillow",
}


def install_hint(extra: str) -> str:
    """``pip install -e '.[extra]'`` from zoo's clone, or the extra's packages by name."""
    return f"pip install -e '.[{extra}]' in zoo's clone (or: pip install {PACKAGES[extra]})"
