"""LoRA (Hu et al. 2021) in plain PyTorch: train a low-rank correction beside a frozen linear layer.

    y = W x + (alpha / r) · B A x        A: [r, in] random, B: [out, r] zero, so training starts at W

W may be an ordinary float weight or a bitsandbytes LLM.int8 weight (int8 with one scale per row):
the adapters stay in float32 either way, which is how a model too big to train in float is trained.
Switching the adapters off gives back the base model exactly, so the base serves as the reference
policy without a second copy. For saving, `merged_model` folds B A into dequantized weights and
returns an ordinary float model that any `from_pretrained` can load.
"""
import contextlib
import copy
import math

import torch
from torch import nn

from minies import UserError
from minies.models import int8_row_scales


def is_int8(linear):
    return linear.weight.dtype == torch.int8


def dequantized_weight(linear):
    """The float weight of a linear layer; an int8 row is scaled back by its absmax/127."""
    if not is_int8(linear):
        return linear.weight.detach()
    return linear.weight.detach().float() * int8_row_scales(linear) / 127


class LoRALinear(nn.Module):
    def __init__(self, base, rank, alpha):
        super().__init__()
        self.base = base
        self.scale = alpha / rank
        self.enabled = True
        device = base.weight.device
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, device=device))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, device=device))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # nn.Linear's init, as in the paper's code

    def forward(self, x):
        out = self.base(x)
        if not self.enabled:
            return out
        return out + (x.to(self.lora_A.dtype) @ self.lora_A.T @ self.lora_B.T * self.scale).to(out.dtype)

    def merged_weight(self):
        return dequantized_weight(self.base).float() + self.scale * (self.lora_B @ self.lora_A).detach()


def add_adapters(model, rank, alpha, targets):
    """Freeze `model` and wrap each linear layer whose own name is in `targets` (e.g. "q_proj") in a
    LoRALinear, in place. Afterwards the adapters are the model's only trainable parameters."""
    model.requires_grad_(False)
    found = [(name, module) for name, module in model.named_modules()
             if name.rpartition(".")[2] in targets and isinstance(module, nn.Linear)]
    if not found:
        raise UserError(f"--lora-targets {','.join(targets)}: no linear layer of the model has one of these names")
    for name, module in found:
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, LoRALinear(module, rank, alpha))


def has_adapters(model):
    return any(isinstance(m, LoRALinear) for m in model.modules())


@contextlib.contextmanager
def adapters_disabled(model):
    """Inside this block the model computes exactly what the base model computes."""
    adapters = [m for m in model.modules() if isinstance(m, LoRALinear)]
    for m in adapters:
        m.enabled = False
    try:
        yield model
    finally:
        for m in adapters:
            m.enabled = True


@torch.no_grad()
def merged_model(model):
    """An ordinary float copy of `model` (on the CPU) with every adapter folded into its weight and
    int8 weights dequantized: `save_pretrained` on it writes a model that loads without LoRA or
    bitsandbytes. The dtype is that of the embeddings (the load dtype)."""
    config = copy.deepcopy(model.config)
    config.__dict__.pop("quantization_config", None)
    merged = type(model)(config).to(model.get_input_embeddings().weight.dtype)
    merged.generation_config = copy.deepcopy(model.generation_config)
    state = {}
    # Walk the plain model's names ("...q_proj.weight") and look each one up in the wrapped model.
    for key in merged.state_dict():
        path, _, leaf = key.rpartition(".")
        module = model.get_submodule(path)
        if isinstance(module, LoRALinear):
            state[key] = module.merged_weight() if leaf == "weight" else getattr(module.base, leaf)
        elif leaf == "weight" and isinstance(module, nn.Linear):
            state[key] = dequantized_weight(module)
        else:
            state[key] = getattr(module, leaf)
    merged.load_state_dict(state)
    return merged.eval()
