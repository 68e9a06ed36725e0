"""minies.analysis against hand-computed values: outcome labels, JS diversity, pass@k curves, drift,
sparsification, zero-advantage rescue and rank correlation."""
import math
from pathlib import Path

import pytest
import torch

from minies.analysis import (answer_outcome, drift, js_diversity, layer_type, pass_at_k_curve, rank_correlation,
                             rescue_counts, sparsified)
from minies.tasks import GSM8K, Arithmetic, Countdown, Problem, SolvedProblem

GSM8K_FILE = Path(__file__).parent / "data" / "gsm8k_test.jsonl"


def outcome(task, completion, problem):
    return answer_outcome(task.score(completion, problem))


@pytest.mark.parametrize("completion, expected", [
    ("<answer>105</answer>", "correct"),
    ("<answer>104</answer>", "104"),
    ("<answer>7</answer> then <answer> 104 </answer>", "104"),  # the last tag, stripped, as the verifier reads it
    ("<answer>105", "malformed"),
    ("<answer>ten</answer>", "malformed"),
    ("", "malformed"),
])
def test_answer_outcome_arithmetic(completion, expected):
    assert outcome(Arithmetic(test_size=1), completion, Problem("12+93", "105")) == expected


def test_answer_outcome_countdown():
    task = Countdown(test_size=1)
    problem = task.make_problem([3, 7, 12], 33, "3*7+12")
    assert outcome(task, "<answer>12+3*7</answer>", problem) == "correct"
    assert outcome(task, "<answer>3+7+12</answer>", problem) == "3+7+12"
    assert outcome(task, "<answer>3+</answer>", problem) == "malformed"


def test_answer_outcome_gsm8k_reads_where_its_verifier_reads():
    task, problem = GSM8K(data=GSM8K_FILE, test_size=1, lenient=True), SolvedProblem("q", "18", "... #### 18")
    assert outcome(task, "so <answer>18</answer>", problem) == "correct"
    assert outcome(task, "so <answer>17</answer>", problem) == "17"
    assert outcome(task, "it is \\boxed{1,700} dollars", problem) == "1,700"  # no tag: the last \boxed{}
    assert outcome(task, "3 eggs, then 16-3-4=9 left", problem) == "9"  # no tag, no box: the last number
    assert outcome(task, "no idea", problem) == "malformed"
    strict = GSM8K(data=GSM8K_FILE, test_size=1)  # training's reading: no tag and no box is no answer
    assert outcome(strict, "3 eggs, then 16-3-4=9 left", problem) == "malformed"


def test_js_diversity_of_identical_members_is_zero():
    member = [["correct", "12", "correct"], ["malformed"]]
    assert js_diversity([member, member, member]) == 0.0


@pytest.mark.parametrize("members", [2, 3, 4, 7])
def test_js_diversity_of_pairwise_distinct_one_hot_members_is_one(members):
    outcomes = [[[f"answer {n}"], ["correct" if n == 0 else f"wrong {n}"]] for n in range(members)]
    assert js_diversity(outcomes) == pytest.approx(1.0, abs=1e-12)


def test_js_diversity_mixed_case_by_hand():
    # Prompt 0: p_A = {correct: 1}, p_B = {correct: 1/2, malformed: 1/2}; mixture {3/4, 1/4}.
    # JS = H(3/4, 1/4) - (0 + 1)/2 = 0.811278... - 0.5, over log2(2) = 1. Prompt 1: both "7", JS = 0.
    # Member B has 2 samples, member A 1 (with a repeat it would be the same distribution).
    a = [["correct", "correct"], ["7"]]
    b = [["correct", "malformed"], ["7", "7", "7"]]
    h_mixture = -(0.75 * math.log2(0.75) + 0.25 * math.log2(0.25))
    assert js_diversity([a, b]) == pytest.approx((h_mixture - 0.5) / 2, abs=1e-12)


