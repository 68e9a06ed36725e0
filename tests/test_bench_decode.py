"""bench/decode.py runs end to end on the shipped model at toy size and prints its table: the two bounds, and per
batch each path's tokens/s, the fraction of the bound, and whether its greedy tokens are eager's (its numbers are
measured, never asserted)."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_decode_prints_the_bounds_and_every_path():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "bench.decode", "--model", "shipped", "--batches", "1", "4",
                          "--new-tokens", "4", "--repeats", "1", "--paths", "eager", "minies"], cwd=ROOT,
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    rates = re.search(r"memory bandwidth ([0-9.]+) GB/s; matmul float32 ([0-9.]+) GFLOP/s, bfloat16 ([0-9.]+)", text)
    assert rates and all(float(x) > 0 for x in rates.groups())
    for rows in (1, 4):
        assert re.search(rf"^batch {rows}: bound [0-9,]+ tok/s \((bandwidth|matmul)-bound;", text, re.M), rows
    eager = re.findall(r"^  eager +call +[0-9,.]+ tok/s +decoding +[0-9,.]+ tok/s +\d+% of the bound$", text, re.M)
    minies = re.findall(r"^  minies +call +[0-9,.]+ tok/s +decoding +[0-9,.]+ tok/s +\d+% of the bound +same greedy "
                        r"tokens: (yes|no) +×[0-9.]+ eager \(call\), ×[0-9.]+ \(decoding\)$", text, re.M)
    assert len(eager) == 2 and minies == ["yes", "yes"]
