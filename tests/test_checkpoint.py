"""Checkpoints: save and reload, survival of a crash at any point of a save, keep-N pruning, RNG state."""
import os
import random

import numpy as np
import pytest
import torch

from minies import UserError
from minies.runtime import checkpoint
from minies.models import load_model

pytestmark = pytest.mark.usefixtures("one_thread")


class Crash(Exception):
    pass


def _entries(run_dir):
    return sorted(os.listdir(run_dir))


def _same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_save_and_reload(tmp_path, model, tokenizer):
    assert checkpoint.latest(tmp_path) is None
    path = checkpoint.save(str(tmp_path), 7, model, tokenizer, {"algorithm": {"x": torch.arange(3)}, "tokens": 5})
    assert os.path.basename(path) == "step-000007"
    assert checkpoint.latest(str(tmp_path)) == path
    assert (tmp_path / "latest").read_text().strip() == "step-000007"
    state = checkpoint.load_state(path)
    assert state["step"] == 7 and state["tokens"] == 5
    assert torch.equal(state["algorithm"]["x"], torch.arange(3))
    assert _same_weights(load_model(path, device="cpu"), model)
    assert not [e for e in _entries(tmp_path) if e.endswith(".tmp")]


def _crash_in_torch_save(monkeypatch, model):
    def crash(obj, f, *args, **kwargs):
        with open(f, "wb") as fh:
            fh.write(b"half a state file")
        raise Crash("killed while writing the training state")
    monkeypatch.setattr(torch, "save", crash)


def _crash_in_save_pretrained(monkeypatch, model):
    original = model.save_pretrained

    def crash(directory, *args, **kwargs):
        original(directory, *args, **kwargs)
        with open(os.path.join(directory, "model.safetensors"), "r+b") as fh:
            fh.truncate(100)  # a weights file cut short
        raise Crash("killed while writing the weights")
    monkeypatch.setattr(model, "save_pretrained", crash)


def _crash_before_latest(monkeypatch, model):
    def crash(path, text):
        raise Crash("killed after the rename, before `latest` names the new checkpoint")
    monkeypatch.setattr(checkpoint, "_write_text_atomic", crash)


@pytest.mark.parametrize("crash", [_crash_in_torch_save, _crash_in_save_pretrained, _crash_before_latest])
def test_a_crash_during_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch, model, tokenizer, crash):
    run = str(tmp_path)
    first = checkpoint.save(run, 1, model, tokenizer, {"tokens": 1})
    with monkeypatch.context() as m:
        crash(m, model)
        with pytest.raises(Crash):
            checkpoint.save(run, 2, model, tokenizer, {"tokens": 2})
    # `latest` still names the complete step-1 checkpoint, which loads.
    assert checkpoint.latest(run) == first
    assert checkpoint.load_state(first)["tokens"] == 1
    assert _same_weights(load_model(first, device="cpu"), model)
    # The next save works and cleans up whatever the crash left behind.
    second = checkpoint.save(run, 2, model, tokenizer, {"tokens": 2})
    assert checkpoint.latest(run) == second
    assert checkpoint.load_state(second)["tokens"] == 2
    assert not [e for e in _entries(run) if e.endswith(".tmp")]


def test_latest_ignores_an_incomplete_checkpoint(tmp_path):
    (tmp_path / "step-000003").mkdir()
    (tmp_path / "latest").write_text("step-000003")
    assert checkpoint.latest(str(tmp_path)) is None


def test_keep_prunes_old_checkpoints(tmp_path, model, tokenizer):
    run = str(tmp_path)
    for step in range(1, 6):
        checkpoint.save(run, step, model, tokenizer, {}, keep=2)
    assert [e for e in _entries(run) if e.startswith("step-")] == ["step-000004", "step-000005"]
    checkpoint.save(run, 6, model, tokenizer, {}, keep=3)
    checkpoint.save(run, 7, model, tokenizer, {}, keep=3)
    assert [e for e in _entries(run) if e.startswith("step-")] == ["step-000005", "step-000006", "step-000007"]
    assert checkpoint.latest(run).endswith("step-000007")
    checkpoint.save(run, 8, model, tokenizer, {}, keep=1)
    assert [e for e in _entries(run) if e.startswith("step-")] == ["step-000008"]


def test_keep_prunes_by_number_past_six_digits(tmp_path, model, tokenizer):
    """step-1000000 is newer than step-999999, though it sorts before it as text."""
    run = str(tmp_path)
    for step in (999_999, 1_000_000, 1_000_001):
        checkpoint.save(run, step, model, tokenizer, {}, keep=2)
    assert [e for e in _entries(run) if e.startswith("step-")] == ["step-1000000", "step-1000001"]


def test_rng_state_is_restored(tmp_path, model, tokenizer):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    path = checkpoint.save(str(tmp_path), 1, model, tokenizer, {})
    draws = (random.random(), np.random.rand(3), torch.rand(3))
    random.random(), np.random.rand(5), torch.rand(5)  # the run goes on, then is killed
    checkpoint.set_rng_state(checkpoint.load_state(path)["rng"])
    again = (random.random(), np.random.rand(3), torch.rand(3))
    assert draws[0] == again[0]
    assert np.array_equal(draws[1], again[1])
    assert torch.equal(draws[2], again[2])


def test_load_state_of_a_non_checkpoint_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="not a minies checkpoint"):
        checkpoint.load_state(str(tmp_path))


def test_resuming_renames_the_old_log_keys_and_keeps_the_other_rows_byte_for_byte(tmp_path):
    log = tmp_path / "log.jsonl"
    old = '{"step": 1, "sigma_mean": 0.001, "hess_mean": 0.5}\n'  # a 3PO row logged before IVON's std was s
    es_row = '{"step": 2, "reward_mean": 0.25}\n'
    log.write_text(old + es_row + '{"step": 3, "sigma_mean": 0.002}\n')
    assert checkpoint.truncate_log(str(log), 2) == []
    assert log.read_text() == '{"step": 1, "s_mean": 0.001, "hess_mean": 0.5}\n' + es_row
