"""One process or many: the runtime of a training run, and the model wrappers that go with it.

Under ``torchrun`` (``WORLD_SIZE`` > 1 in the environment) the process group is initialised from the
environment: NCCL on CUDA, gloo on CPU. Each process then trains on its own share of the batches:

    ddp    every process holds the whole model; DistributedDataParallel averages the gradients
    fsdp   FSDP2 (``torch.distributed.fsdp.fully_shard``): each layer, then the root, sharded across
           processes; parameters are gathered just in time for each layer's forward and backward

Without torchrun the same code runs as one plain process. Only rank 0 prints and writes files.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

from zoo.devices import resolve_device
from zoo.layers import Layer


class TorchVersionError(ImportError, ValueError):
    """This torch lacks what the run asks for (a ValueError too, so the CLI shows its one line)."""


@dataclass(frozen=True)
class Runtime:
    """Where this process runs and who its peers are."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    owns_group: bool = False  # this runtime initialised the process group, so it tears it down

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def start_runtime(device: str = "auto") -> Runtime:
    """Read torchrun's environment and join (or start) the process group; a plain process when alone."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    resolved = resolve_device(device, local_rank=local_rank)  # one GPU per process
    if resolved.type == "cuda":
        torch.cuda.set_device(resolved)
    owns = False
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if resolved.type == "cuda" else "gloo")
        owns = True
    return Runtime(rank, world_size, local_rank, resolved, owns_group=owns)


def stop_runtime(runtime: Runtime) -> None:
    if runtime.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(values: list[float], runtime: Runtime) -> list[float]:
    """Sum a few numbers over every process (float64, so token counts stay exact)."""
    if not runtime.distributed:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=runtime.device)
    dist.all_reduce(tensor)
    return tensor.tolist()


def gather_objects(obj: Any, runtime: Runtime) -> list[Any]:
    """Every process's ``obj``, in rank order (used for per-rank RNG states)."""
    if not runtime.distributed:
        return [obj]
    gathered: list[Any] = [None] * runtime.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def barrier(runtime: Runtime) -> None:
    if runtime.distributed:
        dist.barrier()


# --- model wrapping ---------------------------------------------------------------------------------------


def transformer_layers(model: nn.Module) -> list[Layer]:
    """Every distinct layer module (a shared ALBERT layer once)."""
    return [module for module in model.modules() if isinstance(module, Layer)]


def checkpoint_activations(model: nn.Module) -> None:
    """Recompute each layer's activations in backward instead of storing them (memory for compute).

    The layer's own ``forward`` is wrapped, so module paths and state-dict names do not change and
    ``fully_shard`` still sees the layer. The recomputation replays the same dropout masks.
    """
    for layer in transformer_layers(model):
        # An instance attribute shadows the method on purpose (see above); mypy forbids assigning to methods.
        layer.forward = functools.partial(checkpoint, layer.forward, use_reentrant=False)  # type: ignore[method-assign]


def compile_layers(model: nn.Module) -> None:
    """``torch.compile`` each layer in place (per-layer, as torchtitan does: small graphs, names unchanged)."""
    for layer in transformer_layers(model):
        layer.compile(dynamic=True)


def wrap_model(
    model: nn.Module, runtime: Runtime, *, strategy: Literal["ddp", "fsdp"], find_unused: bool = False
) -> nn.Module:
    """The module to train through: ``model`` itself alone, DDP around it, or ``model`` sharded in place."""
    if not runtime.distributed:
        return model
    if strategy == "fsdp":
        fully_shard, register_fsdp_forward_method = _fsdp2()
        for layer in transformer_layers(model):
            fully_shard(layer)
        fully_shard(model)
        # Generation enters through these methods, not forward (`zoo.generation.protocol`): gather the root's
        # parameters for them too.
        for method in ("encode", "decode", "prepare_generation", "next_token_logits"):
            if hasattr(model, method):
                register_fsdp_forward_method(model, method)
        return model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [runtime.device] if runtime.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, find_unused_parameters=find_unused)


def _fsdp2() -> tuple[Callable[..., Any], Callable[..., Any]]:
    """FSDP2's ``fully_shard`` and ``register_fsdp_forward_method``, public in ``torch.distributed.fsdp``
    from torch 2.6 (2.4 and 2.5 had them under ``torch.distributed._composable.fsdp``)."""
    try:
        from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method
    except ImportError:
        raise TorchVersionError(
            f"FSDP2 (distributed.strategy: fsdp) needs torch >= 2.6 (found {torch.__version__}): upgrade "
            "torch, or train with strategy: ddp"
        ) from None
    return fully_shard, register_fsdp_forward_method


@runtime_checkable
class _NoSync(Protocol):
    """DistributedDataParallel's switch (a context)."""

    def no_sync(self) -> AbstractContextManager[Any]: ...


@runtime_checkable
class _GradientSyncToggle(Protocol):
    """FSDP2's switch (``FSDPModule``)."""

    def set_requires_gradient_sync(self, requires_gradient_sync: bool) -> None: ...


@contextmanager
def no_gradient_sync(module: nn.Module, enabled: bool) -> Iterator[None]:
    """Skip the gradient all-reduce on all but the last micro-batch of an accumulated step."""
    if not enabled:
        yield
        return
    if isinstance(module, _NoSync):  # DDP
        with module.no_sync():
            yield
        return
    if isinstance(module, _GradientSyncToggle):  # FSDP2
        module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)
        return
    with nullcontext():
        yield
