"""Every algorithm train.py offers provides what minies/algorithm.py says train.py needs."""
import pytest

import train
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
    assert isinstance(algo.resume_from_base, bool)
