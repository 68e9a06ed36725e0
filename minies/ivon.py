"""IVON: Improved Variational Online Newton (Shen et al., ICML 2024), written from the equations.

IVON learns a diagonal Gaussian posterior N(θ, diag(s²)) over the weights. The parameters of
the model hold the mean θ; per weight the optimizer keeps a momentum m and a Hessian estimate h
(both fp32), and the posterior std is (σ in the IVON and 3PO papers; s here and in docs/papers.md, where σ is
ES's noise scale)

    s = 1 / sqrt(λ·(h + δ))            λ = ess (effective sample size), δ = weight_decay

One step (t counts steps, starting at 1):

    sample   u ~ N(0, I),  d = s⊙u,  θ̂ = θ + d            (weights put in the model)
    ĝ = ∇L(θ̂)                                             (backward at the sample)
    f = ĝ⊙d/s² = λ·(h+δ)·(ĝ⊙d)                             (Price/reparameterisation Hessian sample)
    with S samples per step, ĝ and f are the averages over the S samples
    m ← β1·m + (1−β1)·ĝ
    h ← β2·h + (1−β2)·f + ½(1−β2)²·(h−f)²/(h+δ)            (the last term keeps h > 0)
    θ ← θ − lr_eff·clip((m/(1−β1^t) + δ·θ)/(h+δ), ±clip_radius)
    lr_eff = lr·(h0+δ) if rescale_lr else lr               (h0 = hess_init)

The right-hand sides use the values before the step, except the θ update, which uses the new m
and h. rescale_lr makes the first steps (h ≈ h0) behave like SGD with learning rate lr. This is
exactly what the reference package ivon-opt does (tests/test_ivon.py checks it step by step).

Usage (the loss's gradient must be taken inside the context, at the sampled weights):

    opt = IVON(model.parameters(), lr=0.1, ess=1e6, hess_init=1e-3, seed=0)
    for batch in data:
        for _ in range(opt.mc_samples):
            with opt.sampled_params(train=True):   # θ̂ in place; on exit: ĝ, f accumulated, θ restored
                loss_fn(model, batch).backward()
        opt.step()
    with opt.sampled_params(train=False):          # explore only: e.g. generate rollouts at θ̂
        rollouts = generate(model)

Noise comes from a torch.Generator owned by the optimizer (seeded with `seed`), drawn as one fp32
vector per parameter group, so runs are reproducible and resumable (state_dict saves it).

Distributed (torchrun): when torch.distributed is initialized, step() averages ĝ and f over the
ranks (all_reduce) before the update, so every rank applies the same update and the means stay
identical (given identical initial weights). Every rank must call step() and take the same number
of samples. With the same `seed` all ranks draw the same u, i.e. evaluate the same θ̂ on different
data; to give each rank its own sample pass sampled_params(seed=...) or (generator=...). Under DDP
the gradients arrive already averaged and the all_reduce is redundant but harmless.

Low precision: for a bf16 or fp16 parameter the mean θ lives in an fp32 master in the optimizer state
(minies/runtime/masters.py, fp32_master) and the parameter holds its rounding, so small updates are not
lost. The Hessian sample uses the drawn d = s⊙u; note that in bf16 a perturbation much smaller than the
weight's spacing is rounded away in θ̂ itself.
"""
import contextlib
import math

import torch
import torch.distributed as dist

from minies.runtime.masters import fp32_master


