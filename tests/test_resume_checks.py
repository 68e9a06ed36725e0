"""--resume compares what a run reads and how its settings resolve (minies/runtime/resume.py): a data file whose
content changed is named, settings spelled another way are the same, and a changed difficulty flag is reported
by its value."""
import json
import os

import pytest

import train
from minies import UserError
from minies.runtime import resume
from minies.runtime.resume import check_resumed_settings, input_digests
from minies.tasks import Arithmetic

ROWS = [{"nums": [a, b, c], "target": a + b * c} for a, b, c in [(1, 2, 3), (2, 3, 4), (3, 4, 5), (4, 5, 6)]]


def recorded_run(tmp_path, *argv, drop=()):
    """(run directory, its settings) of a run of `argv` whose config.json was written without the keys `drop`."""
    cfg, algo_cfg, _, recipes = train.parse_args(["--out", str(tmp_path), *argv])
    run_dir = str(tmp_path / "run")
    train.write_config(run_dir, train.run_settings(cfg, algo_cfg), recipes, input_digests(cfg))
    config = json.loads(open(os.path.join(run_dir, "config.json")).read())
    for key in drop:
        config.pop(key)
    open(os.path.join(run_dir, "config.json"), "w").write(json.dumps(config))
    return run_dir, cfg, algo_cfg


def check(run_dir, *argv, task=None):
    cfg, algo_cfg, _, _ = train.parse_args(list(argv))
    check_resumed_settings(run_dir, train.run_settings(cfg, algo_cfg), (cfg, algo_cfg), {}, input_digests(cfg),
                           (task or Arithmetic()).difficulty)


def test_a_data_file_whose_content_changed_is_named(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    run_dir, _, _ = recorded_run(tmp_path, "--task", "countdown", "--data", str(data))
    check(run_dir, "--out", str(tmp_path), "--task", "countdown", "--data", str(data))  # unchanged: resumes
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS[::-1]))
    with pytest.raises(UserError, match=rf"--data {data} changed since the run read it \(sha256 [0-9a-f]{{12}}\.\.\., "
                                        r"now [0-9a-f]{12}\.\.\.\); put the run's file back"):
        check(run_dir, "--out", str(tmp_path), "--task", "countdown", "--data", str(data))


def test_a_run_recorded_before_files_were_hashed_resumes(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    run_dir, _, _ = recorded_run(tmp_path, "--task", "countdown", "--data", str(data), drop=["inputs"])
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS[::-1]))
    check(run_dir, "--out", str(tmp_path), "--task", "countdown", "--data", str(data))


def test_difficulty_flags_compare_as_resolved_and_report_values(tmp_path):
    run_dir, _, _ = recorded_run(tmp_path)
    check(run_dir, "--out", str(tmp_path), "--numbers", "2", "--low", "0", "--high", "99")  # the defaults, written out
    with pytest.raises(UserError, match=r"--high 50 \(the run has 99\)") as refused:
        check(run_dir, "--out", str(tmp_path), "--high", "50")
    assert "None" not in str(refused.value)


def test_a_packaged_models_name_and_its_files_path_are_one_model(tmp_path, monkeypatch):
    gguf = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(resume, "packaged_file", lambda name: str(gguf) if name == "smollm2-135m" else name)
    run_dir, _, _ = recorded_run(tmp_path, "--model", "smollm2-135m")
    check(run_dir, "--out", str(tmp_path), "--model", str(gguf))
    with pytest.raises(UserError, match="--model"):
        check(run_dir, "--out", str(tmp_path), "--model", str(tmp_path / "other.gguf"))
