"""The run folder: what a training run keeps on disk, and how it stops and starts again from it.

    rundir        what counts as a previous run in ``output_dir``; the rules every write there follows
    runlock       one trainer per ``output_dir``: an advisory lock held for the whole run
    checkpoints   resumable checkpoints: weights, optimizer, RNG and progress, written atomically
    resume        `CheckpointIO`: a run saved and restored from its parts; which checkpoint to resume from
    global_batch  a resume on another number of processes: the checkpoint's batches per step kept
    state         `TrainerState`: where a run stands (what a checkpoint saves, what callbacks are shown)

The folder's file names are `zoo.io.names`'s, with every other file zoo reads or writes.
"""
