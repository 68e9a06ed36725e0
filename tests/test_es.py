"""ES: exact restore, lossless updates, ties, independent noise, 8-bit, torchrun and resume."""
import itertools
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from conftest import needs_cuda, run_in_process, single_thread, tuned
from minies import UserError
from minies.analysis import answer_outcome, squared_distance
from minies.eggroll import LowRankPopulation
from minies.es import ES, ESConfig, ScoredRollouts, member_seeds, normalize_rewards
from minies.models import int8_row_scales, load_model, load_tokenizer
from minies.perturbed import PerturbedTensor, noise
from minies.runtime.spilled import SpilledTensors, TensorsInMemory
from minies.tasks import Arithmetic, Score

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def make_es(model_dir, dtype="float32", load_in_8bit=False, device="cpu", **overrides):
    """An ES on a small step, in place unless told otherwise (`auto` would pick lowrank for 8 prompts)."""
    model = load_model(model_dir, dtype, load_in_8bit, device=device)
    cfg = tuned(ESConfig, "es", **{"population": 4, "prompts_per_step": 8, "mode": "inplace", **overrides})
    return ES(model, load_tokenizer(model_dir), Arithmetic(test_size=50), cfg)


def scored_rows(rows, reward, answer="7"):
    """A member's ScoredRollouts on `rows` prompts: every row rewarded `reward`, answering `answer`."""
    return ScoredRollouts([Score(reward, False, False, answer=answer)] * rows, np.zeros(rows, bool), np.ones(rows, int))


def fake_rollout(rewards):
    """An ES.rollout that generates nothing: each member it is asked for gets the next of `rewards` on every row,
    and answers that reward (members with distinct rewards answer differently)."""
    rewards = iter(rewards)

    def rollout(problems, prompts, seed, copies, micro_batch):
        return [scored_rows(len(problems), reward, answer=str(reward)) for reward in
                (next(rewards) for _ in range(copies))]
    return rollout


@pytest.mark.parametrize("dtype,eightbit", [("float32", False), ("bfloat16", False), ("float16", False),
                                            ("float32", True)])
def test_restore_is_bit_exact_after_many_cycles(tiny_model_dir, dtype, eightbit):
    es = make_es(tiny_model_dir, dtype, eightbit)
    es.model(torch.tensor([[5, 6, 7]]))  # 8-bit: the first forward moves the row scales to layer.state
    before = weights(es.model)
    for seed, sign in member_seeds(123, 20, antithetic=True):
        for t in es.tensors:
            t.write_perturbed(seed, sign, sigma=0.01)
        changed = [not torch.equal(t.param, before_t) for t, before_t in
                   zip(es.tensors, [before[n] for n in dict(es.model.named_parameters())])]
        assert any(changed)
        for t in es.tensors:
            t.write_clean()
    after = weights(es.model)
    for name in before:
        assert torch.equal(before[name], after[name]), name


def test_update_below_bf16_spacing_moves_the_master():
    layer = torch.nn.Linear(4, 4).to(torch.bfloat16)
    layer.weight.data.fill_(1.0)  # bf16 spacing at 1.0 is 2**-7
    t = PerturbedTensor(0, "weight", layer.weight, layer)
    t.master += 1e-3  # far below the spacing: a bf16 addition would lose it entirely
    t.write_clean()
    assert torch.all(t.master == torch.tensor(1.0) + 1e-3)
    assert torch.equal(layer.weight, torch.ones(4, 4, dtype=torch.bfloat16))
    for _ in range(10):  # ten such steps add up in the master and finally show in bf16
        t.master += 1e-3
    t.write_clean()
    assert torch.all(layer.weight > 1.0)


def test_noise_is_independent_per_tensor_and_reproducible():
    a = noise(7, 0, (3, 5), "cpu")
    assert torch.equal(a, noise(7, 0, (3, 5), "cpu"))
    assert not torch.allclose(a, noise(7, 1, (3, 5), "cpu"))  # same shape, other tensor: other noise
    assert not torch.allclose(a, noise(8, 0, (3, 5), "cpu"))


