"""torch.distributed helpers. Without torchrun everything degrades to a single process (rank 0 of 1)."""
import os

import torch
import torch.distributed as dist


def init():
    """Join the process group when launched by torchrun (gloo on CPU, nccl on CUDA); else do nothing."""
    if "RANK" in os.environ and not dist.is_initialized():
        missing = [name for name in ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
        if missing:
            from minies import UserError

            raise UserError(f"RANK is set but {', '.join(missing)} not: launch several processes with torchrun, or "
                            "unset RANK for one")
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend)


def close():
    if dist.is_initialized():
        dist.destroy_process_group()


def rank():
    return dist.get_rank() if dist.is_initialized() else 0


def world_size():
    return dist.get_world_size() if dist.is_initialized() else 1


def is_main():
    return rank() == 0


def all_reduce_sum(tensor):
    """Sum a tensor over ranks in place (a no-op on one process) and return it. NCCL reduces device
    tensors only, so there a host tensor (rewards, counts) goes through the device and back."""
    if not dist.is_initialized():
        return tensor
    if dist.get_backend() == "nccl" and tensor.device.type != "cuda":
        on_device = tensor.cuda()
        dist.all_reduce(on_device, op=dist.ReduceOp.SUM)
        return tensor.copy_(on_device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_gather_objects(obj):
    """The list of every rank's `obj` (picklable), in rank order; [obj] on one process."""
    if not dist.is_initialized():
        return [obj]
    gathered = [None] * world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def barrier():
    if dist.is_initialized():
        dist.barrier()


def shard(items):
    """This rank's share of a list: items r, r+P, r+2P, ... (static, so runs are reproducible)."""
    return items[rank()::world_size()]
