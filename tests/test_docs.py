"""The README's and the docs' code blocks run as written, in the order shown, so the docs cannot drift.

Each document's blocks run in order in a fresh working folder holding a copy of ``examples/`` and what the
README leaves behind for the other pages (``runs/demo`` from ``make demo``, ``runs/gpt`` from
``zoo train examples/gpt.yaml``):

- a ```` ```python ```` block is executed, the blocks of one document sharing one namespace;
- a ```` ```bash ```` / ```` ```sh ```` block runs each line, a ```` ```console ```` block each ``$ `` line:
  ``zoo ...`` in this process (``zoo.cli.main``: exit status 0, or 1 for ``zoo diff``), anything else
  (``python ...``, a pipe) through the shell with this venv first on ``PATH``;
- other blocks (YAML, JSON, text, transcripts' output) are not run.

An HTML comment on the line right before a block says when it does not run by default:

    <!-- slow: REASON -->       only in the slow variant (it trains, or takes more than a few seconds)
    <!-- not-run: REASON -->    never here (a GPU, the network, ``make`` itself); the reason is required

The default suite (``test_doc_blocks_run_in_order``) runs every block that is neither, against stand-ins of
the README's runs (the same configs, two steps). The slow variant (``-m slow``) runs the README end to end
(``zoo demo`` first, in place of ``make demo``), then every other page in a copy of what the README left:
57 minutes on this project's shared 2-core VM (41 minutes of CPU), most of it in training.md's runs.
A failing block is reported as ``docs/page.md:LINE`` with its command or traceback.
"""

from __future__ import annotations

import contextlib
import glob
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN_LANGUAGES = {"python", "bash", "sh", "shell", "console"}
SHELL_LANGUAGES = RUN_LANGUAGES - {"python"}
MARKER = re.compile(r"^<!--\s*(slow|not-run)\s*(?::\s*(.*?))?\s*-->$")
FENCE = re.compile(r"^```(\S*)\s*$")
# What the README's set-up and examples leave for the other pages.
README_RUNS = ("runs/demo", "runs/gpt")


@dataclass(frozen=True)
class Block:
    doc: str  # relative to the repository root
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    marker: str | None  # "slow", "not-run" or None
    reason: str

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks(path: Path, *, name: str | None = None) -> list[Block]:
    """The fenced code blocks of a Markdown file, with the marker comment right before each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    name = name or path.relative_to(ROOT).as_posix()
    found, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        assert end is not None, f"{name}:{i + 1}: a code block that is never closed"
        marker = MARKER.match(lines[i - 1].strip()) if i > 0 else None
        found.append(
            Block(
                doc=name,
                line=i + 1,
                language=opening.group(1),
                text="\n".join(lines[i + 1 : end]),
                marker=marker.group(1) if marker else None,
                reason=(marker.group(2) or "") if marker else "",
            )
        )
        i = end + 1
    return found


# --- running a block --------------------------------------------------------------------------------------


def shell_commands(block: Block) -> list[str]:
    """The command lines of a shell block: continuation lines joined; ``$ `` lines only in a console block."""
    commands, pending = [], ""
    for raw in block.text.splitlines():
        line = raw.rstrip()
        if block.language == "console":
            if not pending and not line.startswith("$ "):
                continue  # output
            line = line.removeprefix("$ ") if not pending else line
        line = pending + line
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if shlex.split(line, comments=True):
            commands.append(line)
    return commands


def run_zoo(argv: list[str]) -> tuple[int, str]:
    """``zoo ARGS`` in this process: its exit status (argparse's exits too) and the end of its stderr, which
    is also passed on."""
    from zoo.cli import main

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            status = main(argv)
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else 2
    finally:
        sys.stderr.write(err.getvalue())
    return status, err.getvalue()[-3000:]


def expand(words: list[str]) -> list[str]:
    """Glob patterns expanded as a shell would (kept as written when nothing matches)."""
    out: list[str] = []
    for word in words:
        matches = sorted(glob.glob(word)) if any(c in word for c in "*?[") else []
        out += matches or [word]
    return out


def run_command(command: str, block: Block) -> None:
    words = shlex.split(command, comments=True)
    through_shell = words[0] != "zoo" or any(op in words for op in ("|", ">", "<", "&&", ";", "||"))
    if through_shell:
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        done = subprocess.run(command, shell=True, env=env, capture_output=True, text=True)
        sys.stdout.write(done.stdout)
        status, detail = done.returncode, (done.stdout + done.stderr)[-3000:]
    else:
        status, detail = run_zoo(expand(words[1:]))
    allowed = {0, 1} if words[:2] == ["zoo", "diff"] else {0}
    if status not in allowed:
        raise DocBlockError(f"{block.where}: `{command}` exited with status {status}\n{detail}")


class DocBlockError(AssertionError):
    """A block of a document failed; the message starts with ``doc:line``."""


def run_block(block: Block, namespace: dict) -> None:
    if block.language == "python":
        code = compile("\n" * block.line + block.text, block.doc, "exec")  # tracebacks show the doc's lines
        try:
            exec(code, namespace)
        except Exception as error:
            raise DocBlockError(
                f"{block.where}: the python block failed: {type(error).__name__}: {error}\n"
                + "".join(traceback.format_exception(error)[-6:])
            ) from error
    else:
        for command in shell_commands(block):
            run_command(command, block)


def runnable(block: Block, *, slow: bool) -> bool:
    if block.language not in RUN_LANGUAGES or block.marker == "not-run":
        return False
    return slow or block.marker != "slow"


def run_document(doc_blocks: list[Block], *, slow: bool) -> list[tuple[str, float]]:
    """Run a document's blocks in order in the current folder; returns (where, seconds) per block run."""
    namespace: dict = {"__name__": "__doc__"}
    timings = []
    for block in doc_blocks:
        if runnable(block, slow=slow):
            started = time.perf_counter()
            run_block(block, namespace)
            timings.append((block.where, time.perf_counter() - started))
    return timings


# --- working folders ---------------------------------------------------------------------------------------


@pytest.fixture
def in_folder(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Path], Path]]:
    """Enter a working folder the way a user would be in one: offline, this venv's commands first."""
    threads = torch.get_num_threads()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")

    def enter(folder: Path) -> Path:
        monkeypatch.chdir(folder)
        return folder

    yield enter
    torch.set_num_threads(threads)


