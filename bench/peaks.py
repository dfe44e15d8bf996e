"""Dense bf16 tensor-core peaks by GPU name, the denominator of MFU (model FLOPs utilisation).

Figures are NVIDIA's datasheet numbers without 2:4 sparsity (the datasheets print the sparse figure, twice
these, first). A name not listed here — or a MIG slice, which has only part of the GPU's compute — gets
no peak, and the report says "n/a" rather than guess; ``--peak-tflops`` supplies one.
"""

from __future__ import annotations

# (substrings that must all appear in torch.cuda.get_device_name(), dense bf16 TFLOP/s); first match wins,
# so the specific variants come before the family's default.
BF16_PEAKS: tuple[tuple[tuple[str, ...], float], ...] = (
    (("H100", "PCIE"), 756.0),  # H100 PCIe
    (("H100", "NVL"), 835.0),  # H100 NVL, per GPU
    (("H100",), 989.0),  # H100 SXM5 ("NVIDIA H100 80GB HBM3")
    (("H200", "NVL"), 835.0),  # H200 NVL
    (("H200",), 989.0),  # H200 SXM: the H100 SXM's compute with more, faster memory
    (("A100",), 312.0),  # A100 SXM4 and PCIe, 40 and 80 GB alike
)


def bf16_peak_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU named ``device_name``, or None when unknown (or a MIG slice)."""
    name = device_name.upper()
    if "MIG" in name.split():
        return None
    for needles, peak in BF16_PEAKS:
        if all(needle in name for needle in needles):
            return peak
    return None
