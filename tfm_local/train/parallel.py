"""Data-parallel fits over the GPUs of one host: the torch.distributed side of ``fit``.

Launched as ``torchrun --standalone --nproc_per_node N -m tfm_local.cli.train fit ...``, each of
the N processes (ranks) sees ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK`` in its environment
(and ``MASTER_ADDR`` / ``MASTER_PORT`` for the rendezvous). ``process_group`` joins them:
backend NCCL on CUDA (rank r on ``cuda:LOCAL_RANK``), gloo on the CPU. One optimiser step of
``fit`` then takes N batches of the plan, one per rank; ``Comm.average_gradients`` sums the
gradients over the ranks and divides them by the number of batches, so every rank takes the
same step and the weights stay the same on all of them (``Comm.check_same`` verifies it).
The gradients are reduced by hand after the backward pass rather than by DistributedDataParallel:
the last step of an epoch may have fewer batches than ranks (a rank without one adds zeros and
the mean is over the batches present, which DDP's division by the world size would not give),
and every drafter parameter is trained (the target's embedding and LM head are plain tensors,
outside the drafter), so there is nothing for DDP to skip. The price: no overlap of the
reduction with the backward pass.

Without torchrun (``WORLD_SIZE`` unset or 1) the ``Comm`` is a single process: no process
group, and every operation is the identity (a fit is exactly what it was before).
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch

from .errors import TrainError


def launch_env() -> tuple[int, int, int]:
    """(rank, world size, local rank) set by torchrun; (0, 1, 0) outside it.

    Raises:
        TrainError: a malformed or inconsistent ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK``.
    """
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0")) if world > 1 else 0
        local = int(os.environ.get("LOCAL_RANK", str(rank))) if world > 1 else 0
    except ValueError as e:
        raise TrainError(f"malformed torchrun environment (WORLD_SIZE / RANK / LOCAL_RANK): {e}") from None
    if world < 1 or not 0 <= rank < world or local < 0:
        raise TrainError(f"inconsistent torchrun environment: RANK {rank}, WORLD_SIZE {world}, LOCAL_RANK {local}")
    return rank, world, local


def is_main_process() -> bool:
    """True outside torchrun and in its rank 0: the process that writes logs, checkpoints and exports."""
    return launch_env()[0] == 0


@dataclass
class Comm:
    """This process's place in the fit: ``rank`` of ``world`` processes, computing on ``device``.

    With ``world`` 1 every method returns its input unchanged (no collective is made).
    """

    device: torch.device
    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        """Rank 0: the one that logs, evaluates the held-out set and writes checkpoints."""
        return self.rank == 0

    def average_gradients(self, params: Iterable[torch.nn.Parameter], n: int) -> None:
        """Sum the gradients of ``params`` over the ranks, then divide them by ``n`` (the batches of the step).

        A rank without a batch in the step (the last step of an epoch may have fewer batches than ranks)
        contributes zeros. With one process and ``n`` 1 nothing is touched.
        """
        params = list(params)
        if self.world > 1:
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            import torch.distributed as dist

            works = [dist.all_reduce(p.grad, async_op=True) for p in params]
            for w in works:
                w.wait()
        if n != 1:
            for p in params:
                if p.grad is not None:
                    p.grad.div_(n)

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sums of ``values`` over the ranks (float64)."""
        if self.world == 1:
            return list(values)
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def broadcast_int(self, value: int) -> int:
        """Rank 0's ``value`` on every rank (e.g. the step total the time budget re-fitted)."""
        if self.world == 1:
            return value
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.broadcast(t, 0)
        return int(t.item())

    def check_same(self, model: torch.nn.Module, step: int) -> None:
        """Verify that ``model``'s weights are the same on every rank (one float64 checksum each).

        Raises:
            TrainError: the checksums differ (the ranks took different steps).
        """
        if self.world == 1:
            return
        import torch.distributed as dist

        with torch.no_grad():
            c = sum((p.double().sum() + p.double().square().sum()) for p in model.parameters())
            t = torch.stack([c, -c]).to(self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        hi, lo = t[0].item(), -t[1].item()
        if hi != lo:
            raise TrainError(f"the drafter weights differ between the {self.world} processes at step {step} "
                             f"(checksums {lo!r} .. {hi!r}): the data-parallel fit is out of step")


@contextmanager
def process_group(device: str | torch.device) -> Iterator[Comm]:
    """The ``Comm`` of this process for a fit on ``device`` ("cuda" or "cpu").

    Under torchrun (``WORLD_SIZE`` > 1) joins the process group (NCCL on CUDA, each rank on
    ``cuda:LOCAL_RANK`` whatever index ``device`` names; gloo on the CPU) and leaves it at the
    end, also on an error; a group that is already initialised is used and left alone.

    Raises:
        TrainError: the torchrun environment is inconsistent, ``LOCAL_RANK`` names a GPU that
            does not exist, or the device is neither CUDA nor the CPU.
    """
    rank, world, local = launch_env()
    dev = torch.device(device)
    if world == 1:
        yield Comm(dev)
        return
    import torch.distributed as dist

    if dev.type == "cuda":
        if local >= torch.cuda.device_count():
            raise TrainError(f"LOCAL_RANK {local} but only {torch.cuda.device_count()} CUDA devices: "
                             "--nproc_per_node must not exceed the GPUs of the host")
        dev, backend = torch.device("cuda", local), "nccl"
        torch.cuda.set_device(dev)
    elif dev.type == "cpu":
        backend = "gloo"
    else:
        raise TrainError(f"a data-parallel fit runs on CUDA or the CPU, not on {dev}")
    own = not dist.is_initialized()
    if own:
        dist.init_process_group(backend)  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE from torchrun
    try:
        if dist.get_world_size() != world or dist.get_rank() != rank:
            raise TrainError(f"the process group (rank {dist.get_rank()} of {dist.get_world_size()}) is not "
                             f"the torchrun environment's (rank {rank} of {world})")
        yield Comm(dev, rank, world)
    finally:
        if own:
            dist.destroy_process_group()
