"""torchrun's process group for the payload's two data-parallel jobs (extraction and training):
rank, world and device from the environment, the few collectives they use, and a teardown that
every rank reaches together. A plain run is one rank and never touches torch.distributed."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: Any = None  # torch.device; None for callers that never place tensors

    @classmethod
    def from_env(cls, device: str = "auto") -> Dist:
        """torchrun sets WORLD_SIZE/RANK/LOCAL_RANK; `device` is auto | cuda | cpu (or any torch
        device name). Under torchrun, rank r uses cuda:LOCAL_RANK and NCCL, or gloo on CPU."""
        import torch

        world = int(os.environ.get("WORLD_SIZE", "1"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda":
            torch.cuda.set_device(local_rank)
            dev = torch.device("cuda", local_rank)
        else:
            dev = torch.device(device)
        if world == 1:
            return cls(device=dev)
        if not torch.distributed.is_initialized():
            # our collectives are small; NVLink multicast only risks shared hosts' GPUs
            os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
            os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
            torch.distributed.init_process_group("nccl" if dev.type == "cuda" else "gloo")
        return cls(
            torch.distributed.get_rank(), torch.distributed.get_world_size(), local_rank, dev
        )

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    def barrier(self) -> None:
        if self.enabled:
            import torch

            torch.distributed.barrier()

    def broadcast(self, obj: Any) -> Any:
        """rank 0's value on every rank."""
        if not self.enabled:
            return obj
        import torch

        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def all_reduce_sum(self, t):
        """Sums a tensor over ranks in place (it must be on the collective's device); returns it."""
        if self.enabled:
            import torch

            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM)
        return t

    def sum(self, values: list[float]) -> list[float]:
        if not self.enabled:
            return values
        import torch

        return self.all_reduce_sum(
            torch.tensor(values, dtype=torch.float64, device=self._collective_device())
        ).tolist()

    def max(self, value: float) -> float:
        if not self.enabled:
            return value
        import torch

        t = torch.tensor([value], dtype=torch.float64, device=self._collective_device())
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return float(t.item())

    def _collective_device(self):
        return self.device if self.device is not None and self.device.type == "cuda" else "cpu"

    def close(self) -> None:
        """Every rank reaches a barrier before any destroys the group: gloo aborts ("terminate
        called without an active exception") when a peer leaves mid-exchange, and an exit
        without destroying leaks NCCL communicators."""
        if self.enabled:
            import torch

            if torch.distributed.is_initialized():
                torch.distributed.barrier()
                torch.distributed.destroy_process_group()


def exit_process(code: int | None) -> None:
    """End `python -m remote_agent.eagle3`. Under torchrun (WORLD_SIZE > 1) a rank leaves
    without the interpreter's teardown (`leave_now`); a plain run exits the ordinary way."""
    import sys

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        sys.exit(code)
    leave_now(code if isinstance(code, int) else 0)


def leave_now(code: int = 0) -> None:
    """Flush the output, then end this process without the interpreter's teardown: after a
    clean barrier and destroy_process_group, gloo's threads can still meet the static
    destructors there ("terminate called without an active exception", SIGABRT), and torchrun
    then reports a finished training as failed (seen 1 in 5 runs of the 2-rank CPU test on
    2026-12-07). Every file the commands write is closed by then (atomic writes, `with`
    blocks)."""
    import logging
    import sys

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken pipe: nothing left to save
    os._exit(code)
