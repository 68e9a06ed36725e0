"""Five steps of every algorithm and ES mode on the shipped model, pinned: the rewards each step logs and a
checksum of the trained weights. A refactor must leave them unchanged; a change that means to alter an
algorithm's results updates the numbers here in the same commit, and says why."""
import math

import pytest
import torch

import train
from conftest import tuned
from minies.models import load_model, load_tokenizer
from minies.recipes import RECIPES
from minies.tasks import Arithmetic

pytestmark = pytest.mark.usefixtures("one_thread")

TINY_PARAMS = RECIPES["tiny"].settings("es")["params"]  # what train.py's ES perturbs on the shipped model
RUNS = {
    "es-inplace": ("es", {"mode": "inplace", "population": 8, "prompts_per_step": 16, "params": TINY_PARAMS}),
    "es-lowrank": ("es", {"mode": "lowrank", "population": 8, "prompts_per_step": 16, "params": TINY_PARAMS}),
    "grpo": ("grpo", {"prompts": 4, "group_size": 4}),
    "grpo-lora": ("grpo", {"prompts": 4, "group_size": 4, "lora_rank": 4}),
    "b3po": ("b3po", {"prompts": 4, "group_size": 4}),
    "m3po": ("m3po", {"prompts": 4, "group_size": 4}),
    "c3po": ("c3po", {"prompts": 4, "group_size": 4}),
}

# reward_mean of steps 1..5, then how far the weights moved: Σ|θ − θ0| over the model's weights after step 5.
PINNED = {
    "b3po": ([0.5375000000000001, 0.4750000000000001, 0.28750000000000003, 0.2875000000000001, 0.4125000000000001], 149.06438573255468),
    "c3po": ([0.6000000000000001, 0.28750000000000003, 0.34375000000000006, 0.1625, 0.6000000000000001], 155.91629705259277),
    "es-inplace": ([0.4906250000000001, 0.4593750000000001, 0.5445312500000001, 0.3578125000000001, 0.4828125000000001], 530.1112534419553),
    "es-lowrank": ([0.5062500000000001, 0.4593750000000001, 0.5835937500000001, 0.38593750000000004, 0.4671875000000001], 636.6383825778312),
    "grpo": ([0.5375000000000001, 0.4750000000000001, 0.28750000000000003, 0.2875000000000001, 0.5375000000000001], 232.32478463608368),
    "grpo-lora": ([0.5375000000000001, 0.4750000000000001, 0.28750000000000003, 0.22500000000000003, 0.3500000000000001], 76.26326522848376),
    "m3po": ([0.5375000000000001, 0.4125000000000001, 0.28750000000000003, 0.19375000000000003, 0.5687500000000001], 141.77660552729344),
}


def five_steps(model_dir, name):
    algo_name, options = RUNS[name]
    config_class, algorithm_class = train.algorithms()[algo_name]
    torch.manual_seed(0)
    task = Arithmetic(test_size=20)
    model = load_model(model_dir, device="cpu")
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    algo = algorithm_class(model, load_tokenizer(model_dir), task, tuned(config_class, algo_name, **options))
    rewards = []
    for step in range(5):
        log = algo.step(task.train_problems(algo.prompts_per_step, seed=step), seed=step)
        rewards.append(log["reward_mean"])
    trained = dict(algo.model_to_save().named_parameters())
    moved = sum(float((trained[name].detach() - p).abs().double().sum()) for name, p in start.items())
    return rewards, moved


@pytest.mark.parametrize("name", sorted(RUNS))
def test_five_steps_are_pinned(tiny_model_dir, name):
    rewards, moved = five_steps(tiny_model_dir, name)
    expected_rewards, expected_moved = PINNED[name]
    assert rewards == pytest.approx(expected_rewards, abs=1e-9), rewards
    assert math.isclose(moved, expected_moved, rel_tol=1e-6), moved