def test_member_seeds_antithetic_pairs():
    members = member_seeds(5, 6, antithetic=True)
    assert [s for s, _ in members[0::2]] == [s for s, _ in members[1::2]]
    assert [sign for _, sign in members] == [1.0, -1.0] * 3
    assert members == member_seeds(5, 6, antithetic=True)


def test_normalize_rewards():
    assert np.allclose(normalize_rewards([0.1, 0.3, 0.2], "rank"), [-0.5, 0.5, 0.0])
    assert np.allclose(normalize_rewards([1.0, 1.0, 0.0, 2.0], "rank"), [0.0, 0.0, -0.5, 0.5])
    z = normalize_rewards([1.0, 2.0, 3.0], "zscore")
    assert np.isclose(z.mean(), 0) and np.isclose(z.std(), 1)
    for how in ("rank", "zscore"):
        out = normalize_rewards([0.5, 0.5, 0.5], how)
        assert not np.isnan(out).any() and not out.any()
    for how in ("rank", "zscore"):  # equal rewards whose mean rounds (std ~1e-17, not 0): still no step
        assert not normalize_rewards([0.1] * 30, how).any()


def test_all_tied_step_changes_nothing(tiny_model_dir):
    es = make_es(tiny_model_dir)
    es.rollout = fake_rollout(itertools.repeat(0.1))  # all the same, with the same answers
    before = weights(es.model)
    stats = es.step(Arithmetic(test_size=50).train_problems(8, seed=0), seed=0)
    assert stats["all_tied"] and stats["update_norm"] == 0.0 and not np.isnan(stats["fitness_snr"])
    assert stats["js_diversity"] == 0.0  # every member gave the same answers
    for name, value in weights(es.model).items():
        assert torch.equal(before[name], value)


@pytest.mark.parametrize("antithetic", [False, True])
def test_update_is_the_seeded_sum(tiny_model_dir, antithetic):
    """θ ← θ + α/N Σ z_n ε_n, with ε regenerated from the member seeds (ε_n = sign_n·ε_seed_n: a mirrored
    pair's two terms, which the update merges into one, are checked here one by one)."""
    es = make_es(tiny_model_dir, alpha=0.01, antithetic=antithetic)
    es.rollout = fake_rollout([0.0, 1.0, 3.0, 2.0])
    t = es.tensors[3]
    start = t.master.clone()
    es.step(Arithmetic(test_size=50).train_problems(8, seed=0), seed=11)
    z = normalize_rewards([0.0, 1.0, 3.0, 2.0], "rank")
    members = member_seeds(11, 4, antithetic)
    assert len({s for s, _ in members}) == (2 if antithetic else 4)
    expected = start + 0.01 / 4 * sum(zn * sign * noise(s, t.index, t.param.shape, "cpu")
                                      for (s, sign), zn in zip(members, z))
    assert torch.allclose(t.master, expected, atol=1e-7)
    assert torch.equal(t.param, t.master)


@pytest.mark.parametrize("mode", ["inplace", "lowrank"])
def test_8bit_steps_change_outputs_and_checkpoint_reloads(tiny_model_dir, tmp_path, mode):
    es = make_es(tiny_model_dir, load_in_8bit=True, sigma=0.05, alpha=0.05, population=4, mode=mode)
    ids = torch.tensor([[5, 8, 9, 79, 10]])
    before = es.model(ids).logits
    problems = Arithmetic(test_size=50).train_problems(8, seed=0)
    es.rollout = fake_rollout(map(float, itertools.count()))
    for step in range(2):
        es.step(problems, seed=step)
    after = es.model(ids).logits
    assert not torch.allclose(before, after)
    es.model.save_pretrained(tmp_path)
    reloaded = load_model(str(tmp_path), device="cpu")  # the saved config says 8-bit
    assert torch.allclose(reloaded(ids).logits, after, atol=1e-4)


