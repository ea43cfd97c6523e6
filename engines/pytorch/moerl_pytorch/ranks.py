"""The rank contract (docs/native-ep.md, "Rank env contract") on torch.distributed: gloo on
CPU, NCCL on GPUs, the group formed at rank 0's MOERL_COORDINATOR through torch's TCPStore.
Parameters are sharded with FSDP2 (fully_shard per decoder layer and at the root) with sum
reductions, so each rank's gradient shard is the sum over ranks, as the native allreduce."""

from datetime import timedelta

import torch
import torch.distributed as dist

from .contract import RankContract, publish_port, published_port
from .errors import BadInput


def pick_device(name: str, rank: int) -> torch.device:
    """auto: a GPU when there is one (rank % device count), else the CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise BadInput("--device cuda: no CUDA device is visible")
        index = rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


class Group:
    """This rank's place among the ranks; one rank needs no process group at all."""

    def __init__(self, contract: RankContract, device: torch.device):
        self.rank, self.world_size, self.device = contract.rank, contract.world_size, device
        if self.world_size == 1:
            return
        # Rank 0 serves the store on the coordinator's port; every rank connects within the
        # start-up deadline, and each collective afterwards has MOERL_TIMEOUT_S. Port 0: rank 0
        # serves it on a port the kernel picks and publishes that before the others can connect
        # (so it must not wait for them here), the others read it (docs/engines.md).
        publishes = contract.port == 0 and self.rank == 0
        port = contract.port
        if contract.port == 0 and self.rank > 0:
            port = published_port(contract.port_file, contract.startup_timeout_s)
        store = dist.TCPStore(contract.host, port, self.world_size, is_master=self.rank == 0,
                              timeout=timedelta(seconds=contract.startup_timeout_s),
                              wait_for_workers=not publishes)
        if publishes:
            publish_port(contract.port_file, store.port)
        self._store, self._timeout_s = store, contract.timeout_s
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store,
                                rank=self.rank, world_size=self.world_size,
                                timeout=timedelta(seconds=contract.timeout_s))

    @property
    def sharded(self) -> bool:
        return self.world_size > 1

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """In place, and returned (a CPU tensor travels through the device for NCCL)."""
        if self.world_size > 1:
            x = t.to(self.device)
            dist.all_reduce(x, op=dist.ReduceOp.SUM)
            t.copy_(x)
        return t

    def finish(self) -> None:
        """The end of a run that went well: rank 0, which serves the store, leaves last, so no
        rank's store client outlives its server (one whose server vanished while it shut down
        aborted its process: "terminate called without an active exception")."""
        self.close()
        if self.world_size == 1:
            return
        if self.rank > 0:
            self._store.set(f"closed/{self.rank}", "1")
        else:
            self._store.wait([f"closed/{r}" for r in range(1, self.world_size)], timedelta(seconds=self._timeout_s))

    def close(self) -> None:
        if self.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()


def shard_model(model) -> None:
    """FSDP2: each decoder layer and the root (embeddings, final norm, LM head) are sharded over
    the ranks along dim 0 (the fused expert tensors [E, ...] by experts). Gradients are reduced
    by sum (gradient divide factor 1, sum-only collectives: gloo has no PREMUL_SUM), since the
    losses are already normalised by the step's global counts."""
    from torch.distributed.fsdp import fully_shard

    units = [*model.model.layers, model]
    for unit in units:
        fully_shard(unit)
    for unit in units:
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor on every rank (collective for a DTensor), on the CPU."""
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    return t.detach().cpu()


def distribute_like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """This rank's shard of `full`, placed as the DTensor `like` is (or `full` itself)."""
    if hasattr(like, "device_mesh"):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(full.to(like.device), like.device_mesh, like.placements).to_local()
    return full.to(like.device)
