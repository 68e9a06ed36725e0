"""3PO: the sequence importance weights by hand, exact restore of the mean, M3PO's average of the
per-sample gradients, C3PO's chunk bookkeeping and pooled advantages, two processes, b3po / m3po / c3po
end to end through train.py, and --resume of a C3PO run logged with the old key sigma_mean."""
import contextlib
import dataclasses
import io
import json
import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import train
from conftest import finish, start_script
from conftest import no_grad_logps as logps
from minies.grpo import GRPO
from minies.grpo_loss import group_advantages
from minies.ivon import IVON
from minies.models import load_model, load_tokenizer
from minies.rollout import format_prompts, generate
from minies.tasks import Arithmetic, Score
from minies.threepo import (B3PO, C3PO, M3PO, C3POConfig, M3POConfig, ThreePOConfig, sequence_weights,
                            weight_seeds)

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = {"prompts": 2, "group_size": 4, "micro_batch": 8}
VARIANTS = {"b3po": (B3PO, ThreePOConfig, {}), "m3po": (M3PO, M3POConfig, {"samples": 2}),
            "c3po": (C3PO, C3POConfig, {"chunks": 2})}


def make(model_dir, name, task=None, **overrides):
    cls, config, extra = VARIANTS[name]
    config = config(**{**SMALL, **extra, **overrides})
    return cls(load_model(model_dir, device="cpu"), load_tokenizer(model_dir), task or Arithmetic(test_size=20), config)


# policy_gradient's log when a stub replaces it: nothing to log.
STUB_LOG = dict.fromkeys(["loss", "clip_low", "clip_high", "grad_norm", "entropy"], 0.0)


def weights(algo):
    return [p.detach().clone() for p in algo.params]


class VariedTask(Arithmetic):
    """Rewards that vary with the completion's characters, so that groups rarely tie."""

    def score(self, completion, problem):
        return Score(reward=float(sum(map(ord, completion)) % 5), correct=False, malformed=False)


