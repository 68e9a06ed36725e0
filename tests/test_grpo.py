"""GRPO: the loss by hand, clipping, exact micro-batch and multi-process aggregation, zero-advantage
groups, the EOS token, KL, learning on a fixed batch, fp32 masters of bfloat16 weights, the logits cap on
every pass over completions (GRPO's, 3PO's and the evaluation's), exact resume."""
import io
import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import minies.evaluate
import minies.tasks.answers
import minies.grpo
import minies.rollout
import train
from conftest import DenseArithmetic, logps
from minies.grpo import GRPO, GRPOConfig
from minies.grpo_loss import group_advantages, grpo_loss
from minies.models import load_model, load_tokenizer
from minies.rollout import format_prompts, generate
from minies.tasks import Arithmetic

SMALL = {"prompts": 4, "group_size": 4, "micro_batch": 8}


pytestmark = pytest.mark.usefixtures("one_thread")  # from conftest.py


def make_grpo(model_dir, load_in_8bit=False, dtype="float32", **overrides):
    torch.manual_seed(0)  # the adapters' initialization, as train.py seeds it
    model = load_model(model_dir, dtype, load_in_8bit=load_in_8bit, device="cpu")
    return GRPO(model, load_tokenizer(model_dir), DenseArithmetic(test_size=20), GRPOConfig(**{**SMALL, **overrides}))


def sample(algo, prompts=4, seed=0):
    """A fixed batch: `prompts` problems times the group size, sampled from the algorithm's model."""
    problems = algo.task.train_problems(prompts, seed=seed)
    questions = [p.question for p in problems for _ in range(algo.config.group_size)]
    return generate(algo.model, algo.tokenizer, format_prompts(algo.tokenizer, questions), algo.task.max_new_tokens,
                    seed=seed)


def rows(rollouts, index):
    return rollouts.select(index)


def trainable(algo):
    return {n: p.detach().clone() for n, p in algo.model.named_parameters() if p.requires_grad}


# The loss as a function ---------------------------------------------------------------------------

@pytest.mark.parametrize("aggregation,max_len,expected", [
    ("grpo", None, 0.5),  # mean over sequences of per-sequence means: (-1 + 2) / 2
    ("dapo", None, 0.8),  # mean over the 5 tokens: (-1 - 1 + 2 + 2 + 2) / 5
    ("dr_grpo", None, 4 / 6),  # sum / (B * width) = 4 / (2 * 3)
    ("dr_grpo", 4, 0.5),  # sum / (B * max_len) = 4 / (2 * 4)
])
def test_loss_by_hand(aggregation, max_len, expected):
    # At ratio 1 each token's loss is -A: row 0 has A = 1 on 2 tokens, row 1 has A = -2 on 3.
    lp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    loss, stats = grpo_loss(lp, lp.detach(), torch.tensor([1.0, -2.0]), mask, aggregation=aggregation, max_len=max_len)
    assert loss.item() == pytest.approx(expected)
    assert stats == {"clip_low": 0.0, "clip_high": 0.0}
    loss.backward()
    assert lp.grad[0, 2] == 0  # masked tokens get no gradient


def test_clipping_only_where_it_should():
    ratios = torch.tensor([[0.5, 0.9, 1.1, 1.5], [0.5, 0.9, 1.1, 1.5]])
    old = torch.zeros(2, 4)
    lp = ratios.log().requires_grad_()
    loss, stats = grpo_loss(lp, old, torch.tensor([1.0, -1.0]), torch.ones(2, 4), epsilon_low=0.2, epsilon_high=0.2,
                            aggregation="dapo")
    loss.backward()
    # A > 0: only a ratio above 1 + eps is clipped; A < 0: only a ratio below 1 - eps.
    clipped = torch.tensor([[False, False, False, True], [True, False, False, False]])
    assert torch.all(lp.grad[clipped] == 0)
    assert torch.all(lp.grad[~clipped] != 0)
    assert stats["clip_low"] == stats["clip_high"] == 1 / 8
    # Asymmetric clipping (DAPO's clip-higher): with eps_high 0.6, 1.5 is no longer clipped.
    _, stats = grpo_loss(lp, old, torch.tensor([1.0, -1.0]), torch.ones(2, 4), epsilon_low=0.2, epsilon_high=0.6,
                         aggregation="dapo")
    assert stats["clip_high"] == 0 and stats["clip_low"] == 1 / 8


