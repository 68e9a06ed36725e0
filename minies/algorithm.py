"""What train.py needs from a training algorithm, written down once.

ES (minies/es.py), GRPO (minies/grpo.py) and the 3PO variants (minies/threepo.py) all have this shape;
train.py builds one as `Algorithm(model, tokenizer, task, config, chat_template=...)` and then only
calls what is listed here. Nothing inherits from it: it is a contract, checked in tests/test_algorithm.py.
"""
from typing import Protocol, runtime_checkable


@runtime_checkable
class Algorithm(Protocol):
    default_steps: int
    """Training steps when --steps is not given, sized for the shipped model."""

    prompts_per_step: int
    """How many problems train.py draws for each step (the same list on every process)."""

    resolved: dict
    """The values the algorithm chose for settings left to it (ES: the mode --mode auto runs, the place of
    --master-device auto), by setting name: train.py records them in config.json and checks them on --resume.
    Returned here, not written into the config: the config holds what was asked."""


    def step(self, problems, seed) -> dict:
        """One training step on `problems`; `seed` is a function of (run seed, step) only, so the step
        is the same on every process and after --resume. Returns the step's log row (numbers, or lists
        of numbers), with a "tokens" key: the completion tokens generated for training in this step."""

    def state_dict(self) -> dict:
        """Everything --resume needs to continue bit for bit: it reloads the start model (--model) and hands this
        to load_state_dict, so the trained weights are in it (the model a checkpoint holds is for eval.py)."""

    def load_state_dict(self, state: dict) -> None:
        """Restore state_dict()'s output, into an algorithm built on the model --resume loaded."""

    def model_to_save(self):
        """The model a checkpoint holds (a plain transformers model that eval.py can load)."""
