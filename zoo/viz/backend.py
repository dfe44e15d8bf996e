"""matplotlib without pyplot: figures drawn with the Agg canvas, fonts for Hangul, one clear missing-extra error.

Figures are made as ``matplotlib.figure.Figure`` and written through ``FigureCanvasAgg``: no global
backend is switched, so importing zoo in a notebook leaves its plotting alone. Sizes are fixed by the
caller (inches × dpi) and never trimmed (no ``bbox_inches="tight"``), so a plot's pixel size is known.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

# The package's own name on PyPI is unrelated ("zoo" is an RPC framework there), so the hint names what
# the extra installs; `make demo` and `make test` install it already.
INSTALL_HINT = "pip install matplotlib (the 'viz' extra)"

CJK_FONTS = (
    "Noto Sans CJK KR",
    "Noto Sans KR",
    "Noto Sans CJK JP",
    "Noto Sans CJK SC",
    "Source Han Sans KR",
    "NanumGothic",
    "NanumBarunGothic",
    "Malgun Gothic",
    "Apple SD Gothic Neo",
    "AppleGothic",
    "UnDotum",
    "Baekmuk Gulim",
    "Droid Sans Fallback",
    "WenQuanYi Zen Hei",
)
"""Fonts with Hangul glyphs, in order of preference."""

# Font files to register when matplotlib's font cache predates their installation.
_CJK_FILE_HINTS = (
    "notosanscjk",
    "notosanskr",
    "sourcehansans",
    "nanum",
    "droidsansfallback",
    "wqy",
    "undotum",
)

FONT_HELP = (
    "no font with Hangul/CJK glyphs was found, so those tick labels show as boxes; install one, e.g. "
    "`apt-get install fonts-noto-cjk` (or `fonts-nanum`; macOS and Windows ship one), and plot again"
)


class VizDependencyError(ImportError, ValueError):
    """matplotlib is not installed (a ValueError too, so the CLI shows the message without a traceback)."""


class MissingFontWarning(UserWarning):
    """Text needs CJK glyphs and no font on this machine has them; the plot is still written."""


def require_matplotlib() -> Any:
    """The matplotlib module, or `VizDependencyError` naming the extra to install."""
    try:
        import matplotlib
    except ImportError:
        raise VizDependencyError(f"plots need matplotlib, which is not installed: {INSTALL_HINT}") from None
    return matplotlib


def new_figure(width: float, height: float, *, dpi: int) -> Any:
    """A Figure of ``width`` × ``height`` inches on the Agg canvas: ``round(width * dpi)`` pixels wide.

    Constrained layout makes room for tick labels and titles inside that size.
    """
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=dpi, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def save(figure: Any, out: str | Path) -> Path:
    """Write ``figure`` as PNG at its own size (parent folders made); returns the path."""
    path = Path(out).expanduser()
    if path.suffix.lower() != ".png":
        raise ValueError(f"{path}: plots are written as PNG; give a file name ending in .png")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=figure.dpi)
    return path


def has_cjk(texts: Iterable[str]) -> bool:
    """Whether any text holds Hangul, CJK ideographs or kana (glyphs DejaVu Sans lacks)."""
    ranges = ((0x1100, 0x11FF), (0x3040, 0x30FF), (0x3130, 0x318F), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3))
    return any(lo <= ord(ch) <= hi for text in texts for ch in text for lo, hi in ranges)


def find_cjk_font() -> str | None:
    """The first of `CJK_FONTS` matplotlib can use, registering system font files it has not seen yet."""
    require_matplotlib()
    from matplotlib import font_manager

    manager = font_manager.fontManager

    def first() -> str | None:
        names = {entry.name for entry in manager.ttflist}
        return next((name for name in CJK_FONTS if name in names), None)

    if (found := first()) is not None:
        return found
    _register_system_cjk_fonts()
    return first()


@functools.cache
def _register_system_cjk_fonts() -> None:
    """Add CJK font files installed after matplotlib built its font cache (scanned once a process)."""
    from matplotlib import font_manager

    for file in font_manager.findSystemFonts():
        if any(hint in Path(file).name.lower() for hint in _CJK_FILE_HINTS):
            with contextlib.suppress(Exception):  # an unreadable font file is simply skipped
                font_manager.fontManager.addfont(file)


@contextlib.contextmanager
def fonts_for(texts: Iterable[str]) -> Iterator[None]:
    """Draw inside this block with a CJK-capable font first when ``texts`` need one.

    Without such a font, warns once (`MissingFontWarning`, saying how to install one) and silences
    matplotlib's per-glyph warnings; the plot is still drawn.
    """
    matplotlib = require_matplotlib()
    if not has_cjk(texts):
        yield
        return
    font = find_cjk_font()
    if font is None:
        warnings.warn(FONT_HELP, MissingFontWarning, stacklevel=3)
    families = [font, "DejaVu Sans"] if font else ["DejaVu Sans"]
    with matplotlib.rc_context({"font.family": families}), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font", category=UserWarning)
        yield
