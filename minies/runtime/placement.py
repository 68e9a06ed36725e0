"""Where ES does its work: which mode scores the population (choose_mode) and where the fp32 master
weights live (master_device). Rules resolved once as ES is built (minies/es.py: perturbed_tensors,
resolve_mode), alike on every rank, and recorded in config.json."""
import torch

from minies import UserError
from minies.runtime import distributed


def choose_mode(prompts, population, micro_batch):
    """`lowrank` or `inplace` for a step of `prompts` rows per member, `population` members on this
    process and `micro_batch` rows per generate call: lowrank when a generate call holds two members or
    more, else in place. Lowrank batches members, while in place writes every perturbed weight for every
    member; with one member per call lowrank has nothing to batch, and its forward hooks and per-call
    factor set-up cost more than those writes. The measurements behind the rule: docs/speed.md, "Choosing
    the mode"."""
    return "lowrank" if min(micro_batch // prompts, population) >= 2 else "inplace"


def master_device(choice, device, perturbed, free_bytes=None):
    """Where the fp32 masters of `perturbed` weights of a model on `device` live. Off CUDA: the host.
    `auto` on CUDA: the device when 4·perturbed bytes are under a quarter of its free memory (free_bytes,
    from torch.cuda.mem_get_info), which leaves the rest to generation's activations and KV cache. Under
    torchrun the free memory is the smallest of any rank's, so that every rank keeps its masters in the same
    place: lowrank's update (a matmul) rounds differently on the host and on a GPU, and the replicas must
    stay identical."""
    if device.type != "cuda":
        if choice == "cuda":
            raise UserError(f"--master-device cuda: the model is on {device.type}, not on CUDA")
        return torch.device("cpu")
    if choice == "auto":
        if free_bytes is None:
            free_bytes = min(distributed.all_gather_objects(torch.cuda.mem_get_info(device)[0]))
        choice = "cuda" if 4 * perturbed < free_bytes / 4 else "cpu"
    return device if choice == "cuda" else torch.device("cpu")

