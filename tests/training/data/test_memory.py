"""prepare's memory stays flat: a corpus ten times larger costs no more peak memory (within noise)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[3]

PREPARE = """
import sys
from tokenizers import Tokenizer
from zoo.training.data.prepare import encode_text_sides, prepare
from zoo.training.data.shards import SideInfo
from zoo.training.data.sources import Source

tok = Tokenizer.from_file(sys.argv[2])
side = SideInfo(vocab_size=tok.get_vocab_size())
source = Source("tsv", sys.argv[1], ("source", "target"))
prepare(source, encode_text_sides(tok, ("source", "target")), sys.argv[3], sides={"source": side, "target": side})
status = open("/proc/self/status", encoding="utf-8").read()
print(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))  # KiB
"""


def write_pairs(path: Path, pairs: int) -> None:
    """``pairs`` lines of two random-word sides, 5-45 words each."""
    rng = np.random.default_rng(0)
    words = np.array(["".join(rng.choice(list("abcdefghij"), size=rng.integers(2, 8))) for _ in range(2_000)])
    with path.open("w", encoding="utf-8") as f:
        for start in range(0, pairs, 10_000):
            counts = rng.integers(5, 46, size=(10_000, 2))
            draws = iter(words[rng.integers(0, len(words), size=int(counts.sum()))].tolist())
            f.writelines(
                " ".join(next(draws) for _ in range(a))
                + "\t"
                + " ".join(next(draws) for _ in range(b))
                + "\n"
                for a, b in counts[: pairs - start].tolist()
            )


def peak_rss_mb(tsv: Path, tokenizer: Path, out: Path) -> float:
    """The child's own peak resident set (VmHWM). Not ru_maxrss: a child's starts from the parent's
    resident set at the fork, and this test's parent (pytest, torch loaded) is larger than the child."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-c", PREPARE, str(tsv), str(tokenizer), str(out)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return int(result.stdout.split()[-1]) / 1024


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads the peak resident set from /proc")
def test_prepare_peak_memory_does_not_grow_with_the_corpus(tmp_path: Path, tokenizer: Tokenizer) -> None:
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    small, large = tmp_path / "small.tsv", tmp_path / "large.tsv"
    write_pairs(small, 20_000)
    write_pairs(large, 200_000)  # ~60 MB of text, ~14M tokens: held in memory it would be ~1 GB of lists
    small_peak = peak_rss_mb(small, tmp_path / "tokenizer.json", tmp_path / "small")
    large_peak = peak_rss_mb(large, tmp_path / "tokenizer.json", tmp_path / "large")
    print(small_peak, large_peak)
    assert large_peak < small_peak * 1.1 + 30, (small_peak, large_peak)
