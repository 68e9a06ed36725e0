"""The bookkeeping of GRPO's pass over a batch (GRPO.policy_gradient), kept out of its procedure: the whole
batch's normalizers, its micro-batches, what stays fixed over its μ passes (π_old's and the reference policy's
log-probs), and the pass's log."""
import torch

from minies.runtime import distributed


def batch_counts(mask, max_new_tokens):
    """grpo_loss's normalizers of the whole batch, over all ranks, from this rank's completion mask: so
    that the micro-batches' and the ranks' gradients add up to the batch's."""
    counts = distributed.all_reduce_sum(torch.tensor([len(mask), mask.sum().item()], dtype=torch.float64))
    return dict(num_sequences=counts[0].item(), num_tokens=counts[1].item(), max_len=max_new_tokens)


def micro_batches(rows, size):
    """Slices of `rows` rows, `size` at a time."""
    return [slice(start, start + size) for start in range(0, rows, size)]


class OldLogps:
    """What stays fixed over the μ passes on one batch, per micro-batch: π_old's log-probs and the reference
    policy's (None each when β = 0)."""

    def __init__(self):
        self.policy, self.reference = [], []

    def policy_logps(self, i, logps):
        """π_old's log-probs of micro-batch i. π_old is the policy before the batch's first step, so the first
        pass's are its own `logps`, detached: its ratio is 1 and its gradient the policy gradient."""
        if i == len(self.policy):
            self.policy.append(logps.detach())
        return self.policy[i]


class PassLog:
    """The log of one pass over a batch: sums over this rank's tokens, added micro-batch by micro-batch, then
    summed over ranks."""

    def __init__(self, with_kl, with_entropy):
        self.with_kl, self.with_entropy = with_kl, with_entropy
        self.sums = torch.zeros(5, dtype=torch.float64)  # the loss; clip_low, clip_high, kl, entropy × tokens

    @property
    def loss(self):
        """This rank's summed loss over the micro-batches passed."""
        return self.sums[0]

    def add(self, loss, stats, mask, entropy):
        """A micro-batch's loss, its grpo_loss stats (means over its tokens, `mask`) and its entropies (or None)."""
        tokens = mask.sum().item()
        entropy_sum = (entropy * mask).sum().item() if entropy is not None else 0.0
        self.sums += torch.tensor([loss.item(), stats["clip_low"] * tokens, stats["clip_high"] * tokens,
                                   stats.get("kl", 0.0) * tokens, entropy_sum], dtype=torch.float64)

    def over_ranks(self, num_tokens, grad_norm):
        """The pass's log: the loss, and the other statistics as means over the whole batch's `num_tokens`."""
        loss, clip_low, clip_high, kl, entropy = distributed.all_reduce_sum(self.sums).tolist()
        log = {"loss": loss, "clip_low": clip_low / num_tokens, "clip_high": clip_high / num_tokens,
               "grad_norm": grad_norm}
        if self.with_kl:
            log["kl"] = kl / num_tokens
        if self.with_entropy:
            log["entropy"] = entropy / num_tokens
        return log
