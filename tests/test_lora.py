"""LoRA on an int8 (or float) base: the base is untouched with the adapters off, and the merged
checkpoint loads as an ordinary float model that computes what the adapted model computes."""
import pytest
import torch

from conftest import DenseArithmetic
from minies import UserError, lora
from minies.grpo import GRPO, GRPOConfig
from minies.models import load_model, load_tokenizer
from minies.tasks import Arithmetic

pytestmark = pytest.mark.usefixtures("one_thread")  # from conftest.py


def trained_grpo(model_dir, load_in_8bit):
    """A GRPO with adapters after two steps, and the base model's logits on a fixed input."""
    torch.manual_seed(0)
    model = load_model(model_dir, load_in_8bit=load_in_8bit, device="cpu")
    ids = torch.tensor([[5, 20, 30, 40, 50, 60, 70]])
    with torch.no_grad():
        base = model(ids).logits
    cfg = GRPOConfig(prompts=4, group_size=4, lora_rank=4, lr=1e-2)
    algo = GRPO(model, load_tokenizer(model_dir), DenseArithmetic(test_size=20), cfg)
    for s in range(2):
        algo.step(algo.task.train_problems(4, seed=s), s)
    return algo, ids, base


def test_only_adapters_train_and_start_at_the_base(tiny_model_dir):
    model = load_model(tiny_model_dir, load_in_8bit=True, device="cpu")
    ids = torch.tensor([[5, 20, 30, 40]])
    with torch.no_grad():
        base = model(ids).logits
        lora.add_adapters(model, 4, 8.0, ["q_proj", "down_proj"])
        assert torch.equal(model(ids).logits, base)  # B = 0
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    layers = model.config.num_hidden_layers
    assert len(names) == 4 * layers and all(n.endswith(("lora_A", "lora_B")) for n in names)
    with pytest.raises(UserError):
        lora.add_adapters(model, 4, 8.0, ["no_such_layer"])


def test_8bit_needs_adapters(tiny_model_dir):
    model = load_model(tiny_model_dir, load_in_8bit=True, device="cpu")
    with pytest.raises(UserError, match="lora-rank"):
        GRPO(model, load_tokenizer(tiny_model_dir), Arithmetic(test_size=20), GRPOConfig())


def test_adapters_off_reproduce_the_base_exactly(tiny_model_dir):
    algo, ids, base = trained_grpo(tiny_model_dir, load_in_8bit=True)
    with torch.no_grad():
        adapted = algo.model(ids).logits
        with lora.adapters_disabled(algo.model):
            off = algo.model(ids).logits
        assert torch.equal(off, base)
        assert (adapted - base).abs().max() > 0.05
        assert torch.equal(algo.model(ids).logits, adapted)  # and back on after the block


@pytest.mark.parametrize("load_in_8bit", [True, False])
def test_merged_checkpoint_reloads_and_matches(tiny_model_dir, tmp_path, load_in_8bit):
    algo, ids, base = trained_grpo(tiny_model_dir, load_in_8bit)
    algo.model_to_save().save_pretrained(tmp_path)
    reloaded = load_model(str(tmp_path), device="cpu")
    assert type(reloaded.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    assert getattr(reloaded.config, "quantization_config", None) is None
    with torch.no_grad():
        merged, adapted = reloaded(ids).logits, algo.model(ids).logits
        # On the CPU, bitsandbytes in train mode multiplies by the dequantized weight in float, which
        # is what merging computes; in eval mode it also quantizes the activations, so only close.
        exact = algo.model.train()(ids).logits
    assert (adapted - base).abs().max() > 0.1
    torch.testing.assert_close(merged, exact, rtol=1e-4, atol=1e-4)
    assert (merged - adapted).abs().max() < 0.02 * adapted.abs().max()
    # The adapters alone travel in the training state.
    assert {k.rsplit(".", 1)[1] for k in algo.state_dict()["weights"]} == {"lora_A", "lora_B"}


def test_dequantized_weight_before_and_after_the_first_forward(tiny_model_dir):
    model = load_model(tiny_model_dir, load_in_8bit=True, device="cpu")
    layer = model.model.layers[0].mlp.up_proj
    before = lora.dequantized_weight(layer)
    model(torch.tensor([[5, 6, 7]]))  # moves the row scales from weight.SCB to layer.state.SCB
    assert layer.weight.SCB is None
    assert torch.equal(lora.dequantized_weight(layer), before)
    reference = load_model(tiny_model_dir, device="cpu").model.layers[0].mlp.up_proj.weight
    assert (before - reference).abs().max() <= reference.abs().amax(1).max() / 127