def run_train(args, tmp_path, procs=1):
    """train.py with small settings: one process in this interpreter (on one thread, as OMP_NUM_THREADS=1
    would give), several under torchrun."""
    common = ["--population", "4", "--prompts-per-step", "8", "--eval-every", "0", "--eval-problems", "8",
              "--final-samples", "1", "--out", str(tmp_path), "--sigma", "0.01", "--alpha", "0.01"]
    if procs == 1:
        with single_thread():
            code, message = run_in_process("train.py", *common, *args)
        assert code == 0, message
        return
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}", "train.py"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd + common + args, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]


def final_weights(run_dir, step):
    return load_file(os.path.join(run_dir, f"step-{step:06d}", "model.safetensors"))


@pytest.mark.parametrize("mode", ["inplace", "lowrank"])
def test_torchrun_two_processes_equal_one(tmp_path, tiny_model_dir, mode):
    args = ["--steps", "3", "--model", tiny_model_dir, "--mode", mode]
    run_train(args + ["--run-name", "one"], tmp_path)
    run_train(args + ["--run-name", "two"], tmp_path, procs=2)
    one, two = final_weights(tmp_path / "one", 3), final_weights(tmp_path / "two", 3)
    assert one.keys() == two.keys()
    assert all(torch.equal(one[k], two[k]) for k in one)
    start = load_file(os.path.join(tiny_model_dir, "model.safetensors"))
    assert not all(torch.equal(one[k], start[k]) for k in one)  # the runs did train


def test_resume_is_bit_exact(tmp_path, tiny_model_dir):
    model = ["--model", tiny_model_dir]
    run_train(["--steps", "4", "--run-name", "straight"] + model, tmp_path)
    run_train(["--steps", "2", "--run-name", "resumed", "--save-every", "2"] + model, tmp_path)
    run_train(["--steps", "4", "--run-name", "resumed", "--resume"] + model, tmp_path)
    a, b = final_weights(tmp_path / "straight", 4), final_weights(tmp_path / "resumed", 4)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_8bit_resume_is_bit_exact_and_its_checkpoints_load(tmp_path, tiny_model_dir):
    """2 + 2 steps of 8-bit ES equal 4: the state holds the masters and the int8 row scales, and --resume writes
    them into the start model; a checkpoint holds the dequantized float model, which eval.py and --model load."""
    model = ["--model", tiny_model_dir, "--load-in-8bit", "--mode", "inplace"]
    run_train(["--steps", "4", "--run-name", "straight"] + model, tmp_path)
    run_train(["--steps", "2", "--run-name", "resumed", "--save-every", "2"] + model, tmp_path)
    run_train(["--steps", "4", "--run-name", "resumed", "--resume"] + model, tmp_path)
    a, b = final_weights(tmp_path / "straight", 4), final_weights(tmp_path / "resumed", 4)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert all(v.is_floating_point() for v in a.values())  # dequantized: no int8 weights, no scales
    states = [torch.load(tmp_path / run / "step-000004" / "training_state.pt", weights_only=False)["algorithm"]
              for run in ("straight", "resumed")]
    for key in ("master", "row_scales"):
        assert all(x is y is None or torch.equal(x, y) for x, y in zip(states[0][key], states[1][key])), key
    assert any(s is not None for s in states[0]["row_scales"])
    checkpoint = str(tmp_path / "straight" / "step-000004")
    run_train(["--steps", "1", "--run-name", "again", "--model", checkpoint, "--load-in-8bit"], tmp_path)
    out = subprocess.run([sys.executable, "eval.py", "--model", checkpoint, "--problems", "4", "--n", "1", "--k", "1"],
                         cwd=ROOT, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]


# --- lowrank (EGGROLL) mode --------------------------------------------------------------------------

def member_factors(es, seed, t):
    """A_n [out, r] and B_n [in, r] of one member seed for tensor t."""
    return es.lowrank.factors([seed], t)[0].split(list(t.param.shape))