@pytest.mark.parametrize("aggregation", ["grpo", "dapo", "dr_grpo"])
def test_parts_add_up_to_the_batch(aggregation):
    g = torch.Generator().manual_seed(0)
    lp = (-torch.rand(6, 5, generator=g)).requires_grad_()
    old, ref = lp.detach() + 0.1 * torch.randn(6, 5, generator=g), lp.detach() - 0.2
    adv, mask = torch.randn(6, generator=g), torch.ones(6, 5)
    mask[1, 3:] = mask[4, 1:] = 0
    args = dict(aggregation=aggregation, beta=0.1, max_len=7)
    whole, _ = grpo_loss(lp, old, adv, mask, ref_logps=ref, **args)
    whole_grad, = torch.autograd.grad(whole, lp)
    counts = dict(num_sequences=6, num_tokens=mask.sum())
    parts = [grpo_loss(lp[s], old[s], adv[s], mask[s], ref_logps=ref[s], **args, **counts)[0]
             for s in (slice(0, 2), slice(2, 6))]
    parts_grad, = torch.autograd.grad(sum(parts), lp)
    assert sum(parts).item() == pytest.approx(whole.item(), abs=1e-7)
    torch.testing.assert_close(parts_grad, whole_grad)


def test_kl_is_zero_when_policy_is_reference():
    lp = -torch.rand(3, 4)
    adv, mask = torch.tensor([1.0, -1.0, 0.5]), torch.ones(3, 4)
    with_kl, stats = grpo_loss(lp, lp, adv, mask, ref_logps=lp, beta=0.5)
    without, _ = grpo_loss(lp, lp, adv, mask)
    assert stats["kl"] == 0.0 and with_kl.item() == without.item()
    _, stats = grpo_loss(lp, lp, adv, mask, ref_logps=lp - 0.3, beta=0.5)
    assert stats["kl"] == pytest.approx(math.exp(-0.3) + 0.3 - 1)  # k3 at ref - logp = -0.3


def test_advantages_of_tied_groups_are_exactly_zero():
    rewards = torch.tensor([[0.1] * 4, [1.1, 0.1, 0.1, 0.0], [0.0] * 4], dtype=torch.float64)
    for scale in ("group", "batch", "none"):
        adv = group_advantages(rewards, scale)
        assert torch.all(adv[[0, 2]] == 0) and torch.isfinite(adv).all()
        assert adv[1].sum().abs() < 1e-9 and adv[1, 0] > 0
    assert torch.allclose(group_advantages(rewards, "none")[1], torch.tensor([0.775, -0.225, -0.225, -0.325],
                                                                             dtype=torch.float64))
    assert group_advantages(rewards, "group")[1].std().item() == pytest.approx(1.0, abs=1e-3)


# On the model ---------------------------------------------------------------------------------

def test_zero_advantage_groups_give_zero_gradient(tiny_model_dir):
    algo = make_grpo(tiny_model_dir)
    r = sample(algo, prompts=2)
    rewards = torch.tensor([[1.0, 0.0, 0.1, 0.0], [0.1] * 4])  # the second group ties
    adv = group_advantages(rewards).flatten()
    assert torch.all(adv[4:] == 0)
    counts = dict(num_sequences=8, num_tokens=r.completion_mask.sum())

    def grad(index):
        algo.model.zero_grad()
        part = rows(r, index)
        grpo_loss(logps(algo.model, part), logps(algo.model, part).detach(), adv[index], part.completion_mask,
                  **counts)[0].backward()
        return [p.grad.clone() for p in algo.params]

    for whole, first_group in zip(grad(list(range(8))), grad(list(range(4)))):
        torch.testing.assert_close(whole, first_group, rtol=1e-5, atol=1e-8)
    assert all(g.abs().max() == 0 for g in grad(list(range(4, 8))))


