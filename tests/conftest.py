"""Pytest fixtures shared by every test; helper functions live in `support.py` (importable as `support`)."""

from __future__ import annotations

import gc
import os
import signal
from collections.abc import Iterator

import pytest
import torch

# The tests run tiny tensors, where two threads cost more in hand-offs than they win in parallelism
# (and fight each other on a loaded 2-core machine); one thread makes the suite faster and steadier.
torch.set_num_threads(1)

# A suite started in the background of a non-interactive shell (`cmd &`, nohup) inherits SIGINT ignored, and
# so would every `zoo` it starts: the Ctrl-C tests would then test nothing. Python's own handler, as in a
# terminal (exec resets a handled signal to its default in the children, an ignored one stays ignored).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True, scope="module")
def _older_objects_frozen() -> None:
    """Each module starts with the objects alive then frozen (`gc.freeze`): the collector's full passes walk
    what the module makes, not the million and more objects the modules before it left (imports, caches,
    compiled graphs), which cost 0.5-2 s a pass late in the suite, some 60 passes a run. Reference counting
    still frees a frozen object; only a reference cycle among frozen ones is never collected."""
    gc.collect()  # what the modules before left as garbage goes first: cheap, the older heap is frozen
    gc.freeze()


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="session")
def _prepared_data_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Raw training files are prepared into a cache (`zoo.training.corpus`): one for the session, never
    the user's ``~/.cache/zoo``; subprocesses (``zoo train``) inherit it."""
    before = os.environ.get("ZOO_CACHE")
    os.environ["ZOO_CACHE"] = str(tmp_path_factory.mktemp("zoo-cache"))
    yield
    if before is None:
        os.environ.pop("ZOO_CACHE", None)
    else:
        os.environ["ZOO_CACHE"] = before
