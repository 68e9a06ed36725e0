"""Where ES does its work: which mode scores the population (choose_mode) and where the fp32 master
weights live (master_device). Pure rules, resolved once in ES.__init__ and recorded in config.json."""
import torch

from minies import UserError


def choose_mode(prompts, population, micro_batch, device):
    """`lowrank` or `inplace` for a step of `prompts` rows per member, `population` members on this
    process and `micro_batch` rows per generate call: lowrank, except on CUDA when a generate call holds
    a single member.

    From bench.es on the shipped model (docs/speed.md, "Choosing the mode"; 2-core CPU, N=32 unless
    noted), lowrank ÷ in-place members/s with k members per generate call: P=16: 4.5x (k=32); P=256:
    1.13x with two threads, 1.00x with one (k=4), 1.04x (N=8, k=1); a Qwen2.5-0.5B-shaped model at P=8:
    4.7x (k=4). Lowrank's forward hooks add a few per cent to a forward pass; in place pays for writing
    every perturbed weight for every member and generates one member's rows per call.
    On CUDA nothing is measured yet. Writing the weights there runs near memory bandwidth, so lowrank has
    nothing to gain with one member per call, hence the exception."""
    members_per_call = min(micro_batch // prompts, population)
    return "inplace" if device.type == "cuda" and members_per_call < 2 else "lowrank"


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

