"""Divergence guard: stop a run at the first step whose weights went non-finite or grew far beyond the start
model's, before that step is logged or saved, so that every checkpoint on disk stays a good one.

A diverging run does not always reach inf or NaN: a learning rate a million times too large moves the weights
to millions, rewards fall to 0, and every number stays finite. No sane run grows its largest weight many times
over, so the guard also stops at weights beyond `growth` times the start model's largest magnitude
(train.py's --max-weight-growth)."""
import torch

from minies import UserError


class Diverged(UserError):
    """The training diverged. A UserError: the user fixes it with a smaller step or a wider dtype."""

    def __init__(self, what, step=None, why="is not finite"):
        self.what, self.step, self.why = what, step, why
        at = f"step {step}: " if step is not None else ""
        super().__init__(f"{at}{what} {why}: the training diverged; lower --lr/--alpha or a flag that scales the "
                         "loss or the step (--beta, --ess, --sigma), or with --dtype float16 use bfloat16")


def check_finite(what, value):
    """`value` (a float or a tensor) if it is finite everywhere; else raise Diverged."""
    if not torch.isfinite(torch.as_tensor(value)).all():
        raise Diverged(what)
    return value


def largest_weight(model):
    """The largest magnitude of any floating-point weight of `model` (inf or nan when one is): one pass, one
    host sync."""
    peaks = [p.detach().abs().amax().float() for p in model.parameters() if p.is_floating_point() and p.numel()]
    return float(torch.stack([peak.to(peaks[0].device) for peak in peaks]).max()) if peaks else 0.0


def check_weights(model, bound=float("inf")):
    """Raise Diverged unless every floating-point weight of `model` is finite and at most `bound` in magnitude."""
    peak = largest_weight(model)
    if not peak == peak or peak == float("inf"):  # nan or inf
        raise Diverged("a weight of the model")
    if peak > bound:
        raise Diverged("a weight of the model", why=f"grew to {peak:.3g}, past --max-weight-growth times the start "
                                                    f"model's largest ({bound:.3g})")
