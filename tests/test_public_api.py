"""The public names of `import zoo`: lazily imported, reachable after a bare import, as the README uses them."""

from __future__ import annotations

import subprocess
import sys


def test_subpackages_and_functions_are_reachable_after_a_bare_import() -> None:
    code = (
        "import zoo; "
        "print(zoo.generation.stream_text.__name__, zoo.training.train.__name__, zoo.train.__name__, "
        "zoo.TextStream.__name__, zoo.read_hf_spec.__name__, zoo.lora.apply.__name__)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["stream_text", "train", "train", "TextStream", "read_hf_spec", "apply"]


def test_an_unknown_name_is_an_attribute_error() -> None:
    import pytest

    import zoo

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        zoo.nope  # noqa: B018
