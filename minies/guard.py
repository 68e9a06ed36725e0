"""Divergence guard: stop a run at the first non-finite loss, gradient, update or weight, before it is
applied, logged or saved, so that the last checkpoint (`latest`) stays a good one."""
import torch

from minies import UserError


class Diverged(UserError):
    """A non-finite number in training. A UserError: the user fixes it with a smaller step or a wider dtype."""

    def __init__(self, what, step=None):
        self.what, self.step = what, step
        at = f"step {step}: " if step is not None else ""
        super().__init__(f"{at}{what} is not finite: the training diverged; "
                         "lower --lr/--alpha, or use bfloat16 instead of float16")


def check_finite(what, value):
    """`value` (a float or a tensor) if it is finite everywhere; else raise Diverged."""
    if not torch.isfinite(torch.as_tensor(value)).all():
        raise Diverged(what)
    return value


def check_finite_weights(model):
    """Raise Diverged unless every floating-point weight of `model` is finite: one pass, one host sync."""
    flags = [torch.isfinite(p).all() for p in model.parameters() if p.is_floating_point()]
    if flags and not torch.stack([f.to(flags[0].device) for f in flags]).all():
        raise Diverged("a weight of the model")