def test_eos_is_trained_when_pad_is_eos(tiny_model_dir):
    algo = make_grpo(tiny_model_dir)
    algo.tokenizer.pad_token = algo.tokenizer.eos_token
    r = sample(algo)
    eos = r.completion_ids.eq(algo.tokenizer.eos_token_id) & r.completion_mask.bool()
    assert eos.sum(1).max() == 1 and eos.any(), "each finished row keeps exactly its first EOS in the mask"
    lp = logps(algo.model, r).detach().requires_grad_()
    grpo_loss(lp, lp.detach(), torch.ones(len(lp)), r.completion_mask)[0].backward()
    assert torch.all(lp.grad[eos] != 0)


@pytest.mark.parametrize("eightbit", [False, True])
def test_kl_is_zero_at_the_first_step(tiny_model_dir, eightbit):
    algo = make_grpo(tiny_model_dir, eightbit, beta=0.1, lora_rank=4 if eightbit else 0)
    problems = algo.task.train_problems(4, seed=0)
    first, second = algo.step(problems, 0), algo.step(problems, 1)
    assert first["kl"] == 0.0 and second["kl"] > 0
    expected = {"reward_mean", "reward_std", "accuracy", "malformed", "zero_std_groups", "entropy", "clip_low",
                "clip_high", "kl", "length_mean", "length_max", "truncated_rate", "loss", "grad_norm", "tokens"}
    solved = first.pop("groups_solved")  # per prompt: 1 when its group has a correct completion
    assert expected <= first.keys() and all(math.isfinite(v) for v in first.values())
    assert len(solved) == 4 and set(solved) <= {0, 1} and (sum(solved) > 0) == (first["accuracy"] > 0)
    assert first["tokens"] == pytest.approx(first["length_mean"] * 16)


def test_group_diversity_is_the_entropy_of_a_groups_outcomes_over_log2_g():
    """Paper A's diversity for a GRPO group: its G completions as members with one outcome each."""
    def score(correct, malformed=False, answer=None):
        return minies.tasks.answers.make_score(correct, malformed, answer=answer)
    alike = [score(True)] * 4  # four right answers: no diversity
    apart = [score(True), score(False, answer="3"), score(False, answer="4"), score(False, True)]  # four outcomes
    halves = [score(True), score(True), score(False, answer="7"), score(False, answer="7")]  # two, evenly
    got = minies.grpo.group_diversity(alike + apart + halves, 4)
    assert got.tolist() == pytest.approx([0.0, 1.0, 0.5])  # H = 0, log2(4), 1 bit; over log2(4) = 2 bits


def test_a_steps_group_diversity_reads_its_groups(tiny_model_dir, monkeypatch):
    """The logged group_diversity is the mean of group_diversity over the step's groups, as scored."""
    algo = make_grpo(tiny_model_dir)
    seen = []
    real = minies.grpo.group_diversity
    monkeypatch.setattr(minies.grpo, "group_diversity", lambda scores, g: seen.append(real(scores, g)) or seen[-1])
    log = algo.step(algo.task.train_problems(4, seed=0), 0)
    assert len(seen) == 1 and len(seen[0]) == 4 and 0 <= log["group_diversity"] <= 1
    assert log["group_diversity"] == pytest.approx(seen[0].mean().item())