def test_lowrank_member_rows_run_at_their_own_explicit_weights(tiny_model_dir):
    """Row block j of a batched forward equals a plain forward at W + σ·sign_j·A_j·B_jᵀ/√r."""
    es = make_es(tiny_model_dir, mode="lowrank", rank=2)
    ids = torch.tensor([[5, 8, 9, 79, 10], [6, 7, 79, 9, 11]])
    members = member_seeds(3, 4, antithetic=True)
    clean = weights(es.model)
    with es.lowrank.perturbed(members, sigma=0.05):
        batched = es.model(ids.repeat(len(members), 1)).logits.view(len(members), *ids.shape, -1)
    assert all(torch.equal(v, clean[k]) for k, v in weights(es.model).items())  # weights never modified
    for j, (seed, sign) in enumerate(members):
        # Written from the clean copy: in float32 lowrank mode the param is its own master (share_param).
        for t in es.tensors:
            a, b = member_factors(es, seed, t)
            t.write(clean[t.name] + sign * 0.05 * a @ b.T / 2 ** 0.5)
        explicit = es.model(ids).logits
        for t in es.tensors:
            t.write(clean[t.name])
        assert torch.allclose(batched[j], explicit, atol=1e-5), j
    assert not torch.allclose(batched[0], batched[1])  # mirrored pair: different perturbations
    assert not torch.allclose(batched[0], batched[2])  # other seed


def test_lowrank_perturbs_weight_matrices_and_both_uses_of_the_tied_embedding(tiny_model_dir):
    es = make_es(tiny_model_dir, mode="lowrank")  # default --params: the embeddings and block 0
    names = {t.name for t in es.tensors}
    assert "model.embed_tokens.weight" in names and all(n.endswith("proj.weight") for n in names - {
        "model.embed_tokens.weight"}) and not any("norm" in n for n in names)
    embedding = next(t for t in es.tensors if t.name == "model.embed_tokens.weight")
    assert es.model.lm_head.weight is embedding.param  # the shipped model ties its head to the embedding
    assert es.lowrank.modules[embedding.index] == [es.model.model.embed_tokens, es.model.lm_head]
    with pytest.raises(UserError, match="lowrank"):
        make_es(tiny_model_dir, mode="lowrank", params="norm")


def test_lowrank_float32_param_is_its_own_master(tiny_model_dir):
    """Lowrank never writes perturbed weights into the model, so a float32 param needs no separate fp32
    master; in place, and in bfloat16, it does."""
    def shared(es):
        return [t.master.data_ptr() == t.param.data_ptr() for t in es.tensors]
    assert all(shared(make_es(tiny_model_dir, mode="lowrank")))
    assert not any(shared(make_es(tiny_model_dir, mode="inplace")))
    assert not any(shared(make_es(tiny_model_dir, "bfloat16", mode="lowrank")))


def test_lowrank_update_is_the_sum_of_rank_r_terms(tiny_model_dir):
    es = make_es(tiny_model_dir, alpha=0.01, antithetic=False, mode="lowrank", rank=3)
    fake = [0.0, 1.0, 3.0, 2.0]
    es.rollout = fake_rollout(fake)  # each member answers its own reward
    t = es.tensors[2]
    starts = [u.master.clone() for u in es.tensors]
    start = starts[2]
    stats = es.step(Arithmetic(test_size=50).train_problems(8, seed=0), seed=11)
    # The logged norm comes from the factors' Gram matrices (LowRankPopulation.add_update): it is the norm
    # of what the masters moved.
    moved = sum(float((u.master - s).pow(2).sum()) for u, s in zip(es.tensors, starts)) ** 0.5
    assert stats["update_norm"] == pytest.approx(moved, rel=1e-4)
    assert stats["js_diversity"] == pytest.approx(1.0)  # every member gave its own answer everywhere
    z = normalize_rewards(fake, "rank")
    terms = []
    for (seed, _), zn in zip(member_seeds(11, 4, False), z):
        a, b = member_factors(es, seed, t)
        assert a.shape == (t.param.shape[0], 3) and b.shape == (t.param.shape[1], 3)
        terms.append(zn * sum(torch.outer(a[:, i], b[:, i]) for i in range(3)) / 3 ** 0.5)
    assert torch.allclose(t.master, start + 0.01 / 4 * sum(terms), atol=1e-7)
    assert torch.equal(t.param, t.master)


