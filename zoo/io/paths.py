"""A file zoo finds inside a folder stays inside it: a symbolic link out of the folder is not followed.

    file = inside(folder, "model.safetensors")        # folder / name, or an error naming the link

A checkpoint folder is something a user is given (a download, a colleague's run); a ``model.safetensors``
there that links to ``/etc/passwd`` must not be opened, nor an index's shard that links into another
folder, nor a training checkpoint's optimizer state linked elsewhere. Index entries with ``..`` or an
absolute path are refused by name (`zoo.io.names.is_plain_file_name`); this is the same rule for links.

What stays allowed: a link that resolves inside the folder (``latest -> step-200``), a folder that is
itself a link (the user named it), a file the user names directly (``zoo.load("x/model.safetensors")``
opens what they named), and Hugging Face's hub cache, whose ``snapshots/<revision>/`` files link to
``../../blobs/``: for a folder in a ``models--<org>--<name>/snapshots/`` tree, the repository's cache
folder is the one the links must stay in.
"""

from __future__ import annotations

from pathlib import Path


class OutsideFolderError(ValueError):
    """A file found in a folder is a symbolic link that leads out of it."""


def containment_root(folder: Path) -> Path:
    """The resolved folder that files found in ``folder`` must resolve into (see the module)."""
    root = folder.resolve()
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith("models--"):
        return root.parent.parent  # the hub cache: snapshots/<revision>/<file> -> ../../blobs/<hash>
    return root


def inside(folder: Path, name: str, *, error: type[Exception] = OutsideFolderError) -> Path:
    """``folder / name``, after checking that it does not resolve outside ``folder`` (a link out of it;
    ``name`` is a file name or a relative path the caller has checked has no ``..``).

    Nothing is opened or read: the check uses the links alone, so a refused file's size or content is never
    revealed. ``error`` is the exception raised (a caller's own kind, e.g. ``CheckpointError``); its message
    names the file and where it leads.
    """
    path = folder / name
    target = path.resolve()  # every link on the way followed (a missing file resolves as far as it can)
    if target.is_relative_to(containment_root(folder)):
        return path
    raise error(
        f"{path}: a symbolic link out of its folder (to {target}); zoo does not follow links out of a "
        "checkpoint folder: copy the file in, or pass the file itself"
    )