def workspace(folder: Path, runs_from: Path | None = None) -> Path:
    """``folder`` with a copy of ``examples/`` and, when given, the README's runs from ``runs_from``."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copytree(ROOT / "examples", folder / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    for run in README_RUNS if runs_from is not None else ():
        if (runs_from / run).is_dir():
            shutil.copytree(runs_from / run, folder / run)
    return folder


@pytest.fixture(scope="session")
def stand_in_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's runs, cut to two steps: a translator shaped like ``runs/demo`` (the demo's model and
    data, examples/translate.yaml) and ``runs/gpt`` (examples/gpt.yaml)."""
    folder = workspace(tmp_path_factory.mktemp("stand-ins"))
    cwd, threads = Path.cwd(), torch.get_num_threads()
    os.chdir(folder)
    try:
        for argv in (
            ["examples/translate.yaml", "--output-dir", "runs/demo", "--set", "task.bleu=false"],
            ["examples/gpt.yaml"],
        ):
            status, err = run_zoo(["train", *argv, "--max-steps", "2", "--no-progress"])
            assert status == 0, f"the stand-in run `zoo train {' '.join(argv)}` failed: {err}"
    finally:
        os.chdir(cwd)
        torch.set_num_threads(threads)
    return folder


def doc_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


# --- the docs' own rules -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", DOCS, ids=doc_id)
def test_every_marker_has_a_reason_and_every_transcript_a_language(path: Path) -> None:
    text = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(text, 1):
        if re.match(r"^<!--\s*(slow|not-run)", line.strip()):
            marker = MARKER.match(line.strip())
            assert marker and marker.group(2), f"{doc_id(path)}:{number}: a marker needs a reason: {line}"
            assert number < len(text) and FENCE.match(text[number]), (
                f"{doc_id(path)}:{number}: a marker must be the line right before a code block"
            )
    for block in blocks(path):
        if block.language == "":  # an unlabelled block holding commands would silently never run
            assert not re.search(r"^\$ ", block.text, re.M), f"{block.where}: label the transcript ```console"


# What a documented command or call writes: a CLI's --out / --output-dir, zoo.save, zoo.to_hf, save_pretrained.
WRITTEN = re.compile(
    r"--out(?:put)?(?:-dir)?[ =]([^\s'\"]+)"
    r"|(?:zoo\.save|to_hf)\([^\n]*?,\s*[\"']([^\"']+)[\"']"
    r"|save_pretrained\(\s*[\"']([^\"']+)[\"']"
)