def test_lowrank_scores_equal_scoring_each_member_alone(tiny_model_dir):
    """Batching k members per generate call gives every member the rewards it gets on its own."""
    es = make_es(tiny_model_dir, mode="lowrank", sigma=0.05, population=6, prompts_per_step=4)
    problems = Arithmetic(test_size=50).train_problems(4, seed=1)
    members = member_seeds(9, 6, antithetic=True)
    runs = []
    for micro_batch in (4 * 6, 4):  # all six members in one call, then one member per call
        es.config.micro_batch = micro_batch
        runs.append({n: (r.rewards, [answer_outcome(s) for s in r.scores])
                     for n, r in es.score(members, problems, seed=0)[0].items()})
    together, alone = runs
    assert all(np.array_equal(together[n][0], alone[n][0]) and together[n][1] == alone[n][1] for n in range(6))


def test_int8_update_past_a_row_scale_rescales_the_row(tiny_model_dir):
    """An update that moves a master row beyond its int8 scale must reach the model: the row gets a new
    scale, so the model stays quantize(master) within half an int8 step (it would clamp at ±127 for good)."""
    es = make_es(tiny_model_dir, "float32", True, params=".*")
    es.model(torch.tensor([[5, 6, 7]]))  # the first forward moves the row scales to layer.state
    t = next(t for t in es.tensors if t.int8)
    old = int8_row_scales(t.module).clone()
    t.master[0, 0] = 3 * old[0, 0]  # far past row 0's largest |weight|
    t.master[1] *= 1.5  # a whole row grows
    t.write_clean()
    scales = int8_row_scales(t.module)
    assert scales[0, 0] == pytest.approx(3 * old[0, 0]) and scales[1, 0] == pytest.approx(1.5 * old[1, 0])
    assert torch.equal(scales[2:], old[2:])  # rows the update kept inside their scale are untouched
    assert ((t.dequantized().cpu() - t.master).abs() <= scales.cpu() / 254 * (1 + 1e-5)).all()


def test_int8_clamps_are_counted(tiny_model_dir):
    es = make_es(tiny_model_dir, "float32", True, params=".*")
    es.model(torch.tensor([[5, 6, 7]]))
    int8 = [t for t in es.tensors if t.int8]
    elements = sum(t.param.numel() for t in int8)
    fractions = []
    for sigma in (1e-3, 0.1):
        fractions.append(sum(t.write_perturbed(seed=1, sign=1.0, sigma=sigma) for t in int8) / elements)
        for t in int8:
            t.write_clean()
    assert 0 < fractions[0] < 0.02 < fractions[1]  # a few largest weights at small σ, many at large σ


@pytest.mark.parametrize("eightbit", [False, True])
def test_step_logs_truncation_and_int8_clamps(tiny_model_dir, eightbit):
    """Every step logs the share of truncated completions; with int8 weights scored in place, also the
    share of int8 weights the perturbations clamp (a fraction of a percent at the default σ)."""
    es = make_es(tiny_model_dir, load_in_8bit=eightbit, params=".*")
    log = es.step(Arithmetic(test_size=50).train_problems(8, seed=0), seed=0)
    assert 0.0 <= log["truncated_rate"] <= 1.0
    assert ("int8_clamped" in log) == eightbit
    if eightbit:
        assert 0.0 < log["int8_clamped"] < 0.05
    es.task.max_new_tokens = 2  # too short for any answer: every completion is cut off
    assert es.step(Arithmetic(test_size=50).train_problems(8, seed=0), seed=1)["truncated_rate"] == 1.0


@pytest.mark.parametrize("device,masters", [("cpu", "auto"), pytest.param("cuda", "cuda", marks=needs_cuda),
                                            pytest.param("cuda", "cpu", marks=needs_cuda)])