def test_sequence_weights_by_hand():
    # Two tokens per row; the third is masked out and must not count (it holds a huge log-ratio).
    ratios = torch.tensor([1.5, 3.0, 0.4, 0.55, 1.9, 2.1], dtype=torch.float64)
    behavior = -torch.rand(6, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    delta = torch.stack([ratios.log() * 0.25, ratios.log() * 0.75, torch.full((6,), 50.0, dtype=torch.float64)], 1)
    mask = torch.tensor([[1, 1, 0]] * 6, dtype=torch.float64)
    w, log_w = sequence_weights(behavior + delta, behavior, mask)
    torch.testing.assert_close(log_w, ratios.log())
    torch.testing.assert_close(w, torch.tensor([1.5, 0, 0, 0.55, 1.9, 0], dtype=torch.float64))
    # Widening the window lets the truncation act: 3.0 and 2.1 are kept at 2; 0.4 is still dropped.
    w, _ = sequence_weights(behavior + delta, behavior, mask, truncate=2.0, keep_min=0.5, keep_max=math.inf)
    torch.testing.assert_close(w, torch.tensor([1.5, 2.0, 0, 0.55, 1.9, 2.0], dtype=torch.float64))


def test_3po_has_ivon_in_place_of_grpos_optimizer_flags():
    """IVON through GRPO's optimizer hook, one step per batch: --optim and --updates-per-batch have nothing
    to choose."""
    fields = {f.name for f in dataclasses.fields(C3POConfig)}
    assert {"lr", "ess", "hess_init", "chunks"} <= fields and not {"optim", "updates_per_batch"} & fields


@pytest.mark.parametrize("name,samples", [("b3po", 1), ("m3po", 2), ("c3po", 1)])
def test_mean_is_restored_exactly(tiny_model_dir, name, samples, monkeypatch):
    """A whole step without IVON's update (rollouts and gradients at weight samples) leaves the
    weights bit for bit as they were; the samples' gradients wait in IVON for its step."""
    algo = make(tiny_model_dir, name)
    assert isinstance(algo.optimizer, IVON)
    before = weights(algo)
    monkeypatch.setattr(algo.optimizer, "step", lambda: None)
    stats = algo.step(algo.task.train_problems(2, seed=0), 0)
    assert all(torch.equal(a, b) for a, b in zip(before, weights(algo)))
    assert algo.optimizer.num_samples == samples and all(p.grad is None for p in algo.params)
    monkeypatch.undo()
    algo.optimizer.step()
    assert any(not torch.equal(a, b) for a, b in zip(before, weights(algo)))
    assert {"s_mean", "hess_mean", "malformed", "zero_std_groups", "reward_mean", "tokens"} <= stats.keys()
    assert len(stats["groups_solved"]) == 2 and set(stats["groups_solved"]) <= {0, 1}  # M3PO: over its samples
    cfg = algo.config
    assert stats["s_mean"] == pytest.approx((cfg.ess * (cfg.hess_init + cfg.weight_decay)) ** -0.5, rel=1e-5)


def test_m3po_step_averages_the_samples_gradients(tiny_model_dir, monkeypatch):
    """With a stub gradient ĝ = θ̂ − θ (added to p.grad, as backward does), IVON's first step sees the
    mean of the M samples' gradients, not of their running sums, and the mean of their ĝ⊙d/σ²."""
    algo = make(tiny_model_dir, "m3po", samples=3)
    theta = weights(algo)
    sampled = []

    def stub_gradient(self, rollouts, advantages, old=None):  # unclipped
        sampled.append(weights(self))
        for p, mean in zip(self.params, theta):
            p.grad = p.detach() - mean if p.grad is None else p.grad + (p.detach() - mean)
        return STUB_LOG.copy()

    monkeypatch.setattr(GRPO, "policy_gradient", stub_gradient)
    algo.step(algo.task.train_problems(2, seed=0), 0)
    assert len(sampled) == 3 and not torch.equal(sampled[0][0], sampled[1][0])
    cfg, opt = algo.config, algo.optimizer
    precision = cfg.ess * (cfg.hess_init + cfg.weight_decay)  # 1/σ² at h = h0
    for i, p in enumerate(algo.params):
        g = torch.stack([s[i] - theta[i] for s in sampled]).mean(0)
        f = torch.stack([(s[i] - theta[i]) ** 2 * precision for s in sampled]).mean(0)
        h0 = cfg.hess_init
        h = cfg.beta2 * h0 + (1 - cfg.beta2) * f + 0.5 * (1 - cfg.beta2) ** 2 * (h0 - f) ** 2 / (h0 + cfg.weight_decay)
        torch.testing.assert_close(opt.state[p]["momentum"], (1 - cfg.beta1) * g)
        torch.testing.assert_close(opt.state[p]["hess"], h)


def test_c3po_chunks_and_pooled_advantages(tiny_model_dir, monkeypatch):
    algo = make(tiny_model_dir, "c3po", task=VariedTask(test_size=20))
    G, N = 4, 2
    problems = algo.task.train_problems(2, seed=3)
    prompts = format_prompts(algo.tokenizer, [p.question for p in problems for _ in range(G)])
    seeds = weight_seeds(3, N + 1)
    before = weights(algo)
    r, chunk, behavior_logps = algo.sample_chunks(prompts, 7, seeds[:N])
    assert all(torch.equal(a, b) for a, b in zip(before, weights(algo)))
    assert chunk.tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
    # Chunk n is exactly what generating those rows at weight sample n gives, and its behavior
    # log-probs are that sample's (not the other's).
    for n in range(N):
        rows = chunk.eq(n).nonzero().flatten().tolist()
        with algo.optimizer.sampled_params(train=False, seed=seeds[n]):
            alone = generate(algo.model, algo.tokenizer, [prompts[i] for i in rows], algo.task.max_new_tokens,
                             seed=7 * N + n)
            here = logps(algo.model, alone)
        with algo.optimizer.sampled_params(train=False, seed=seeds[1 - n]):
            there = logps(algo.model, alone)
        assert [r.texts[i] for i in rows] == alone.texts
        width = alone.completion_ids.shape[1]
        mask = alone.completion_mask.bool()
        torch.testing.assert_close(behavior_logps[rows][:, :width][mask], here[mask])
        assert not torch.allclose(there[mask], here[mask])
        assert torch.all(r.completion_mask[rows][:, width:] == 0)

    # One step: the advantages reaching GRPO's policy gradient are pooled over each group's G rollouts
    # (both chunks), times the importance weights of the fresh sample against each rollout's own sample.
    seen = {}

    def stub_gradient(self, rollouts, advantages, old=None):
        seen.update(rollouts=rollouts, advantages=advantages.clone(), fresh=logps(self.model, rollouts))
        return STUB_LOG.copy()

    monkeypatch.setattr(GRPO, "policy_gradient", stub_gradient)
    sample_chunks = algo.sample_chunks
    algo.sample_chunks = lambda *args: seen.setdefault("chunks", sample_chunks(*args))
    stats = algo.step(problems, 3)
    ro = seen["rollouts"]
    assert ro is seen["chunks"][0]
    rewards = torch.tensor([algo.task.score(t, None).reward for t in ro.texts]).view(2, G)
    w, _ = sequence_weights(seen["fresh"], seen["chunks"][2], ro.completion_mask.float())
    torch.testing.assert_close(seen["advantages"], group_advantages(rewards).flatten() * w)
    per_chunk = group_advantages(rewards.view(2 * N, G // N)).flatten()
    assert not torch.allclose(group_advantages(rewards).flatten(), per_chunk)
    assert 0 < stats["ratio_kept"] <= 1 and stats["log_ratio_abs"] > 0


def _worker(rank, model_dir, tmp):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=2)
    algo = make(model_dir, "c3po", prompts=4)
    seeds = []  # the seed of every weight sample drawn, in order
    sampled_params = algo.optimizer.sampled_params
    algo.optimizer.sampled_params = lambda **kwargs: seeds.append(kwargs["seed"]) or sampled_params(**kwargs)
    for s in range(2):
        algo.step(algo.task.train_problems(4, seed=s), s)
    torch.save({"weights": weights(algo), "seeds": seeds}, f"{tmp}/rank{rank}.pt")
    dist.destroy_process_group()


def test_two_processes_keep_identical_weights(tiny_model_dir, tmp_path):
    mp.start_processes(_worker, args=(tiny_model_dir, str(tmp_path)), nprocs=2, start_method="fork")
    a, b = (torch.load(tmp_path / f"rank{k}.pt") for k in range(2))
    assert a["seeds"] == b["seeds"]  # the same weight samples on both processes
    assert all(torch.equal(x, y) for x, y in zip(a["weights"], b["weights"]))
    initial = [p.detach() for p in load_model(tiny_model_dir, device="cpu").parameters()]
    assert any(not torch.equal(x, y) for x, y in zip(a["weights"], initial))


def test_train_end_to_end(tiny_model_dir, tmp_path):
    common = ["--steps", 2, "--prompts", 2, "--group-size", 4, "--micro-batch", 8, "--model", tiny_model_dir,
              "--eval-problems", 8, "--final-samples", 1, "--eval-every", 0, "--out", tmp_path]
    extra = {"b3po": [], "m3po": ["--samples", 2, "--load-in-8bit", "--lora-rank", 4], "c3po": ["--chunks", 2]}
    procs = {name: start_script("train.py", "--algo", name, *common, *args) for name, args in extra.items()}
    for name, proc in procs.items():
        result = finish(proc)
        assert result.returncode == 0, result.stderr[-3000:]
        rows = [json.loads(line) for line in open(tmp_path / f"{name}-arithmetic-seed0" / "log.jsonl")]
        assert [row["step"] for row in rows] == [1, 2]
        assert {"s_mean", "hess_mean", "malformed", "zero_std_groups"} <= rows[-1].keys()
        assert (tmp_path / f"{name}-arithmetic-seed0" / "summary.json").exists()


def test_resuming_a_run_logged_as_sigma_mean_leaves_one_name_s_mean(tiny_model_dir, tmp_path):
    """A C3PO run logged before IVON's std was s (its log's key sigma_mean) resumes, and its log then names the
    std s_mean in every row, old and new (checkpoint.RENAMED_LOG_KEYS)."""
    flags = ["--algo", "c3po", "--chunks", 2, "--prompts", 2, "--group-size", 4, "--micro-batch", 8, "--model",
             tiny_model_dir, "--eval-problems", 4, "--final-samples", 1, "--eval-every", 0, "--out", tmp_path,
             "--run-name", "old"]
    log = tmp_path / "old" / "log.jsonl"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        train.main([str(f) for f in flags + ["--steps", 2]])
        log.write_text(log.read_text().replace('"s_mean"', '"sigma_mean"'))  # as a run logged it then
        assert [json.loads(line).keys() >= {"sigma_mean"} for line in log.open()] == [True, True]
        train.main([str(f) for f in flags + ["--steps", 3, "--resume"]])
    rows = [json.loads(line) for line in log.open()]
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert all("s_mean" in row and "sigma_mean" not in row for row in rows)
