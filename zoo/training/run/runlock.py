"""One trainer per output directory: an advisory lock on ``<output_dir>/.zoo-train.lock`` for the whole run.

    lock = lock_run(output_dir, runtime)   # rank 0 takes it; a second trainer fails at once, naming the holder
    ...
    lock.release()                         # Trainer.close(); or the process ends, however it ends

The lock is advisory: it keeps zoo trainers apart (a second one fails at once, naming the holder), not
other programs. The kernel releases a flock when its process ends, however it ends, so a crash or a kill
never leaves a stale lock. The file itself stays: deleting it on release would let a waiting process lock
the deleted file while a newcomer locks a new one. It holds the last holder's pid, host and start time.
Rank 0 is the only writer, so it alone holds the lock; under torchrun every process raises its refusal.
Without ``fcntl`` (Windows) runs go unlocked.
"""

from __future__ import annotations

import contextlib
import os
import socket
from datetime import datetime
from pathlib import Path

from zoo.io.names import RUN_LOCK_NAME
from zoo.training.distributed import Runtime, gather_objects
from zoo.training.run.rundir import RunDirError, open_no_link, writing

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None  # type: ignore[assignment]


class RunInUseError(RunDirError):
    """Another trainer holds the output directory's lock."""


class RunLock:
    """An exclusive ``flock`` on ``<output_dir>/.zoo-train.lock``, held from `acquire` to `release` (or
    until the process ends). The file names the holder: ``pid 1234 on host h since 2025-01-01T12:00:00``."""

    def __init__(self, path: Path, fd: int | None) -> None:
        self.path, self._fd = path, fd

    @classmethod
    def acquire(cls, output_dir: Path) -> RunLock:
        """Lock ``output_dir`` (created if missing), or raise `RunInUseError` at once naming the holder."""
        path = output_dir / RUN_LOCK_NAME
        if fcntl is None:
            return cls(path, None)
        with writing(path, hint="the run did not start"):
            output_dir.mkdir(parents=True, exist_ok=True)
            fd = open_no_link(path, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 1000).decode("utf-8", "replace").strip()
                os.close(fd)
                raise RunInUseError(in_use_message(output_dir, holder)) from None
            except BaseException:
                os.close(fd)
                raise
            started = datetime.now().astimezone().isoformat(timespec="seconds")
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} on host {socket.gethostname()} since {started}\n".encode())
        return cls(path, fd)

    def release(self) -> None:
        """Unlock (idempotent). The file stays, emptied: no holder."""
        if self._fd is None or fcntl is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing the descriptor drops the flock

    def __del__(self) -> None:  # a trainer dropped without close(): the lock goes with it
        # try, not contextlib.suppress: at interpreter exit the module's globals (os, contextlib) may be None
        try:  # noqa: SIM105
            self.release()
        except Exception:
            pass


def lock_run(output_dir: Path, runtime: Runtime) -> RunLock | None:
    """Rank 0 locks ``output_dir`` (the only writer); when it cannot, every process raises its error."""
    lock, refused = None, None
    if runtime.is_main:
        try:
            lock = RunLock.acquire(output_dir)
        except RunDirError as error:
            refused = error
    message = gather_objects(str(refused) if refused is not None else None, runtime)[0]
    if refused is not None:
        raise refused
    if message is not None:
        raise RunInUseError(message)
    return lock


def in_use_message(output_dir: Path, holder: str) -> str:
    holder = holder or "another process (which has not yet written its pid)"
    here = f"pid {os.getpid()} on host {socket.gethostname()} "
    whose = (
        " (this process: close the Trainer that holds it first, trainer.close())"
        if holder.startswith(here)
        else ""
    )
    return (
        f"{output_dir} is in use by {holder}{whose}: another training run is writing there; wait for it "
        "to end, or choose another output dir"
    )