def test_js_diversity_three_members_by_hand():
    # One prompt, greedy outcomes x, x, y: mixture {2/3, 1/3}, every member one-hot, so JS = H(2/3, 1/3),
    # normalized by log2(3).
    expected = -(2 / 3 * math.log2(2 / 3) + 1 / 3 * math.log2(1 / 3)) / math.log2(3)
    assert js_diversity([[["x"]], [["x"]], [["y"]]]) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("members", [2, 5, 32])
def test_js_diversity_of_greedy_outcomes_equals_the_general_formula(members):
    """One label per member and prompt (greedy ES) takes a shortcut, H(p_n) = 0; the same labels given twice
    each go through the general formula and must agree."""
    rng = torch.Generator().manual_seed(members)
    labels = torch.randint(0, 4, (members, 50), generator=rng).tolist()
    greedy = [[[str(x)] for x in row] for row in labels]
    doubled = [[[str(x), str(x)] for x in row] for row in labels]
    assert js_diversity(greedy) == pytest.approx(js_diversity(doubled), abs=1e-12)
    assert 0 < js_diversity(greedy) < 1


def test_js_diversity_rejects_what_it_cannot_measure():
    with pytest.raises(ValueError, match="at least 2 members"):
        js_diversity([[["x"]]])
    with pytest.raises(ValueError, match="same"):
        js_diversity([[["x"]], [["x"], ["y"]]])
    with pytest.raises(ValueError, match="at least one outcome"):
        js_diversity([[["x"]], [[]]])


def test_pass_at_k_curve():
    # Two problems with 1 and 4 correct out of 4: pass@1 = (1/4 + 1)/2, pass@2 = (1/2 + 1)/2, pass@4 = 1.
    assert pass_at_k_curve([1, 4], 4) == pytest.approx({1: 0.625, 2: 0.75, 4: 1.0})
    assert list(pass_at_k_curve([3], 32)) == [1, 2, 4, 8, 16, 32]
    assert list(pass_at_k_curve([3], 5)) == [1, 2, 4]
    assert pass_at_k_curve([0, 2], 3, ks=(1, 3, 8)) == pytest.approx({1: 1 / 3, 3: 0.5})


@pytest.mark.parametrize("name, kind", [
    ("model.embed_tokens.weight", "embedding"),
    ("lm_head.weight", "embedding"),
    ("model.layers.0.self_attn.q_proj.weight", "attention"),
    ("model.layers.3.self_attn.o_proj.bias", "attention"),
    ("model.layers.0.self_attn.q_norm.weight", "norm"),
    ("model.layers.1.mlp.down_proj.weight", "mlp"),
    ("model.layers.0.input_layernorm.weight", "norm"),
    ("model.layers.0.post_attention_layernorm.weight", "norm"),
    ("model.norm.weight", "norm"),
    ("score.weight", "other"),
])
def test_layer_type(name, kind):
    assert layer_type(name) == kind


def test_layer_types_of_the_shipped_architecture(model):
    kinds = {layer_type(name) for name, _ in model.named_parameters()}
    assert kinds == {"embedding", "attention", "mlp", "norm"}


def test_drift_by_hand():
    theta0 = {"model.embed_tokens.weight": torch.zeros(2, 2), "model.layers.0.mlp.up_proj.weight": torch.ones(3),
              "model.norm.weight": torch.ones(2)}
    theta = {"model.embed_tokens.weight": torch.tensor([[3.0, 0.0], [0.0, 4.0]]),
             "model.layers.0.mlp.up_proj.weight": torch.tensor([1.0, 3.0, 1.0]), "model.norm.weight": torch.ones(2)}
    d = drift(theta0, theta)
    assert d == pytest.approx({"total": math.sqrt(25 + 4), "embedding": 5.0, "attention": 0.0, "mlp": 2.0,
                               "norm": 0.0, "other": 0.0})
    with pytest.raises(ValueError, match="differ in names"):
        drift(theta0, {"model.norm.weight": torch.ones(2)})