def test_what_the_docs_write_goes_under_runs_or_a_path_git_ignores() -> None:
    """A user follows the docs in the repository's root: nothing a documented command writes may show up as
    an untracked file there (``runs/`` and the other outputs are in .gitignore)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout")
    written = {
        match.group(1) or match.group(2) or match.group(3): block.where
        for path in DOCS
        for block in blocks(path)
        if block.language in RUN_LANGUAGES
        for match in WRITTEN.finditer(block.text)
    }
    paths = sorted(p for p in written if not p.startswith(("$", "{", "/", "~")) and "FILE" not in p)
    assert len(paths) > 20  # the pattern finds the docs' outputs
    done = subprocess.run(
        ["git", "check-ignore", "--no-index", *paths], capture_output=True, text=True, cwd=ROOT
    )
    ignored = set(done.stdout.split())
    loose = [f"{written[p]}: {p}" for p in paths if p not in ignored]
    assert not loose, "written into the repository and not ignored by git:\n" + "\n".join(loose)


def test_a_failing_block_is_reported_with_its_document_and_line(tmp_path: Path, in_folder) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# A page\n\n```python\nx = 1\n```\n\n<!-- slow: trains -->\n```bash\nzoo nothing-such\n```\n\n"
        "```python\nassert x == 2, 'x is 1'\n```\n\n```bash\nzoo presets\nzoo show gpt2-tiny --dtype nope\n```\n",
        encoding="utf-8",
    )
    found = blocks(page, name="page.md")
    assert [(b.line, b.marker) for b in found] == [(3, None), (8, "slow"), (12, None), (16, None)]
    in_folder(tmp_path)
    with pytest.raises(DocBlockError, match=r"^page\.md:12: the python block failed: AssertionError: x is 1"):
        run_document(found, slow=False)
    with pytest.raises(DocBlockError, match=r"^page\.md:16: `zoo show gpt2-tiny --dtype nope` exited with"):
        run_document([found[0], found[3]], slow=False)
    with pytest.raises(DocBlockError, match=r"^page\.md:8: `zoo nothing-such` exited with status 2"):
        run_document(found, slow=True)


def test_console_blocks_run_their_prompt_lines_only() -> None:
    block = Block(
        "p.md", 1, "console", "$ zoo presets \\\n  --help\noutput line\n$ zoo schema  # x", None, ""
    )
    commands = shell_commands(block)
    assert [shlex.split(c, comments=True) for c in commands] == [
        ["zoo", "presets", "--help"],
        ["zoo", "schema"],
    ]


# --- the docs, run ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", DOCS, ids=doc_id)
def test_doc_blocks_run_in_order(path: Path, stand_in_runs: Path, tmp_path: Path, in_folder) -> None:
    in_folder(workspace(tmp_path / "work", runs_from=None if path.name == "README.md" else stand_in_runs))
    if path.name == "README.md":  # its own runs come from its slow blocks: stand-ins instead
        for run in README_RUNS:
            shutil.copytree(stand_in_runs / run, Path(run))
    timings = run_document(blocks(path), slow=False)
    print("\n".join(f"{where}: {seconds:.1f} s" for where, seconds in timings))


@pytest.fixture(scope="session")
def readme_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README run end to end, after ``zoo demo`` (what ``make demo`` runs after installing)."""
    folder = workspace(tmp_path_factory.mktemp("readme"))
    cwd, threads, env = Path.cwd(), torch.get_num_threads(), dict(os.environ)
    os.chdir(folder)
    os.environ.update(HF_HUB_OFFLINE="1", MPLBACKEND="Agg")
    try:
        started = time.perf_counter()
        status, err = run_zoo(["demo"])
        assert status == 0, f"zoo demo failed: {err}"
        timings = [
            ("zoo demo", time.perf_counter() - started),
            *run_document(blocks(ROOT / "README.md"), slow=True),
        ]
        print("\n".join(f"{where}: {seconds:.1f} s" for where, seconds in timings))
    finally:
        os.chdir(cwd)
        torch.set_num_threads(threads)
        os.environ.clear()
        os.environ.update(env)
    return folder


@pytest.mark.slow
def test_readme_runs_end_to_end(readme_runs: Path) -> None:
    for run in README_RUNS:
        assert (readme_runs / run / "model.safetensors").is_file(), f"the README did not leave {run}"


@pytest.mark.slow
@pytest.mark.parametrize("path", DOCS[1:], ids=doc_id)
def test_doc_runs_end_to_end(path: Path, readme_runs: Path, tmp_path: Path, in_folder) -> None:
    in_folder(workspace(tmp_path / "work", runs_from=readme_runs))
    timings = run_document(blocks(path), slow=True)
    print("\n".join(f"{where}: {seconds:.1f} s" for where, seconds in timings))
