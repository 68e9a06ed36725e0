"""fp32 master weights for an optimizer of half-precision parameters.

A bfloat16 weight keeps 8 significant bits: its spacing is 2^-8 to 2^-7 times |w|, and an update smaller
than half of it rounds away. An AdamW step moves each weight by about lr: at lr 1e-6 that is below half a
spacing for every |w| > 5.1e-4 (2^9·lr), nearly every weight, so AdamW run on the weights themselves
loses nearly every step (5 GRPO steps at lr 1e-6 move 1.5% of the shipped model's weights in bfloat16).

So the optimizer steps an fp32 copy (the master, fp32_master) of each half-precision parameter, on the
parameter's device, and after each step the parameter is written as its master's rounding. Steps add up in
the master until they cross a rounding boundary of the model's dtype, and the model only ever holds
cast(master). A float32 parameter is its own master: no copy, the optimizer steps it in place, and float32
training is bit for bit what the optimizer alone computes. LoRA adapters are float32 whatever the base's
dtype (minies/lora.py), so they are their own masters too.

Two optimizers use this: MasterWeights wraps a torch optimizer (GRPO's AdamW) around the masters, and IVON
(minies/ivon.py) keeps each master in its per-parameter state, as the posterior mean θ it samples around and
steps; both make them with fp32_master.

In-place ES keeps masters of its own (minies/perturbed.py, PerturbedTensor.master), for reasons these do not
share: it writes perturbed weights cast(master + σ·ε) into the model as well as clean ones, so a float32
weight cannot be its own master either: every weight has a copy, from which a clean write restores bit for
bit; an 8-bit weight's master is its dequantized fp32 value, re-quantized on each write; and
--master-device places the masters (the GPU, or pinned host memory) rather than beside their parameters.
"""
import torch


def fp32_master(param):
    """The fp32 tensor an optimizer steps for `param`: a copy of a half-precision param (its master), or a
    float32 param itself."""
    return param if torch.finfo(param.dtype).bits >= 32 else param.detach().float()


class MasterWeights:
    """The optimizer that `build(masters)` makes (AdamW, ...), stepping the fp32 masters of `params`."""

    def __init__(self, params, build):
        self.params = list(params)
        self.masters = [fp32_master(p) for p in self.params]
        self.optimizer = build(self.masters)

    @property
    def param_groups(self):
        """The optimizer's parameter groups, which hold the masters (for a learning-rate schedule)."""
        return self.optimizer.param_groups

    def half_precision(self):
        """(parameter, its fp32 master) for each parameter that is not its own master."""
        return [(p, master) for p, master in zip(self.params, self.masters) if master is not p]

    @torch.no_grad()
    def step(self):
        """One optimizer step on the masters with the parameters' gradients (p.grad), then each parameter
        written as its master's rounding. A half-precision gradient is moved into its master's fp32 one,
        one tensor at a time, so that the two forms of all gradients are never held at once."""
        for p, master in self.half_precision():
            master.grad = None if p.grad is None else p.grad.float()
            p.grad = None
        self.optimizer.step()
        for p, master in self.half_precision():
            master.grad = None
            p.copy_(master)

    def state_dict(self):
        """The optimizer's state and the half-precision parameters' masters, which their roundings in the
        model cannot give back."""
        return {"optimizer": self.optimizer.state_dict(), "masters": [master for _, master in self.half_precision()]}

    @torch.no_grad()
    def load_state_dict(self, state):
        self.optimizer.load_state_dict(state["optimizer"])
        for (p, master), saved in zip(self.half_precision(), state["masters"], strict=True):
            master.copy_(saved)
            p.copy_(master)
