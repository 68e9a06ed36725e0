"""In-place ES: the seeded noise ε, each perturbed tensor's fp32 master and how it is written, and the
population whose members' weights are written into the model one after another (InPlacePopulation).

Exact restore and lossless updates. Adding σ·ε and subtracting it again is not exact in floating
point (in bf16 it changes ~7% of the elements per cycle). So the weights that matter live in an fp32
*master* copy of each perturbed tensor. The model's tensor is only ever *written* from the master:
clean = cast(master), perturbed = cast(master + σ·ε). Writing clean weights is therefore bit-exact
however many cycles ran, and the update is accumulated and applied to the fp32 master, so steps below
the bf16 spacing are not lost.
Memory: 4 bytes per perturbed parameter for the master plus 4 for θ0 (for the drift log, on the host).
Lowrank ES never writes perturbed values into the model, so there a float32 param is its own master.
The masters are host memory on a CPU; on CUDA (--master-device) they stay on the device when they fit,
so writing a member copies nothing, else they are pinned host memory, copied asynchronously.

8-bit models (bitsandbytes LLM.int8): a Linear8bitLt holds int8 weights W8 and one fp32 scale s per
row (W ≈ W8·s/127, s = the row's largest |weight|). Its master is the dequantized fp32 weight; perturbed
and clean weights are written by re-quantizing: W8 = clamp(round(x·127/s), −127, 127). The update reaches
the int8 weights the same way, while the fp32 master keeps the sub-step part. Noise smaller than half an
int8 step (s/254) rounds away, so σ must be comparable to the weights' int8 spacing. Two edge effects:
- A perturbed weight beyond its row's largest |weight| clamps at ±127 (its noise is cut short). The
  scales stay fixed while scoring, so restoring stays exact; the log's `int8_clamped` is the fraction of
  int8 elements clamped per member (a fraction of a percent at the σ that works).
- An *update* that moves a master row past its scale would be clamped for good, and the model would
  silently drift from its master. So writing the clean weights rescales such a row: its scale becomes the
  row's largest |master| and the row is re-quantized. The model always equals quantize(master), within
  half an int8 step per element, and the drift the log reports is the model's.
Embeddings and norms are float tensors and are perturbed like any float weight.
"""
from concurrent.futures import ThreadPoolExecutor

import torch

from minies.runtime.guard import check_finite
from minies.models import int8_row_scales

NOISE_CACHE_BYTES = 2**30  # host memory a step's noise may take when StepNoise keeps it


def noise(seed, index, shape, device):
    """ε for one tensor: an independent stream per (member seed, tensor index), identical on every rank."""
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + index) % 2**63)
    return torch.randn(shape, generator=g, device=device, dtype=torch.float32)


class StepNoise:
    """In-place ES's ε of each member seed and tensor in a step: regenerated from the seed at each use, or
    kept. On a CPU drawing ε costs more than everything else a write does (docs/speed.md), so when the
    whole step's noise fits in NOISE_CACHE_BYTES of host memory each ε is drawn once per step instead of
    three times (a mirrored pair's two writes and the update), on as many threads as torch uses, in the
    background while the member before is scored. Each tensor has its own generator, so the values, and
    every result, are the same either way. Never kept on an accelerator, where drawing is cheap and memory
    is not."""

    def __init__(self, tensors, seeds, device):
        """`seeds`: the distinct member seeds per step (N/2 with mirrored pairs)."""
        self.tensors = tensors
        noise_bytes = 4 * seeds * sum(t.param.numel() for t in tensors)
        self.cached = device.type == "cpu" and noise_bytes <= NOISE_CACHE_BYTES
        self.kept = {}  # member seed -> {tensor index: future ε}
        self.pool = ThreadPoolExecutor(torch.get_num_threads()) if self.cached else None

    def __call__(self, seed, t):
        """ε of the member seed for tensor t."""
        if not self.cached:
            return noise(seed, t.index, t.param.shape, t.param.device)
        return self.prefetch(seed)[t.index].result()

    def prefetch(self, seed):
        """When kept: start drawing the seed's ε in the background, once per step; {tensor index: future ε}."""
        if self.cached and seed not in self.kept:
            self.kept[seed] = {t.index: self.pool.submit(noise, seed, t.index, t.param.shape, t.param.device)
                               for t in self.tensors}
        return self.kept.get(seed)

    def clear(self):
        self.kept.clear()