@pytest.mark.parametrize("eightbit", [False, True])
def test_loss_decreases_on_a_fixed_batch(tiny_model_dir, eightbit):
    algo = make_grpo(tiny_model_dir, eightbit, lora_rank=4 if eightbit else 0, lr=1e-4 if eightbit else 1e-5)
    r = sample(algo)
    adv = torch.randn(len(r.texts), generator=torch.Generator().manual_seed(0))
    start = logps(algo.model, r).detach()

    def surrogate():  # the clipped objective against the policy the batch was sampled from
        with torch.no_grad():
            return grpo_loss(logps(algo.model, r), start, adv, r.completion_mask)[0].item()

    losses = [surrogate()]
    for _ in range(3):
        algo.update(r, adv)
        losses.append(surrogate())
    assert losses[0] == pytest.approx(-adv.mean().item(), abs=1e-5)  # ratio 1: the loss is -mean(A)
    assert all(b < a for a, b in zip(losses, losses[1:])), losses


def test_later_passes_on_a_batch_keep_pi_old(tiny_model_dir, monkeypatch):
    """With μ = 2 optimizer steps per batch, the second pass's π_old is, micro-batch by micro-batch, the
    first pass's own log-probs (the policy before the batch's first step), and the reference's are taken once."""
    algo = make_grpo(tiny_model_dir, updates_per_batch=2, micro_batch=4, beta=0.05, lr=1e-5)
    r = sample(algo)
    adv = torch.randn(len(r.texts), generator=torch.Generator().manual_seed(0))
    calls, references = [], []  # (logps, π_old's) of each grpo_loss call; one entry per reference pass

    def recording_loss(logps, old_logps, *args, **kwargs):
        calls.append((logps.detach().clone(), old_logps))
        return grpo_loss(logps, old_logps, *args, **kwargs)
    monkeypatch.setattr(minies.grpo, "grpo_loss", recording_loss)
    reference_logps = algo.reference_logps
    algo.reference_logps = lambda *args: references.append(1) or reference_logps(*args)
    log = algo.update(r, adv)
    first, second = calls[:len(calls) // 2], calls[len(calls) // 2:]
    assert len(first) == len(second) == 4 and len(references) == 1
    for (first_logps, old), (later_logps, later_old) in zip(first, second):
        assert torch.equal(old, first_logps) and torch.equal(later_old, first_logps)
        assert not torch.equal(later_logps, first_logps)  # the first step moved the policy
    assert {"entropy", "kl"} <= log.keys()


def test_gradient_checkpointing_gives_the_same_gradient(tiny_model_dir):
    plain, checkpointed = make_grpo(tiny_model_dir), make_grpo(tiny_model_dir, gradient_checkpointing=True)
    assert checkpointed.model.is_activation_checkpointing
    r = sample(plain)
    adv = torch.randn(len(r.texts), generator=torch.Generator().manual_seed(0))
    plain.update(r, adv)
    checkpointed.update(r, adv)
    # Rounding apart: the plain model runs each group's prompt once (rollout.shared_prompt_cache), the
    # checkpointed one, which keeps no cache, runs every row whole.
    for a, b in zip(plain.params, checkpointed.params):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7)


# The logits cap on every pass over completions --------------------------------------------------------

def rows_per_pass(model, generating):
    """The batch size of each forward pass of `model` over completions, in a list that fills as they run:
    every forward pass but generation's (while `generating` is not empty), which has its own micro-batch."""
    rows = []
    model.register_forward_pre_hook(lambda _, args, kwargs: None if generating else rows.append(len(kwargs["input_ids"])),
                                    with_kwargs=True)
    return rows


def flag_generation(monkeypatch, module):
    """Replace `module`'s generate by one that marks its calls in the list returned."""
    generating, real = [], module.generate

    def generate(*args, **kwargs):
        generating.append(True)
        try:
            return real(*args, **kwargs)
        finally:
            generating.pop()
    monkeypatch.setattr(module, "generate", generate)
    return generating


