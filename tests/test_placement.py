"""Where ES works: the mode `auto` picks from the batch shape, and where the fp32 masters live."""
import json

import pytest
import torch

from conftest import needs_cuda, run_in_process
from minies import UserError
from minies.eggroll import LowRankPopulation
from minies.es import ES, ESConfig, member_seeds
from minies.models import load_model, load_tokenizer
from minies.runtime.placement import choose_mode, master_device
from minies.tasks import Arithmetic
from test_es import fake_rollout

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


@pytest.mark.parametrize("prompts,population,micro_batch,mode", [
    (256, 32, 1024, "lowrank"),  # the default step: 4 members per generate call
    (16, 32, 1024, "lowrank"),
    (1024, 32, 1024, "inplace"),  # one member per generate call
    (16, 32, 16, "inplace"),
    (16, 1, 1024, "inplace"),  # one member on this process
])
def test_choose_mode(prompts, population, micro_batch, mode):
    assert choose_mode(prompts, population, micro_batch) == mode


def test_master_device():
    for choice in ("auto", "cpu"):
        assert master_device(choice, CPU, 10**9) == CPU
    with pytest.raises(UserError, match="--master-device cuda"):
        master_device("cuda", CPU, 10)
    assert master_device("auto", CUDA, 10, free_bytes=4 * 10 * 4 + 1) == CUDA  # 4 bytes each, under a quarter
    assert master_device("auto", CUDA, 10, free_bytes=4 * 10 * 4) == CPU
    assert master_device("cpu", CUDA, 10, free_bytes=10**12) == CPU
    assert master_device("cuda", CUDA, 10**12, free_bytes=0) == CUDA


def test_masters_go_where_every_rank_has_room(monkeypatch):
    """Under torchrun auto decides from the smallest free memory of any rank: all ranks choose alike."""
    from minies.runtime import distributed
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (10**9, 2 * 10**9))  # this rank: room
    monkeypatch.setattr(distributed, "all_gather_objects", lambda free: [free, free])
    assert master_device("auto", CUDA, 10**7) == CUDA
    monkeypatch.setattr(distributed, "all_gather_objects", lambda free: [free, 10**7])  # another rank: none
    assert master_device("auto", CUDA, 10**7) == CPU


def make_es(model_dir, device="cpu", **overrides):
    model = load_model(model_dir, device=device)
    cfg = ESConfig(**{"population": 4, "prompts_per_step": 8, **overrides})
    return ES(model, load_tokenizer(model_dir), Arithmetic(test_size=50), cfg)


def test_es_records_the_resolved_mode_and_master_device(tiny_model_dir):
    assert ESConfig().mode == "auto"
    for mode, resolved in (("auto", "lowrank"), ("inplace", "inplace")):
        es = make_es(tiny_model_dir, mode=mode)
        lowrank = isinstance(es.lowrank, LowRankPopulation)
        assert (es.resolved["mode"], es.resolved["master_device"]) == (resolved, "cpu")
        assert lowrank == (resolved == "lowrank")
        assert es.config.mode == mode  # what was asked: the config is not written into
        assert all(t.master.device == CPU and not t.master.is_pinned() for t in es.tensors)


def test_auto_stays_in_place_when_params_names_no_weight_matrix(tiny_model_dir):
    es = make_es(tiny_model_dir, params="norm")  # lowrank, had it anything to perturb
    assert es.resolved["mode"] == "inplace" and es.tensors and all("norm" in t.name for t in es.tensors)
    with pytest.raises(UserError, match="lowrank mode perturbs"):
        make_es(tiny_model_dir, params="norm", mode="lowrank")


def test_config_json_records_the_mode_that_ran(tmp_path, model_dir, capsys):
    # --mode auto in place of the shipped model's own `inplace` (tests/test_recipes.py)
    code, message = run_in_process("train.py", "--model", model_dir, "--mode", "auto", "--steps", 1, "--population", 2,
                                   "--prompts-per-step", 2, "--eval-problems", 2, "--final-samples", 1,
                                   "--eval-every", 0, "--out", tmp_path)
    assert code == 0, capsys.readouterr().err + message
    config = json.loads((tmp_path / "es-arithmetic-seed0" / "config.json").read_text())
    assert (config["es"]["mode"], config["es"]["master_device"]) == ("lowrank", "cpu")


@needs_cuda
def test_masters_on_cuda_restore_and_update_like_pinned_host_masters(tiny_model_dir):
    runs = {}
    for where in ("cuda", "cpu"):
        es = make_es(tiny_model_dir, device="cuda", master_device=where)
        assert all(t.master.device.type == where for t in es.tensors)
        assert where == "cuda" or all(t.master.is_pinned() for t in es.tensors)
        before = [t.param.detach().clone() for t in es.tensors]
        for seed, sign in member_seeds(5, 10, antithetic=True):
            for t in es.tensors:
                t.write_perturbed(seed, sign, sigma=0.01)
            for t in es.tensors:
                t.write_clean()
        assert all(torch.equal(b, t.param) for b, t in zip(before, es.tensors))
        es.rollout = fake_rollout([0.0, 1.0, 3.0, 2.0])
        log = es.step(Arithmetic(test_size=50).train_problems(8, seed=0), seed=11)
        state = es.state_dict()
        assert all(m.device == CPU for m in state["master"] + state["theta0"])
        runs[where] = (log["drift"], state["master"], [t.param.detach().cpu() for t in es.tensors])
    (drift_a, masters_a, params_a), (drift_b, masters_b, params_b) = runs.values()
    assert drift_a == drift_b and drift_a > 0
    assert all(torch.equal(a, b) for a, b in zip(masters_a + params_a, masters_b + params_b))


@pytest.mark.parametrize("mode, says", [("auto", True), ("lowrank", False), ("inplace", False)])
def test_auto_says_at_start_when_it_runs_lowrank(mode, says, tmp_path, model_dir, capsys):
    """Lowrank is another estimator than in-place ES: --mode auto never switches to it in silence."""
    code, _ = run_in_process("train.py", "--model", model_dir, "--out", tmp_path, "--steps", 1, "--population", 4,
                             "--prompts-per-step", 2, "--eval-problems", 2, "--final-samples", 1, "--mode", mode)
    err = capsys.readouterr().err
    assert code == 0, err[-2000:]
    assert ("note: --mode auto runs lowrank: each member's noise is rank 1 (EGGROLL)" in err) == says
