"""EGGROLL (Sarkar et al. 2025): the whole ES population in one batched forward, with low-rank noise.

Member n perturbs each selected weight matrix W [out, in] by σ·E_n, with

    E_n = A_n·B_nᵀ/√r,     A_n [out, r], B_n [in, r] ~ N(0, 1), regenerated from (seed_n, tensor index)

E_n has unit-variance entries like the full-rank ε of in-place ES, so σ means the same in both modes.
E_n is never formed. A forward hook on the layer adds σ·A_n(B_nᵀx)/√r to the layer's output W·x for
the batch rows that belong to member n, so k members generate together as one batch of k·P rows (rows
member-major: rows j·P … (j+1)·P−1 are member j). The weights are never modified while scoring, which
also makes the mode work unchanged on 8-bit layers (the hook only adds to their output). Extra cost per
layer and token: 2·r·(in + out) multiply-adds against the layer's in·out, under 2% at r = 1.

The update is the same seeded sum as in-place ES, one matmul per matrix:

    θ ← θ + α·(1/N)·Σ_n z_n·E_n = θ + α/(N·√r) · [A_1 … A_N] · diag(z) · [B_1 … B_N]ᵀ

accumulated in fp32 and applied to the same fp32 master copies as in-place ES (minies/es.py).

Only weight matrices of Linear layers are perturbed in this mode: embeddings, norms and biases stay
fixed. A Linear whose weight is tied to the input embedding (a tied LM head) is skipped as well, since
the hook would perturb only one of the weight's two uses while the update would change both.
"""
import contextlib
import math

import torch


class LowRankPopulation:
    def __init__(self, model, tensors, rank, noise):
        """`tensors`: the ES's PerturbedTensors; `noise(seed, index, shape, device)`: its seeded N(0, 1) stream."""
        self.rank, self.noise = rank, noise
        embedding = model.get_input_embeddings().weight
        self.tensors = [t for t in tensors if isinstance(t.module, torch.nn.Linear)
                        and t.param is t.module.weight and t.param is not embedding]
        self.active = {}  # module -> (σ·sign/√r · A stacked [k, out, r], B stacked [k, in, r]) while scoring
        for t in self.tensors:
            t.module.register_forward_hook(self.hook)

    def factors(self, seed, t):
        """A_n [out, r] and B_n [in, r] of one member for one tensor, in fp32 on the tensor's device."""
        rows, cols = t.param.shape
        ab = self.noise(seed, t.index, (rows + cols, self.rank), t.param.device)
        return ab[:rows], ab[rows:]

    @contextlib.contextmanager
    def members(self, members, sigma):
        """Inside the block, a forward over k·P rows runs row block j at θ + σ·sign_j·E_j, j < k = len(members)."""
        for t in self.tensors:
            a, b = zip(*(self.factors(seed, t) for seed, _ in members))
            scale = torch.tensor([sign * sigma / math.sqrt(self.rank) for _, sign in members], device=t.param.device)
            # A as [k, r, out] with σ·sign/√r folded in; every member's B side by side as [in, k·r].
            self.active[t.module] = (torch.stack(a).transpose(1, 2) * scale[:, None, None], torch.cat(b, 1))
        try:
            yield
        finally:
            self.active.clear()

    def hook(self, module, inputs, output):
        if module not in self.active:
            return None
        a, b = self.active[module]
        k, r = a.shape[0], a.shape[1]
        x = inputs[0]
        if x.shape[0] % k:
            raise RuntimeError(f"batch of {x.shape[0]} rows does not split into {k} member blocks")
        # One GEMM of every row against every member's B (k·r extra columns, cheap next to W's `out`),
        # then keep each row block's own member: [k, rows_per_member·tokens, r]. A per-member bmm with
        # an inner size of r is far slower on CPU than this and the broadcast products below.
        s = (x.reshape(-1, x.shape[-1]).to(b.dtype) @ b).view(k, -1, k, r).diagonal(dim1=0, dim2=2).permute(2, 0, 1)
        out = output.view(k, -1, output.shape[-1])  # a fresh tensor: adding in place saves a copy
        for j in range(r):  # += σ·sign·A(Bᵀx)/√r, one broadcast multiply-add per rank
            out.addcmul_(s[:, :, j, None].to(out.dtype), a[:, None, j, :].to(out.dtype))
        return output

    def direction(self, t, terms):
        """Σ c·E_seed over the (seed, c) terms for one tensor, in fp32, as one [out, T·r] × [T·r, in] matmul."""
        a, b = zip(*(self.factors(seed, t) for seed, _ in terms))
        c = torch.tensor([c for _, c in terms], device=t.param.device).repeat_interleave(self.rank)
        return (torch.cat(a, 1) * c) @ torch.cat(b, 1).T / math.sqrt(self.rank)