class PerturbedTensor:
    """One parameter the ES perturbs: its fp32 master (on `device`) and how to write values into it."""

    def __init__(self, index, name, param, module, device=torch.device("cpu")):
        self.index, self.name, self.param, self.module = index, name, param, module
        self.int8 = param.dtype == torch.int8
        self.master = self.dequantized().detach().float().to(device, copy=True)
        if device.type == "cpu" and param.device.type == "cuda":
            self.master = self.master.pin_memory()  # so that each member's copy to the device is asynchronous
        self.clamped = 0  # int8 elements clamped to ±127 by perturbed writes, summed until the reader resets it

    def dequantized(self):
        return self.param.float() * int8_row_scales(self.module) / 127 if self.int8 else self.param

    @torch.no_grad()
    def write(self, values, rescale=False):
        """Make the model's tensor the cast of the fp32 `values` (which are on the param's device).
        int8: W8 = round(values·127/s) with the layer's row scales s. With `rescale`, a row whose largest
        |value| exceeds its scale first gets that value as its new scale (written into the layer), so the
        row is re-quantized instead of clamped; otherwise clamped elements are counted in `clamped`."""
        if self.int8:
            scales = int8_row_scales(self.module)  # a view of the layer's own scales
            if rescale:
                torch.maximum(scales, values.abs().amax(1, keepdim=True), out=scales)
            values = torch.round(values * 127 / scales.clamp(min=torch.finfo(torch.float32).tiny))
            self.clamped += int(values.abs().gt(127).sum())
            values.clamp_(-127, 127)
        self.param.copy_(values)  # cast as it is copied: no temporary the size of the tensor

    def share_param(self):
        """Make a float32 param on the master's device its own master: no copy to keep, nothing to rewrite
        after an update. Only for lowrank ES, which never writes perturbed values into the model."""
        if self.param.dtype == torch.float32 and self.param.device == self.master.device:
            self.master = self.param.detach()

    def write_clean(self):
        """Write the master itself. For int8 rows that an update moved past their scale, rescale (above):
        the model then always equals quantize(master), within half an int8 step per element."""
        if self.master.data_ptr() != self.param.data_ptr():  # else the param is the master (share_param)
            self.write(self.on_device(), rescale=True)

    @torch.no_grad()
    def write_perturbed(self, seed, sign, sigma, eps=None):
        """Write θ + sign·σ·ε. A given `eps` is left unchanged (StepNoise hands it out again); else ε is
        regenerated from `seed` and turned into σ·ε in place, so that writing the largest tensor holds one
        fp32 tensor fewer (docs/real-models.md counts them)."""
        drawn = eps is None
        eps = noise(seed, self.index, self.param.shape, self.param.device) if drawn else eps
        if self.param.dtype == torch.float32:  # computed in the param itself: the same values, two passes fewer
            torch.mul(eps, sign * sigma, out=self.param).add_(self.on_device())
        else:
            scaled = eps.mul_(sign * sigma) if drawn else torch.mul(eps, sign * sigma)
            self.write(scaled.add_(self.on_device()))

    def on_device(self):
        """The master on the param's device: itself when it lives there, else an asynchronous copy."""
        return self.master.to(self.param.device, non_blocking=True)


class InPlacePopulation:
    """In-place ES's population: each member scored with θ + σ·ε_n written into the model, one member at a
    time; the update Σ c·ε regenerated from the seeds (StepNoise keeps them when that pays). Shares its
    interface with eggroll.LowRankPopulation: score_members, add_update, end_step."""

    def __init__(self, tensors, seeds, device):
        """`tensors`: the PerturbedTensors; `seeds`: the distinct member seeds per step; `device`: the model's."""
        self.tensors = tensors
        self.noise = StepNoise(tensors, seeds, device)

    def score_members(self, members, sigma, rollout, prompts, micro_batch):
        """Yield (n, rollout(1, micro_batch)[0]) for each (n, (seed, sign)) of `members`, in turn, with
        θ + sign·σ·ε_seed written into the model; the clean weights are written back after the last. A member
        generates alone (its weights are the model's), its `prompts` rows in calls of `micro_batch` rows."""
        for i, (n, (seed, sign)) in enumerate(members):
            for t in self.tensors:  # ε from the step's cache when it keeps them, else drawn by write_perturbed
                t.write_perturbed(seed, sign, sigma, eps=self.noise(seed, t) if self.noise.cached else None)
            if i + 1 < len(members):
                self.noise.prefetch(members[i + 1][1][0])  # the next member's ε, while this one is scored
            yield n, rollout(1, micro_batch)[0]
        for t in self.tensors:
            t.write_clean()

    def add_update(self, t, terms, scale):
        """t.master += scale·Σ c·ε_seed over the (seed, c) terms, regenerating each ε from its seed (or
        taking it from the step's cache). Returns the update's squared norm."""
        direction = torch.zeros(t.param.shape, dtype=torch.float32, device=t.param.device)
        for seed, c in terms:
            direction.add_(self.noise(seed, t), alpha=c)
        delta = check_finite(f"the update of {t.name}", scale * direction.to(t.master.device))  # before the master
        t.master += delta
        return float(delta.pow(2).sum())

    def end_step(self):
        """Forget the step's noise: the next step's members have other seeds."""
        self.noise.clear()
