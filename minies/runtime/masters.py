"""fp32 master weights for an optimizer of half-precision parameters.

A bfloat16 weight keeps 8 significant bits: its spacing is 2^-8 to 2^-7 times |w|, and an update smaller
than half of it rounds away. An AdamW step moves each weight by about lr: at lr 1e-6 that is below half a
spacing for every |w| > 5.1e-4 (2^9·lr), nearly every weight, so AdamW run on the weights themselves
loses nearly every step (5 GRPO steps at lr 1e-6 move 1.5% of the shipped model's weights in bfloat16).

So MasterWeights keeps an fp32 copy (the master) of each half-precision parameter, on its device. The
optimizer, and so its state, acts on the masters; after each step the model's parameter is written as
its master's rounding. Steps add up in the master until they cross a rounding boundary of the model's
dtype, and the model only ever holds cast(master).

A float32 parameter is its own master: no copy, the optimizer steps it in place, and float32 training is
bit for bit what the optimizer alone computes. LoRA adapters are float32 whatever the base's dtype
(minies/lora.py), so they are their own masters too.

IVON (minies/ivon.py) keeps the masters of its low-precision parameters in its own state; ES keeps its
masters in minies/perturbed.py.
"""
import torch


class MasterWeights:
    """The optimizer that `build(masters)` makes (AdamW, ...), stepping the fp32 masters of `params`."""

    def __init__(self, params, build):
        self.params = list(params)
        self.masters = [p if torch.finfo(p.dtype).bits >= 32 else p.detach().float() for p in self.params]
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
