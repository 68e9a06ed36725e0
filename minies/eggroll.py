"""EGGROLL (Sarkar et al. 2025): the whole ES population in one batched forward, with low-rank noise.

Member n perturbs each selected weight matrix W [out, in] by σ·E_n, with

    E_n = A_n·B_nᵀ/√r,     A_n [out, r], B_n [in, r] ~ N(0, 1), regenerated from (seed_n, tensor index)

E_n has unit-variance entries like the full-rank ε of in-place ES, so σ means the same in both modes.
E_n is never formed. A forward hook on the layer adds σ·A_n(B_nᵀx)/√r to the layer's output W·x for
the batch rows that belong to member n, so k members generate together as one batch of k·P rows (rows
member-major: rows j·P … (j+1)·P−1 are member j). The weights are never modified while scoring, which
also makes the mode work unchanged on 8-bit layers (the hook only adds to their output). Extra cost per
layer and token: 2·r·(in + out) multiply-adds against the layer's in·out, under 2% at r = 1.

The update is the same seeded sum as in-place ES, one matmul per matrix added into the master:

    θ ← θ + α·(1/N)·Σ_n z_n·E_n = θ + α/(N·√r) · [A_1 … A_N] · diag(z) · [B_1 … B_N]ᵀ

accumulated in fp32 and applied to the same fp32 master copies as in-place ES (minies/perturbed.py); a
float32 weight is its own master here, as this mode never writes perturbed values into the model.

The input embedding E [vocab, hidden] is a matrix too: a lookup of token t returns row E[t], so its
hook adds σ·A_n[t]·B_nᵀ/√r to the looked-up rows. When the LM head is tied to it (logits = h·Eᵀ), the
head's Linear hook adds σ·(h·B_n)·A_nᵀ/√r with the *same* A_n, B_n: both uses of the one weight see
one perturbation, as they do in place. Norms and biases (vectors) stay fixed in this mode.
"""
import contextlib
import math

import torch

from minies.runtime.guard import check_finite
from minies.perturbed import noise


