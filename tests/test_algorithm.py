"""Every algorithm train.py offers provides what minies/algorithm.py says train.py needs, and takes a
step on CUDA when there is one."""
import math

import pytest

import train
from conftest import needs_cuda
from minies.algorithm import Algorithm
from minies.models import load_model, load_tokenizer
from minies.tasks import Arithmetic

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("name", sorted(train.algorithms()))
def test_algorithm_contract(tiny_model_dir, name):
    config_class, algorithm_class = train.algorithms()[name]
    algo = algorithm_class(load_model(tiny_model_dir, device="cpu"), load_tokenizer(tiny_model_dir),
                           Arithmetic(test_size=20), config_class())
    assert isinstance(algo, Algorithm)
    assert isinstance(algo.default_steps, int) and isinstance(algo.prompts_per_step, int)


# A small step of each algorithm and ES mode: what matters is that every tensor meets the right device.
SMALL_STEPS = [("es", {"mode": "inplace", "population": 4, "prompts_per_step": 8}),
               ("es", {"mode": "lowrank", "population": 4, "prompts_per_step": 8}),
               *[(name, {"prompts": 4, "group_size": 4}) for name in ("grpo", "b3po", "m3po", "c3po")]]


@needs_cuda
@pytest.mark.parametrize("name,options", SMALL_STEPS)
def test_a_step_on_cuda(tiny_model_dir, name, options):
    """Rollouts stay on the device, rewards and logs on the host: a step must move each where it is used."""
    config_class, algorithm_class = train.algorithms()[name]
    task = Arithmetic(test_size=20)
    algo = algorithm_class(load_model(tiny_model_dir, device="cuda"), load_tokenizer(tiny_model_dir), task,
                           config_class(**options))
    log = algo.step(task.train_problems(algo.prompts_per_step, seed=0), seed=0)
    assert log["tokens"] > 0 and math.isfinite(log["reward_mean"])