def test_drift_sums_over_chunks_to_the_distance_from_the_start(tiny_model_dir, monkeypatch, device, masters):
    """θ0 lives in pinned host memory when the masters are on CUDA (drift streams it to them), else in a
    temporary file (SpilledTensors), read back a chunk at a time."""
    import minies.analysis
    monkeypatch.setattr(minies.analysis, "DRIFT_CHUNK", 1000)  # many chunks per matrix, a partial one at each end
    es = make_es(tiny_model_dir, device=device, params=".*", master_device=masters)
    assert all(t.master.device.type == es.resolved["master_device"] for t in es.tensors)
    if es.resolved["master_device"] == "cuda":
        assert isinstance(es.theta0, TensorsInMemory)
        assert all(t0.device.type == "cpu" and t0.is_pinned() for t0 in es.theta0)
        theta0 = es.theta0
    else:
        assert isinstance(es.theta0, SpilledTensors) and len(es.theta0) == len(es.tensors)
        theta0 = list(es.theta0)
    assert all(torch.equal(t0, t.master.cpu()) for t0, t in zip(theta0, es.tensors))
    assert squared_distance(es.theta0, [t.master for t in es.tensors]) == 0.0
    torch.manual_seed(0)
    for t in es.tensors:
        t.master += 0.01 * torch.randn_like(t.master)
    expected = sum(float((t.master.double().cpu() - t0.double()).pow(2).sum())
                   for t, t0 in zip(es.tensors, theta0))
    assert squared_distance(es.theta0, [t.master for t in es.tensors]) ** 0.5 == pytest.approx(expected ** 0.5, rel=1e-5)
    es.rollout = fake_rollout([0.0, 1.0, 3.0, 2.0])
    log = es.step(Arithmetic(test_size=50).train_problems(8, seed=0), seed=0)  # the step logs this distance
    assert log["drift"] == squared_distance(es.theta0, [t.master for t in es.tensors]) ** 0.5


@pytest.mark.parametrize("antithetic,dtype", [(True, "float32"), (False, "float32"), (True, "bfloat16")])
def test_the_step_noise_cache_changes_no_result(tiny_model_dir, antithetic, dtype, monkeypatch):
    """In place on a CPU a step keeps the noise it drew (StepNoise, an optional speed layer): each ε is drawn
    once instead of once per write and once for the update. Rewards and weights are bit-identical to drawing
    every ε from its seed at each use, without it (a bfloat16 write then turns the drawn ε into σ·ε in place)."""
    import minies.perturbed
    draws = []
    monkeypatch.setattr(minies.perturbed, "noise", lambda *args: draws.append(args) or noise(*args))
    task = Arithmetic(test_size=50)
    runs = []
    for cache in (True, False):
        es = make_es(tiny_model_dir, dtype, antithetic=antithetic, params=".*")
        step_noise = es.step_noise
        assert step_noise is not None  # the test model's noise fits: the cache is on unless switched off
        es.step_noise = step_noise if cache else None
        draws.clear()
        logs = [es.step(task.train_problems(8, seed=step), step) for step in range(2)]
        assert not step_noise.kept  # emptied after every step
        # Per step and tensor: with the cache one draw per distinct ε (2 mirrored pairs, or 4 members); without,
        # one per member's write plus one per ε in the update.
        if cache:
            assert len(draws) == 2 * len(es.tensors) * (2 if antithetic else 4)
        else:
            assert len(draws) > 2 * len(es.tensors) * 4
        runs.append(([log["reward_mean"] for log in logs], [t.master.clone() for t in es.tensors],
                     weights(es.model)))
    (rewards, masters, model), (rewards_ref, masters_ref, model_ref) = runs
    assert rewards == rewards_ref
    assert all(torch.equal(a, b) for a, b in zip(masters, masters_ref))
    assert all(torch.equal(model[k], model_ref[k]) for k in model)


def test_the_noise_cache_stays_within_its_budget(tiny_model_dir, monkeypatch):
    import minies.perturbed
    lowrank = make_es(tiny_model_dir, mode="lowrank")
    assert isinstance(lowrank.lowrank, LowRankPopulation) and lowrank.step_noise is None  # noise in the forward pass
    monkeypatch.setattr(minies.perturbed, "NOISE_CACHE_BYTES", 1000)
    assert make_es(tiny_model_dir).step_noise is None
