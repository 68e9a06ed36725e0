"""Tests for minies.ivon. The reference package ivon-opt (GPL-3.0) is used only as a black-box oracle:
its trajectory is compared with ours, none of its code is used."""
import copy
import io

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from minies.ivon import IVON


def mlp(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(dtype)


def data(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(32, 8, generator=g).to(dtype), torch.randn(32, 4, generator=g).to(dtype)


def mse(model, x, y):
    return ((model(x) - y) ** 2).mean()


def params_of(model):
    return [p.detach().clone() for p in model.parameters()]


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("mc_samples, hp", [
    (1, dict(lr=0.05, ess=1e3, hess_init=0.1, beta2=0.99, weight_decay=1e-3)),
    # clip_radius=0.3 clips about a fifth of the coordinates here, so both branches are checked.
    (3, dict(lr=0.05, ess=1e3, hess_init=0.1, beta1=0.8, beta2=0.9, weight_decay=1e-3,
             clip_radius=0.3, rescale_lr=False)),
])
def test_matches_reference_ivon(mc_samples, hp):
    ivon = pytest.importorskip("ivon", reason="reference ivon-opt not installed (pip install ivon-opt)")
    ref_model = mlp()
    our_model = copy.deepcopy(ref_model)
    x, y = data()
    ref = ivon.IVON(ref_model.parameters(), mc_samples=mc_samples, **hp)
    ours = IVON(our_model.parameters(), mc_samples=mc_samples, seed=1, **hp)
    # The reference draws u as one flat randn per parameter group from the global generator; ours
    # draws the same from its own generator seeded with `seed`, so seeding both alike shares u.
    torch.manual_seed(1)
    for _ in range(20):
        for _ in range(mc_samples):
            with ref.sampled_params(train=True):
                ref_model.zero_grad()  # the reference leaves p.grad set after each sample
                ref_sample = params_of(ref_model)
                mse(ref_model, x, y).backward()
            with ours.sampled_params(train=True):
                our_sample = params_of(our_model)
                mse(our_model, x, y).backward()
            for a, b in zip(our_sample, ref_sample):
                assert rel_err(a, b) < 1e-6, "the two optimizers drew different weight samples"
        ref.step()
        ours.step()
        for a, b in zip(our_model.parameters(), ref_model.parameters()):
            assert rel_err(a.detach(), b.detach()) < 1e-6
    assert all(not torch.equal(a, b) for a, b in zip(params_of(our_model), params_of(mlp())))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sampling_restores_the_mean_exactly(dtype):
    model = mlp(dtype=dtype)
    x, y = data(dtype=dtype)
    opt = IVON(model.parameters(), lr=0.1, ess=1e4, hess_init=0.1)
    for _ in range(3):
        for train in (False, True):
            mean = params_of(model)
            with opt.sampled_params(train=train):
                assert all(not torch.equal(p, m) for p, m in zip(model.parameters(), mean))
                mse(model, x, y).backward()
            assert all(torch.equal(p, m) for p, m in zip(model.parameters(), mean))
        assert all(p.grad is None for p in model.parameters())
        opt.step()
    mean = params_of(model)
    with pytest.raises(ValueError), opt.sampled_params():
        raise ValueError
    assert all(torch.equal(p, m) for p, m in zip(model.parameters(), mean))
    for p in model.parameters():
        state = opt.state[p]
        assert state["momentum"].dtype == state["hess"].dtype == torch.float32
        if dtype == torch.bfloat16:  # the fp32 master is the mean, the parameter its rounding
            assert state["master"].dtype == torch.float32
            assert torch.equal(p, state["master"].to(dtype))


def test_small_updates_survive_in_bf16():
    weight = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    # Each step moves the mean by about lr = 1e-3, under half the bf16 spacing at 1.0: without the
    # fp32 master every step would round back to 1.0.
    opt = IVON([weight], lr=1e-3, ess=1e4, hess_init=1.0, beta1=0.0, weight_decay=0.0)
    for _ in range(10):
        with opt.sampled_params():
            weight.sum().backward()
        opt.step()
    assert torch.allclose(opt.state[weight]["master"], torch.full((4,), 0.99), atol=1e-4)
    assert torch.equal(weight, opt.state[weight]["master"].to(torch.bfloat16))
    assert (weight < 1).all()


def test_std_shrinks_where_the_hessian_grows():
    theta = torch.nn.Parameter(torch.ones(10))
    curvature = torch.ones(10)
    curvature[0] = 100.0  # large, consistent gradients on coordinate 0 only
    opt = IVON([theta], lr=0.05, ess=1e4, hess_init=1.0, beta2=0.9, weight_decay=0.0)
    for _ in range(40):
        with opt.sampled_params():
            (0.5 * curvature * theta ** 2).sum().backward()
        opt.step()
    h = opt.state[theta]["hess"]
    (std,) = opt.posterior_std()
    assert h[0] > 10 * h[1:].max()
    assert std[0] < std[1:].min()
    assert torch.allclose(std, 1 / (1e4 * h).sqrt())
    assert opt.mean_hess() == pytest.approx(h.mean().item())
    assert opt.mean_std() == pytest.approx(std.mean().item())


def test_mc_samples_average_the_gradient_not_sum():
    c = torch.tensor([1.0, -2.0, 3.0, 0.5, -0.25])
    theta = torch.nn.Parameter(torch.zeros(5))
    hp = dict(lr=0.1, ess=100.0, hess_init=0.5, beta1=0.0, beta2=0.9, weight_decay=1e-2, mc_samples=3)
    opt = IVON([theta], seed=3, **hp)
    (std,) = opt.posterior_std()
    hess_samples = []
    for _ in range(3):
        with opt.sampled_params():
            hess_samples.append(c * theta.detach() / std ** 2)  # f = ĝ⊙d/σ², here ĝ = c and d = θ̂
            (c * theta).sum().backward()
        assert theta.grad is None
    opt.step()
    f, h0, b2, wd = torch.stack(hess_samples).mean(0), 0.5, 0.9, 1e-2
    assert torch.allclose(opt.state[theta]["momentum"], c)  # β1 = 0: m is the averaged ĝ, not 3c
    expected_h = b2 * h0 + (1 - b2) * f + 0.5 * (1 - b2) ** 2 * (h0 - f) ** 2 / (h0 + wd)
    assert torch.allclose(opt.state[theta]["hess"], expected_h)

    # step(closure) takes the mc_samples samples itself and matches the loop above bit for bit.
    theta2 = torch.nn.Parameter(torch.zeros(5))
    opt2 = IVON([theta2], seed=3, **hp)
    calls = []

    def closure():
        calls.append(1)
        loss = (c * theta2).sum()
        loss.backward()
        return loss

    opt2.step(closure)
    assert len(calls) == 3 and torch.equal(theta2, theta)


def test_step_needs_a_training_sample():
    model = mlp()
    x, y = data()
    opt = IVON(model.parameters(), lr=0.1, ess=1e3)
    with opt.sampled_params(train=False):  # exploration only: nothing is accumulated
        mse(model, x, y).backward()
    with pytest.raises(RuntimeError, match="at least one sample"):
        opt.step()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_dict_round_trip_resumes_bit_identically(dtype):
    x, y = data(dtype=dtype)
    hp = dict(lr=0.05, ess=1e3, hess_init=0.1, beta2=0.9, mc_samples=2)

    def train(model, opt, steps):
        for _ in range(steps):
            for _ in range(opt.mc_samples):
                with opt.sampled_params():
                    mse(model, x, y).backward()
            opt.step()

    model = mlp(dtype=dtype)
    opt = IVON(model.parameters(), seed=0, **hp)
    train(model, opt, 3)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buffer)
    train(model, opt, 3)

    buffer.seek(0)
    checkpoint = torch.load(buffer)
    resumed_model = mlp(seed=1, dtype=dtype)
    resumed = IVON(resumed_model.parameters(), seed=123, **hp)
    resumed_model.load_state_dict(checkpoint["model"])
    resumed.load_state_dict(checkpoint["opt"])
    train(resumed_model, resumed, 3)
    assert all(torch.equal(a, b) for a, b in zip(resumed_model.parameters(), model.parameters()))
    for p, q in zip(resumed_model.parameters(), model.parameters()):
        for key, value in opt.state[q].items():
            assert torch.equal(torch.as_tensor(resumed.state[p][key]), torch.as_tensor(value)), key


def _train_linear(batches, steps=5):
    """A tiny linear model trained on the mean loss over `batches`, at one weight sample per step."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = IVON(model.parameters(), lr=0.1, ess=1e3, hess_init=0.1, beta2=0.9, seed=0)
    for _ in range(steps):
        with opt.sampled_params():
            (sum(((model(bx) - by) ** 2).mean() for bx, by in batches) / len(batches)).backward()
        opt.step()
    return params_of(model)


def _rank_batch(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)


def _dist_worker(rank, tmp_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp_dir}/rendezvous", rank=rank, world_size=2)
    try:
        torch.save(_train_linear([_rank_batch(rank)]), f"{tmp_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_distributed_ranks_agree_with_one_process_on_the_averaged_gradient(tmp_path):
    # Same seed on both ranks: the same θ̂, different data; step() all-reduces ĝ and f.
    # fork, not spawn: the children need not import torch again (seconds on a busy machine).
    mp.start_processes(_dist_worker, args=(str(tmp_path),), nprocs=2, start_method="fork")
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    single = _train_linear([_rank_batch(0), _rank_batch(1)])
    for a, b, s in zip(rank0, rank1, single):
        assert torch.equal(a, b)
        assert torch.allclose(a, s, rtol=1e-6, atol=1e-7)
    assert not all(torch.equal(a, s) for a, s in zip(_train_linear([_rank_batch(0)]), single))
