"""In-place ES's perturbed tensors: the seeded noise ε, each tensor's fp32 master and how the model's tensor
is written from it (PerturbedTensor); and StepNoise, an optional speed layer that keeps a step's ε.

Exact restore and lossless updates. Adding σ·ε and subtracting it again is not exact in floating
point (in bf16 it changes ~7% of the elements per cycle). So the weights that matter live in an fp32
*master* copy of each perturbed tensor. The model's tensor is only ever *written* from the master:
clean = cast(master), perturbed = cast(master + σ·ε). Writing clean weights is therefore bit-exact
however many cycles ran, and the update is accumulated and applied to the fp32 master, so steps below
the bf16 spacing are not lost. What the masters take and where they live: docs/speed.md.

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
from torch.profiler import record_function

from minies.runtime.guard import check_finite
from minies.models import int8_row_scales

NOISE_CACHE_BYTES = 2**30  # host memory a step's noise may take when StepNoise keeps it


@record_function("es.noise")
def noise(seed, index, shape, device):
    """ε for one tensor: an independent stream per (member seed, tensor index), identical on every rank."""
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + index) % 2**63)
    return torch.randn(shape, generator=g, device=device, dtype=torch.float32)


class PerturbedTensor:
    """One parameter the ES perturbs: its fp32 master (on `device`) and how the model's tensor is written
    from it, perturbed or clean."""

    def __init__(self, index, name, param, module, device=torch.device("cpu")):
        self.index, self.name, self.param, self.module = index, name, param, module
        self.int8 = param.dtype == torch.int8
        # Not minies/runtime/masters.py's MasterWeights, which keeps an optimizer's fp32 copy of a half-precision
        # param on its device and writes the param back clean after each step. This master is always a copy, of a
        # float32 param too, since the param holds each member's perturbed values while the master stays clean;
        # it is dequantized from int8 weights; it lives where --master-device places it; and the param is
        # written from it perturbed as well as clean.
        self.device, self._master = device, None

    @property
    def master(self):
        """The fp32 master, copied at first use: lowrank ES makes a float32 param its own master (share_param)
        before any use, and a copy made and freed would stay in the process's heap (runtime/allocator.py)."""
        if self._master is None:
            self._master = self.dequantized().detach().float().to(self.device, copy=True)
            if self.device.type == "cpu" and self.param.device.type == "cuda":
                self._master = self._master.pin_memory()  # so that each member's copy to the device is asynchronous
        return self._master

    @master.setter
    def master(self, value):
        self._master = value

    def dequantized(self):
        return self.param.float() * int8_row_scales(self.module) / 127 if self.int8 else self.param

    def epsilon(self, seed, step_noise=None):
        """ε of the member seed for this tensor: from the step's StepNoise when one is given, else drawn."""
        return step_noise(seed, self) if step_noise else noise(seed, self.index, self.param.shape, self.param.device)

    @torch.no_grad()
    @record_function("es.write")
    def write_perturbed(self, seed, sign, sigma, step_noise=None):
        """Write master + sign·σ·ε_seed into the model (cast, or quantized: write). Returns the number of int8
        elements clamped to ±127."""
        eps = self.epsilon(seed, step_noise)
        # Where the sum is computed: an optimization, the same values every way. A float32 param holds it itself
        # (no cast to make: two memory passes fewer); else a freshly drawn ε is overwritten with it (one fp32
        # tensor fewer: docs/real-models.md counts them), while a kept ε, which StepNoise hands out again, is not.
        in_param = self.param.dtype == torch.float32
        out = self.param if in_param else eps if step_noise is None else None
        values = torch.mul(eps, sign * sigma, out=out).add_(self.on_device())  # master + sign·σ·ε
        return 0 if in_param else self.write(values)

    @record_function("es.write")
    def write_clean(self):
        """Write the master itself. For int8 rows that an update moved past their scale, rescale (write):
        the model then always equals quantize(master), within half an int8 step per element."""
        if self.master.data_ptr() != self.param.data_ptr():  # else the param is the master (share_param)
            self.write(self.on_device(), rescale=True)

    @torch.no_grad()
    def write(self, values, rescale=False):
        """Make the model's tensor the cast of the fp32 `values` (which are on the param's device). int8:
        W8 = round(values·127/s) with the layer's row scales s, clamped to ±127. With `rescale`, a row whose
        largest |value| exceeds its scale first gets that value as its new scale (written into the layer), so
        the row is re-quantized instead of clamped. Returns the number of int8 elements clamped."""
        if not self.int8:
            self.param.copy_(values)  # cast as it is copied: no temporary the size of the tensor
            return 0
        scales = int8_row_scales(self.module)  # a view of the layer's own scales
        if rescale:
            torch.maximum(scales, values.abs().amax(1, keepdim=True), out=scales)
        values = torch.round(values * 127 / scales.clamp(min=torch.finfo(torch.float32).tiny))
        clamped = int(values.abs().gt(127).sum())
        self.param.copy_(values.clamp_(-127, 127))
        return clamped

    def add_update(self, terms, scale, step_noise=None):
        """master += scale·Σ c·ε_seed over the (seed, c) terms, each ε regenerated from its seed (or taken from
        the step's StepNoise). Returns the update's squared norm."""
        direction = torch.zeros(self.param.shape, dtype=torch.float32, device=self.param.device)
        for seed, c in terms:
            direction.add_(self.epsilon(seed, step_noise), alpha=c)
        delta = check_finite(f"the update of {self.name}", scale * direction.to(self.master.device))  # before the master
        self.master += delta
        return float(delta.pow(2).sum())

    def share_param(self):
        """Make a float32 param on the master's device its own master: no copy to keep, nothing to rewrite
        after an update. Only for lowrank ES, which never writes perturbed values into the model."""
        if self.param.dtype == torch.float32 and self.param.device == self.device:
            self.master = self.param.detach()

    def on_device(self):
        """The master on the param's device: itself when it lives there, else an asynchronous copy."""
        return self.master.to(self.param.device, non_blocking=True)