class LowRankPopulation:
    """Lowrank ES's population: k members scored together in one batch, their noise added by forward hooks
    (score_members); the update one matmul per matrix (add_update, in-place ES's PerturbedTensor.add_update
    for a matrix)."""

    def __init__(self, model, tensors, rank):
        """`tensors`: the ES's PerturbedTensors; this mode keeps the weight matrices among them."""
        self.rank = rank
        self.drawn = {}  # (seed, tensor index) -> this step's factors [out + in, r]
        embedding = model.get_input_embeddings()
        self.modules = matrix_modules(model, tensors)  # tensor index -> the modules whose forward uses it
        self.tensors = [t for t in tensors if t.index in self.modules]
        for t in self.tensors:
            t.share_param()  # a float32 weight is its own master: this mode never writes perturbed values
        # module -> (A stacked [k, r, out] with σ·sign/√r folded in, B stacked [k, r, in]); and the two in the
        # layer's output dtype (active_factors)
        self.active, self.cast = {}, {}
        for modules in self.modules.values():
            for module in modules:
                module.register_forward_hook(self.lookup_hook if module is embedding else self.hook)

    def factors(self, seeds, t):
        """[len(seeds), out + in, r]: each member seed's A_n [out, r] above its B_n [in, r] for one tensor, in
        fp32 on the tensor's device, from the same seeded stream as in-place ε (perturbed.noise). A seed's are
        kept in `drawn` until the step ends (end_step): scoring draws them and the update reuses them."""
        for seed in seeds:
            if (seed, t.index) not in self.drawn:
                self.drawn[(seed, t.index)] = noise(seed, t.index, (sum(t.param.shape), self.rank), t.param.device)
        return torch.stack([self.drawn[(seed, t.index)] for seed in seeds])

    @contextlib.contextmanager
    def perturbed(self, members, sigma):
        """Inside the block, a forward over k·P rows runs row block j at θ + σ·sign_j·E_j, j < k = len(members)."""
        seeds = list(dict.fromkeys(seed for seed, _ in members))  # a mirrored pair's factors are drawn once
        which = torch.tensor([seeds.index(seed) for seed, _ in members])
        scale = torch.tensor([sign * sigma / math.sqrt(self.rank) for _, sign in members])
        for t in self.tensors:
            dev, rows = t.param.device, t.param.shape[0]
            ab = self.factors(seeds, t)[which.to(dev)].transpose(1, 2)  # [k, r, out + in]
            factors = ab[:, :, :rows] * scale.to(dev)[:, None, None], ab[:, :, rows:].contiguous()
            for module in self.modules[t.index]:
                self.active[module] = factors
        try:
            yield
        finally:
            self.active.clear()
            self.cast.clear()

    def score_members(self, members, sigma, rollout, prompts, micro_batch):
        """Yield (n, its rollout) for each (n, (seed, sign)) of `members`: k = micro_batch // prompts members
        (at least one) per generate call, as rollout(k, k·prompts), rows member-major, each row block run at
        its member's θ + σ·sign·E; the weights themselves stay clean. (When sampling, a row's random draws
        depend on its place in the batch, so only greedy scoring gives every member exactly the same
        sampling noise.)"""
        per_call = max(1, micro_batch // prompts)
        for start in range(0, len(members), per_call):
            group = members[start:start + per_call]
            with self.perturbed([member for _, member in group], sigma):
                rollouts = rollout(len(group), len(group) * prompts)
            yield from zip([n for n, _ in group], rollouts)

    def active_factors(self, module, dtype):
        """The module's (A, B) in this block, and the two cast to the layer's output dtype: the hooks run once
        per token and layer, so the casts are made at the block's first token, not at every one."""
        if module not in self.cast:
            self.cast[module] = tuple(factor.to(dtype) for factor in self.active[module])
        return self.active[module], self.cast[module]

    def hook(self, module, inputs, output):
        """A Linear's: += σ·sign·A(Bᵀx)/√r for each row block's member."""
        if module not in self.active:
            return None
        (_, b), (a, _) = self.active_factors(module, output.dtype)  # B in fp32 for the product, A as the output
        x = inputs[0].reshape(a.shape[0], -1, inputs[0].shape[-1]).to(b.dtype)  # [k, rows_per_member·tokens, in]
        # Each row block against its own member's B only: a batched [n, in] × [in, r] product. B is passed
        # transposed ([k, r, in] viewed as [k, in, r]), the layout CPU GEMMs run fastest with a narrow r.
        return add_low_rank(output, torch.bmm(x, b.transpose(1, 2)), a)

    def lookup_hook(self, module, inputs, output):
        """The embedding's: row E[t] of each looked-up token t gets σ·sign·A[t]·Bᵀ/√r of its row's member."""
        if module not in self.active:
            return None
        _, (a, b) = self.active_factors(module, output.dtype)
        k, r = a.shape[0], a.shape[1]
        ids = inputs[0].reshape(k, 1, -1).expand(k, r, -1)  # [k, r, rows_per_member·tokens]
        picked = a.gather(2, ids).transpose(1, 2)  # A_j[t] for each of member j's tokens t: [k, n, r]
        return add_low_rank(output, picked, b)

    def add_update(self, t, terms, scale):
        """t.master += scale·Σ c·E_seed over the M (seed, c) terms, as one [out, M·r] × [M·r, in] matmul
        accumulated into the master (no [out, in] temporary). Returns the update's squared Frobenius norm,
        from the factors alone: ‖a·bᵀ‖² = Σ (aᵀa) ⊙ (bᵀb), two [M·r, M·r] Gram matrices."""
        seeds, c = zip(*terms)
        rows, r = t.param.shape[0], self.rank
        ab = self.factors(seeds, t).permute(1, 0, 2)  # [out + in, M, r]
        a, b = ab[:rows].reshape(rows, -1), ab[rows:].reshape(-1, len(seeds) * r)  # [out, M·r], [in, M·r]
        c = torch.tensor(c, device=t.param.device).repeat_interleave(r)
        a = check_finite(f"the update of {t.name}", a * (c * scale / math.sqrt(r)))
        a, b = a.to(t.master.device), b.to(t.master.device)
        t.master.addmm_(a, b.T)
        return float(((a.T @ a) * (b.T @ b)).sum())

    def end_step(self):
        """Forget the step's factors: the next step's members have other seeds."""
        self.drawn.clear()


def matrix_modules(model, tensors):
    """{tensor index: the modules whose forward uses it} for the tensors this mode perturbs: the weight
    matrices of Linear layers and of the input embedding (with the LM head when it is tied to it)."""
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    modules = {}
    for t in tensors:
        if t.param is embedding.weight:
            modules[t.index] = [embedding] + ([head] if head is not None and head.weight is t.param else [])
        elif isinstance(t.module, torch.nn.Linear) and t.param is t.module.weight:
            modules[t.index] = [t.module]
    return modules


def add_low_rank(output, coeffs, vectors):
    """output[row block j] += Σ_i coeffs[j, :, i] ⊗ vectors[j, i] in place, with k member blocks of rows:
    coeffs [k, n, r] per row (n: the block's rows × tokens), vectors [k, r, dim]; one broadcast
    multiply-add per rank. `output` is the layer's fresh result, so adding in place saves a copy."""
    k = coeffs.shape[0]
    if output.shape[0] % k:
        raise RuntimeError(f"batch of {output.shape[0]} rows does not split into {k} member blocks")
    out = output.view(k, -1, output.shape[-1])
    coeffs, vectors = coeffs.to(out.dtype), vectors.to(out.dtype)
    for i in range(coeffs.shape[2]):  # rank by rank: [k, n, 1] ⊗ [k, 1, dim]
        out.addcmul_(coeffs[:, :, i:i + 1], vectors[:, i:i + 1])
    return output
