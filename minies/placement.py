"""Where ES does its work: which mode scores the population (choose_mode) and where the fp32 master
weights live (master_device). Pure rules, resolved once in ES.__init__ and recorded in config.json."""
import torch

from minies import UserError


def choose_mode(prompts, population, micro_batch, device):
    """`lowrank` or `inplace` for a step of `prompts` rows per member, `population` members on this
    process and `micro_batch` rows per generate call: lowrank when one member's rows are too few to
    keep the device busy (prompts <= 128); on CUDA also only when a call holds two members or more.

    From bench.es on the shipped model (docs/speed.md, "Choosing the mode"; 2-core CPU, one thread, N=32
    unless noted), lowrank ÷ in-place members/s with k members per generate call: P=16: 2.33x (k=32),
    1.18x (k=1); P=64: 1.09x (k=16); P=128: 1.06x (k=8); P=256: 0.72x (k=4), 0.96x (N=8, k=1).
    With few rows per member, in-place ES pays for writing 1M weights per member (30% of the scoring at
    P=16) and generates small batches; from P=256 rows on, one member's batch keeps the thread busy and
    lowrank's forward hooks cost more than the writing they save.
    On CUDA nothing is measured yet. Writing the weights there runs near memory bandwidth, so lowrank has
    nothing to gain with one member per call, hence the second condition; at the default step (P=256)
    both devices pick inplace."""
    members_per_call = min(micro_batch // prompts, population)
    if device.type == "cuda" and members_per_call < 2:
        return "inplace"
    return "lowrank" if prompts <= 128 else "inplace"


def master_device(choice, device, perturbed, free_bytes=None):
    """Where the fp32 masters of `perturbed` weights of a model on `device` live. Off CUDA: the host.
    `auto` on CUDA: the device when 4·perturbed bytes are under a quarter of its free memory (free_bytes,
    from torch.cuda.mem_get_info), which leaves the rest to generation's activations and KV cache."""
    if device.type != "cuda":
        if choice == "cuda":
            raise UserError(f"--master-device cuda: the model is on {device.type}, not on CUDA")
        return torch.device("cpu")
    if choice == "auto":
        free_bytes = torch.cuda.mem_get_info(device)[0] if free_bytes is None else free_bytes
        choice = "cuda" if 4 * perturbed < free_bytes / 4 else "cpu"
    return device if choice == "cuda" else torch.device("cpu")