def test_sparsified_keeps_the_largest_updates_globally():
    theta0 = {"b": torch.zeros(2, 2), "a": torch.zeros(3)}
    theta = {"b": torch.tensor([[0.1, -5.0], [0.2, 0.0]]), "a": torch.tensor([3.0, -0.3, 0.05])}
    # |Δ| over 7 entries: 5.0 (b), 3.0 (a), 0.3 (a), 0.2 (b), 0.1 (b), 0.05 (a), 0.0 (b).
    two = sparsified(theta0, theta, 2 / 7)
    assert torch.equal(two["a"], torch.tensor([3.0, 0.0, 0.0]))
    assert torch.equal(two["b"], torch.tensor([[0.0, -5.0], [0.0, 0.0]]))
    four = sparsified(theta0, theta, 0.5)  # round(3.5) = 4 entries
    assert torch.equal(four["a"], torch.tensor([3.0, -0.3, 0.0]))
    assert torch.equal(four["b"], torch.tensor([[0.0, -5.0], [0.2, 0.0]]))


def test_sparsified_ends_are_exact_and_leave_the_inputs_alone():
    torch.manual_seed(0)
    theta0 = {"w": torch.randn(5, 3), "v": torch.randn(4).to(torch.bfloat16)}
    theta = {k: v + 0.01 * torch.randn(v.shape).to(v.dtype) for k, v in theta0.items()}
    copies = {k: v.clone() for k, v in theta.items()}
    for name in theta:
        assert torch.equal(sparsified(theta0, theta, 1.0)[name], theta[name])
        assert torch.equal(sparsified(theta0, theta, 0.0)[name], theta0[name])
        assert sparsified(theta0, theta, 0.3)[name].dtype == theta[name].dtype
        assert torch.equal(theta[name], copies[name])


def test_sparsified_breaks_ties_by_name_then_position():
    # Four equal updates, keep 2: the first two in sorted name order ("a" before "b"), row-major.
    theta0 = {"b": torch.zeros(2), "a": torch.zeros(2)}
    theta = {"b": torch.ones(2), "a": torch.ones(2)}
    kept = sparsified(theta0, theta, 0.5)
    assert torch.equal(kept["a"], torch.ones(2)) and torch.equal(kept["b"], torch.zeros(2))
    # Same result when the dicts list their names in the other order.
    flipped = sparsified(dict(reversed(theta0.items())), dict(reversed(theta.items())), 0.5)
    assert all(torch.equal(flipped[k], kept[k]) for k in kept)
    with pytest.raises(ValueError, match="keep_fraction"):
        sparsified(theta0, theta, 1.5)


def test_rescue_counts():
    method = [1, 1, 0, 0, 1, True]
    baseline = [0, 1, 1, 0, 0, False]
    assert rescue_counts(method, baseline) == (3, 1)
    assert rescue_counts([], []) == (0, 0)
    with pytest.raises(ValueError, match="pair"):
        rescue_counts([1], [1, 0])


def test_rank_correlation_by_hand():
    assert rank_correlation([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert rank_correlation([1, 2, 3, 4], [0.4, 0.3, 0.2, 0.1]) == pytest.approx(-1.0)
    # Ranks (0, 1, 2) against (0, 2, 1): centered (-1, 0, 1) and (-1, 1, 0), covariance 1 over variance 2.
    assert rank_correlation([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    # Only ranks count: a monotone transform changes nothing.
    assert rank_correlation([1, 2, 3], [1, 1000, 2]) == pytest.approx(0.5)
    # Ties share their mean rank: (0.5, 0.5, 2) against (0, 1, 2) gives 1.5 / sqrt(1.5 * 2).
    assert rank_correlation([1, 1, 2], [1, 2, 3]) == pytest.approx(1.5 / math.sqrt(3.0))
    assert rank_correlation([1, 1, 1], [1, 2, 3]) is None and rank_correlation([1], [2]) is None
    with pytest.raises(ValueError, match="correlate"):
        rank_correlation([1, 2], [1, 2, 3])