@pytest.mark.parametrize("name", ["grpo", "b3po", "m3po", "c3po"])
def test_every_pass_of_a_step_keeps_to_the_logits_cap(tiny_model_dir, monkeypatch, name):
    """With LOGITS_BYTES below one completion's logits, every pass over completions of a step (the policy's,
    the reference's, 3PO's behavior and fresh-sample passes) takes one row at a time, and the step's
    gradient and weights are, to rounding, those of passes over 8 rows."""
    config_class, algorithm_class = train.algorithms()[name]
    problems = DenseArithmetic(test_size=20).train_problems(2, seed=0)
    generating = flag_generation(monkeypatch, minies.grpo)

    def one_step():
        torch.manual_seed(0)
        algo = algorithm_class(load_model(tiny_model_dir, device="cpu"), load_tokenizer(tiny_model_dir),
                               DenseArithmetic(test_size=20), config_class(prompts=2, group_size=4, micro_batch=8,
                                                                           beta=0.05))
        rows = rows_per_pass(algo.model, generating)
        algo.step(problems, seed=0)
        # GRPO leaves its gradient in p.grad; IVON's first step keeps (1 − β1)·ĝ as its momentum.
        grads = [p.grad if name == "grpo" else algo.optimizer.state[p]["momentum"] for p in algo.params]
        return rows, grads, [p.detach() for p in algo.params]

    plain_rows, plain_grads, plain_weights = one_step()
    monkeypatch.setattr(minies.rollout, "LOGITS_BYTES", 1)
    capped_rows, capped_grads, capped_weights = one_step()
    assert max(plain_rows) > 1 and set(capped_rows) == {1}
    for a, b in zip(plain_grads, capped_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    for a, b in zip(plain_weights, capped_weights):
        torch.testing.assert_close(a, b)


def test_the_evaluation_keeps_to_the_logits_cap(tiny_model_dir, tokenizer, monkeypatch):
    """The evaluation's entropy pass too: one row at a time under the forced cap, the same metrics."""
    model = load_model(tiny_model_dir, device="cpu")
    rows = rows_per_pass(model, flag_generation(monkeypatch, minies.evaluate))
    task = Arithmetic(test_size=20)
    problems = task.test_problems()[:4]
    plain = minies.evaluate.evaluate(model, tokenizer, task, problems, n=4, ks=(1, 4), greedy=False, micro_batch=16)
    plain_rows = list(rows)
    monkeypatch.setattr(minies.rollout, "LOGITS_BYTES", 1)
    capped = minies.evaluate.evaluate(model, tokenizer, task, problems, n=4, ks=(1, 4), greedy=False, micro_batch=16)
    assert max(plain_rows) > 1 and set(rows[len(plain_rows):]) == {1}
    assert capped == pytest.approx(plain, rel=1e-5)


# bfloat16 weights, fp32 masters ---------------------------------------------------------------------------

def test_bfloat16_weights_are_the_rounding_of_fp32_masters_that_step_like_fp32_adamw(tiny_model_dir):
    """At lr 1e-6 AdamW steps fp32 masters of the bfloat16 weights: they move as an fp32 AdamW given the same
    gradients, and after each step the model holds exactly their rounding."""
    algo = make_grpo(tiny_model_dir, dtype="bfloat16", lr=1e-6)
    masters = algo.optimizer.masters
    assert all(p.dtype == torch.bfloat16 and m.dtype == torch.float32 for p, m in zip(algo.params, masters))
    reference = [m.detach().clone() for m in masters]
    adamw = torch.optim.AdamW(reference, lr=1e-6, weight_decay=0.0)
    given = []  # the gradients the masters' AdamW is given, at each step
    algo.optimizer.optimizer.register_step_pre_hook(lambda *_: given.append([m.grad.clone() for m in masters]))
    for step in range(5):
        algo.step(algo.task.train_problems(4, seed=step), step)
        for r, grad in zip(reference, given[-1]):
            r.grad = grad
        adamw.step()
        for p, master, r in zip(algo.params, masters, reference):
            torch.testing.assert_close(master, r, rtol=1e-6, atol=1e-9)
            assert torch.equal(p, master.to(torch.bfloat16))


def marking_nonzero(seen):
    """A gradient hook that marks in `seen` the elements whose gradient is not zero."""
    def hook(grad):
        seen.logical_or_(grad != 0)
    return hook


def test_small_steps_add_up_in_bfloat16(tiny_model_dir):
    """Five steps at lr 1e-6 move the trained values (what the optimizer steps) of nearly every bfloat16 weight
    that had a gradient; AdamW on the bfloat16 weights themselves moves 1.5% of them and rounds the rest away."""
    algo = make_grpo(tiny_model_dir, dtype="bfloat16", lr=1e-6)
    trained = [t for group in algo.optimizer.param_groups for t in group["params"]]
    start = [t.detach().clone() for t in trained]
    had_gradient = [torch.zeros_like(p, dtype=torch.bool) for p in algo.params]
    for p, seen in zip(algo.params, had_gradient):
        p.register_hook(marking_nonzero(seen))
    for step in range(5):
        algo.step(algo.task.train_problems(4, seed=step), step)
    moved = sum(int((t != s)[seen].sum()) for t, s, seen in zip(trained, start, had_gradient))
    assert moved / sum(int(seen.sum()) for seen in had_gradient) > 0.99


@pytest.mark.parametrize("eightbit,optim,dtype", [(False, "adamw", "float32"), (True, "adamw8bit", "float32"),
                                                 (False, "adamw", "bfloat16"), (False, "adamw8bit", "bfloat16")])
def test_resume_is_exact(tiny_model_dir, eightbit, optim, dtype):
    kwargs = dict(lora_rank=4 if eightbit else 0, optim=optim, beta=0.05, dtype=dtype)
    problems = [Arithmetic(test_size=20).train_problems(4, seed=s) for s in range(3)]
    straight = make_grpo(tiny_model_dir, eightbit, **kwargs)
    for s in range(3):
        straight.step(problems[s], s)
    first = make_grpo(tiny_model_dir, eightbit, **kwargs)
    for s in range(2):
        first.step(problems[s], s)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = make_grpo(tiny_model_dir, eightbit, **kwargs)  # from the base model, as train.py does
    resumed.load_state_dict(torch.load(buffer, weights_only=False))
    resumed.step(problems[2], 2)
    a, b = trainable(straight), trainable(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert all(torch.equal(x, y) for x, y in zip(straight.optimizer.masters, resumed.optimizer.masters))
    if eightbit:
        assert all("lora_" in k for k in a)  # only the adapters are trained and kept


# Two processes --------------------------------------------------------------------------------

def _worker(rank, model_dir, tmp, batch):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=2)
    algo = make_grpo(model_dir)
    mine = [i for i in range(len(batch["advantages"])) if (i // algo.config.group_size) % 2 == rank]
    algo.update(rows(batch["rollouts"], mine), batch["advantages"][mine])
    grads = {n: p.grad.clone() for n, p in algo.model.named_parameters()}
    for s in range(2):
        algo.step(algo.task.train_problems(4, seed=s), s)
    torch.save({"grads": grads, "weights": trainable(algo)}, f"{tmp}/rank{rank}.pt")
    dist.destroy_process_group()


def test_two_processes_equal_one(tiny_model_dir, tmp_path):
    one = make_grpo(tiny_model_dir)
    r = sample(one)
    adv = torch.randn(len(r.texts), generator=torch.Generator().manual_seed(0))
    # fork, not spawn: the children inherit the imported modules, which saves most of the test's time.
    mp.start_processes(_worker, args=(tiny_model_dir, str(tmp_path), {"rollouts": r, "advantages": adv}), nprocs=2,
                       start_method="fork")
    one.update(r, adv)
    ranks = [torch.load(tmp_path / f"rank{k}.pt") for k in range(2)]
    for name, p in one.model.named_parameters():
        torch.testing.assert_close(ranks[0]["grads"][name], p.grad, rtol=1e-4, atol=1e-7)
    for name in ranks[0]["weights"]:
        assert torch.equal(ranks[0]["weights"][name], ranks[1]["weights"][name]), name
    assert any(not torch.equal(ranks[0]["weights"][n], w) for n, w in trainable(make_grpo(tiny_model_dir)).items())