class StepNoise:
    """An optional speed layer for in-place ES: the step's ε of each member seed and tensor, kept once drawn,
    so that each is drawn once per step instead of three times (a mirrored pair's two writes and the update),
    on as many threads as torch uses, in the background while the member before is scored (prefetch). Each
    tensor has its own generator, so the values, and every result, are those of drawing ε at each use.
    Measured in docs/speed.md."""

    @classmethod
    def when_it_pays(cls, tensors, seeds, device):
        """A StepNoise for a model on `device` with `seeds` distinct member seeds per step, or None. Kept only
        on a CPU, where drawing ε costs more than everything else a write does, and when the whole step's noise
        fits in NOISE_CACHE_BYTES of host memory; never on an accelerator, where drawing is cheap and memory
        is not."""
        noise_bytes = 4 * seeds * sum(t.param.numel() for t in tensors)
        return cls(tensors) if device.type == "cpu" and noise_bytes <= NOISE_CACHE_BYTES else None

    def __init__(self, tensors):
        self.tensors = tensors
        self.kept = {}  # member seed -> {tensor index: future ε}
        self.pool = ThreadPoolExecutor(torch.get_num_threads())

    def __call__(self, seed, t):
        """ε of the member seed for tensor t."""
        return self.prefetch(seed)[t.index].result()

    def prefetch(self, seed):
        """Start drawing the seed's ε in the background, once per step; {tensor index: future ε}."""
        if seed not in self.kept:
            self.kept[seed] = {t.index: self.pool.submit(noise, seed, t.index, t.param.shape, t.param.device)
                               for t in self.tensors}
        return self.kept[seed]

    def end_step(self):
        """Forget the step's ε: the next step's members have other seeds."""
        self.kept.clear()
