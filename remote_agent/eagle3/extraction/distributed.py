"""Just enough torch.distributed for data-parallel extraction under torchrun: rank, world,
device, barrier, broadcast from rank 0 and sums. A single process works without it."""

from __future__ import annotations

import os
from typing import Any


class Dist:
    def __init__(self, device: str = "auto") -> None:
        import torch

        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda":
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
        else:
            self.device = torch.device(device)
        self.enabled = self.world > 1
        if self.enabled and not torch.distributed.is_initialized():
            # our collectives are tiny; NVLink multicast only risks shared hosts' GPUs
            os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
            os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            torch.distributed.init_process_group(backend=backend)

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

    def sum(self, values: list[float]) -> list[float]:
        if not self.enabled:
            return values
        import torch

        t = torch.tensor(values, dtype=torch.float64, device=self._collective_device())
        torch.distributed.all_reduce(t)
        return t.tolist()

    def max(self, value: float) -> float:
        if not self.enabled:
            return value
        import torch

        t = torch.tensor([value], dtype=torch.float64, device=self._collective_device())
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return float(t.item())

    def _collective_device(self):
        return self.device if self.device.type == "cuda" else "cpu"

    def close(self) -> None:
        if self.enabled:
            import torch

            if torch.distributed.is_initialized():
                # every rank must reach teardown before any destroys: gloo aborts
                # ("terminate called without an active exception") when a peer's
                # connection closes under an in-flight pair
                torch.distributed.barrier()
                torch.distributed.destroy_process_group()