class IVON(torch.optim.Optimizer):
    """IVON as a torch optimizer; see the module docstring for the update and the usage."""

    def __init__(self, params, lr, ess, hess_init=1.0, beta1=0.9, beta2=0.99999, weight_decay=1e-4,
                 clip_radius=math.inf, rescale_lr=True, mc_samples=1, seed=0):
        if not lr > 0 or not ess > 0 or not hess_init > 0:
            raise ValueError(f"lr, ess and hess_init must be > 0, got {lr}, {ess}, {hess_init}")
        if not (0 <= beta1 < 1 and 0 <= beta2 < 1):
            raise ValueError(f"beta1 and beta2 must be in [0, 1), got {beta1}, {beta2}")
        if weight_decay < 0 or not clip_radius > 0 or mc_samples < 1:
            raise ValueError("need weight_decay >= 0, clip_radius > 0 and mc_samples >= 1")
        defaults = dict(lr=lr, ess=ess, hess_init=hess_init, beta1=beta1, beta2=beta2,
                        weight_decay=weight_decay, clip_radius=clip_radius, rescale_lr=rescale_lr)
        super().__init__(params, defaults)
        self.mc_samples = mc_samples
        device = self.param_groups[0]["params"][0].device
        # Drawing on the parameters' device avoids copying every noise vector host-to-device.
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.num_samples = 0  # samples accumulated since the last step
        self._sampling = False

    def _state(self, p, group):
        """The state of p, created on first use: momentum m, Hessian h, step count, fp32 master."""
        state = self.state[p]
        if not state:
            state["step"] = 0
            state["momentum"] = torch.zeros_like(p, dtype=torch.float32)
            state["hess"] = torch.full_like(p, group["hess_init"], dtype=torch.float32)
            mean = fp32_master(p)
            if mean is not p:
                state["master"] = mean
        return state

    def _mean(self, p, state):
        """The fp32 mean θ: the master copy when p is low precision, else p itself."""
        return state.get("master", p)

    def _std(self, state, group):
        return (group["ess"] * (state["hess"] + group["weight_decay"])).rsqrt()

    @torch.no_grad()
    def posterior_std(self):
        """s = 1/sqrt(λ(h+δ)) for every parameter, in parameter order (fp32 tensors)."""
        return [self._std(self._state(p, g), g) for g in self.param_groups for p in g["params"]]

    @torch.no_grad()
    def mean_std(self):
        """s averaged over all weights (a float), for logging."""
        stds = self.posterior_std()
        return sum(std.sum().item() for std in stds) / sum(std.numel() for std in stds)

    @torch.no_grad()
    def mean_hess(self):
        """h averaged over all weights (a float), for logging."""
        hs = [self._state(p, g)["hess"] for g in self.param_groups for p in g["params"]]
        return sum(h.sum().item() for h in hs) / sum(h.numel() for h in hs)

    @contextlib.contextmanager
    def sampled_params(self, train=True, generator=None, seed=None):
        """Put a weight sample θ̂ = θ + s⊙u in the parameters for the duration of the block.

        train=True: call backward inside the block; on exit p.grad (the gradient at θ̂) is
        accumulated into the step's averages of ĝ and f, and p.grad is reset to None, so each
        sample's gradient is counted once (p.grad is also cleared on entry, so a stale gradient
        cannot leak in). train=False: exploration only (e.g. generating rollouts); nothing is
        accumulated and p.grad is left alone.
        u is drawn from `generator` if given, else from a fresh one seeded with `seed` if given,
        else from the optimizer's own generator (which then advances).
        On exit, also on an exception, the parameters get back exactly the values they had.
        """
        if self._sampling:
            raise RuntimeError("IVON.sampled_params cannot be nested")
        if generator is None and seed is not None:
            generator = torch.Generator(device=self.generator.device).manual_seed(seed)
        backups, perturbations = self._perturb(generator if generator is not None else self.generator, train)
        self._sampling = True
        try:
            yield
            if train:
                self._accumulate(perturbations)
        finally:
            self._sampling = False
            with torch.no_grad():
                params = [p for g in self.param_groups for p in g["params"]]
                for p, backup in zip(params, backups):
                    p.copy_(backup)

    @torch.no_grad()
    def _perturb(self, generator, train):
        """Write θ̂ = θ + d into the parameters; returns their values before (to restore) and the d's."""
        backups, perturbations = [], []
        for group in self.param_groups:
            params = group["params"]
            # One flat draw per group: the same stream whatever the parameter shapes.
            u = torch.randn(sum(p.numel() for p in params), generator=generator,
                            device=generator.device, dtype=torch.float32)
            for p, u_p in zip(params, u.split([p.numel() for p in params])):
                state = self._state(p, group)
                d = self._std(state, group) * u_p.view_as(p).to(p.device)
                # Restore by copying a saved copy back: θ̂ − d would not give θ bit for bit.
                backups.append(p.detach().clone())
                perturbations.append(d)
                p.copy_(self._mean(p, state) + d)
                if train:
                    p.grad = None
        return backups, perturbations

    @torch.no_grad()
    def _accumulate(self, perturbations):
        """Add this sample's ĝ and f = ĝ⊙d/s² to the running sums (averaged in step)."""
        ds = iter(perturbations)
        for group in self.param_groups:
            for p in group["params"]:
                d, state = next(ds), self.state[p]
                # A parameter that took no part in the loss has gradient zero.
                g = p.grad.float() if p.grad is not None else torch.zeros_like(d)
                f = g * d * (group["ess"] * (state["hess"] + group["weight_decay"]))
                if "grad_sum" not in state:
                    state["grad_sum"], state["hess_sum"] = torch.zeros_like(d), torch.zeros_like(d)
                state["grad_sum"].add_(g)
                state["hess_sum"].add_(f)
                p.grad = None
        self.num_samples += 1

    @torch.no_grad()
    def step(self, closure=None):
        """Apply the IVON update from the samples accumulated by sampled_params(train=True).

        With a closure (which computes the loss, calls backward and returns the loss), step first
        takes mc_samples samples itself, calling the closure at each, and returns the mean loss.
        """
        loss = None
        if closure is not None:
            losses = []
            for _ in range(self.mc_samples):
                with self.sampled_params(train=True), torch.enable_grad():
                    losses.append(closure())
            loss = sum(losses) / len(losses)
        if self.num_samples == 0:
            raise RuntimeError("IVON.step() needs at least one sample: compute the loss and call "
                               "backward inside `with optimizer.sampled_params(train=True):` first")
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        for group in self.param_groups:
            b1, b2, wd = group["beta1"], group["beta2"], group["weight_decay"]
            lr = group["lr"] * (group["hess_init"] + wd) if group["rescale_lr"] else group["lr"]
            for p in group["params"]:
                state = self.state[p]
                g = state.pop("grad_sum").div_(self.num_samples)
                f = state.pop("hess_sum").div_(self.num_samples)
                if distributed:
                    # Average over ranks so that every rank applies the same update.
                    for t in (g, f):
                        dist.all_reduce(t)
                        t.div_(dist.get_world_size())
                state["step"] += 1
                m, h = state["momentum"], state["hess"]
                m.mul_(b1).add_(g, alpha=1 - b1)
                h.copy_(b2 * h + (1 - b2) * f + 0.5 * (1 - b2) ** 2 * (h - f) ** 2 / (h + wd))
                mean = self._mean(p, state)
                direction = (m / (1 - b1 ** state["step"]) + wd * mean) / (h + wd)
                mean.sub_(lr * direction.clamp_(-group["clip_radius"], group["clip_radius"]))
                if mean is not p:
                    p.copy_(mean)
        self.num_samples = 0
        return loss

    def state_dict(self):
        sd = super().state_dict()
        sd["ivon"] = {"generator": self.generator.get_state(), "num_samples": self.num_samples}
        return sd

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        extra = state_dict.pop("ivon")
        super().load_state_dict(state_dict)
        # torch casts floating-point state to the parameter's dtype (bf16 for bf16 params);
        # IVON keeps its state in fp32, so put the saved fp32 tensors back.
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for i, p in zip(saved_ids, params):
            for key, value in state_dict["state"].get(i, {}).items():
                if torch.is_tensor(value):
                    self.state[p][key] = value.to(device=p.device, dtype=torch.float32, copy=True)
        self.generator.set_state(extra["generator"])
        self.num_samples = extra["num_samples"]
