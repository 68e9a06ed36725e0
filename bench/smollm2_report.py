"""results.json, results.md and the plots of bench/smollm2.py, from the files its pieces leave (evals/*.json and the
runs' logs); matplotlib is optional, as for bench/report.py.

Intervals: "± s" is the sample standard deviation over seeds; "[± h]" the mean over seeds of each evaluation's 95%
interval over problems (evaluate.py's ci95_pass@1). A difference smaller than either is not settled."""
import json
import os

import numpy as np

from bench.reproduce import KEEP_FRACTIONS, rescue
from bench.budget import read_log, write_json
from bench.smollm2 import METHODS, es_check_runs, levels, seeded_runs
from minies.runtime.checkpoint import written
from train import HELDOUT_LOGGED

LABELS = {"start": "start model", "es": "ES", "grpo": "GRPO", "c3po": "C3PO"}
METRICS = ("pass@1", "pass@4", "pass@16", "pass@64", "greedy_accuracy", "entropy", "malformed_rate", "sampling_only",
           "answer_diversity")


def load(path):
    with open(path) as f:
        return json.load(f)


def eval_path(cfg, name):
    return os.path.join(cfg.out, "evals", f"{name}.json")


def complete(cfg):
    """Whether every piece's file is there (the report is written only then)."""
    names = [f"start-seed{s}" for s in range(cfg.seeds)] + list(seeded_runs(cfg)) + ["start-transfer"]
    names += [f"{n}-{kind}" for n in seeded_runs(cfg) for kind in ("transfer", "drift")]
    names += [f"{m}-seed0-keep{k:g}" for m in ("es", "grpo") for k in KEEP_FRACTIONS[1:-1]]
    names += list(levels(cfg)) + ["grpo-es-seed0"] + [f"noise-T{t:g}" for t in cfg.temperatures]
    names += [f"noise-s{s:g}" for s in cfg.noise_scales]
    checks = [os.path.join(cfg.out, "es-check", n, "budget.json") for n in es_check_runs(cfg)]
    return all(os.path.exists(p) for p in [eval_path(cfg, n) for n in names] + checks)


def stats(values):
    values = [v for v in values if v is not None]
    return {"mean": float(np.mean(values)), "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
            "n": len(values)} if values else None


def curve(run_dir, key="heldout_pass@1"):
    """[(step, tokens, seconds, value)] of a run's evaluations during training (train.py's log, key `key`), with its
    before and after evaluations at the ends; seconds summed over the run's resumed pieces."""
    rows, summary = read_log(run_dir), load(os.path.join(run_dir, "summary.json"))
    metric = HELDOUT_LOGGED[key]
    offset, last, points = 0.0, 0.0, [(0, 0, 0.0, summary["before"][metric])]
    for row in rows:
        if row["seconds"] < last:
            offset += last
        last = row["seconds"]
        if key in row:
            points.append((row["step"], row["tokens"], offset + row["seconds"], row[key]))
    return points + [(rows[-1]["step"], rows[-1]["tokens"], offset + last, summary["after"][metric])]


def step_seconds(rows):
    """The mean wall time of an ES run's steps, evaluations and checkpoints aside: each step's tokens over the
    tokens per second ES measured from the step's start to the end of its update (minies/es_log.py)."""
    tokens = np.diff([0] + [row["tokens"] for row in rows])
    return float(np.mean(tokens / np.array([row["tokens_per_second"] for row in rows])))


def es_check(cfg):
    """Each ES check run: its settings, s/step (evaluations aside), tokens and held-out pass@1 (train.py's
    evaluations) at its end, and for the full-budget runs pass@1 read off each curve at the training time (steps ×
    s/step) the fastest of them took."""
    rows = {}
    for name in es_check_runs(cfg):
        run_dir = os.path.join(cfg.out, "es-check", name)
        budget, config = load(os.path.join(run_dir, "budget.json")), load(os.path.join(run_dir, "config.json"))
        after, log = load(os.path.join(run_dir, "summary.json"))["after"], read_log(run_dir)
        lowrank = config["es"]["mode"] == "lowrank"  # in place perturbs at full rank: --rank is not used
        rows[name] = {"mode": config["es"]["mode"], "rank": config["es"]["rank"] if lowrank else None,
                      "sigma": config["es"]["sigma"],
                      "alpha": config["es"]["alpha"], **budget, "seconds_per_step": step_seconds(log),
                      "pass@1": after["pass@1"], "ci95_pass@1": after["ci95_pass@1"],
                      "tied_steps": sum(row["all_tied"] for row in log),  # every member scored alike: no step
                      "curve": [(step, tokens, value) for step, tokens, _, value in curve(run_dir)]}
    full = [r for n, r in rows.items() if not n.startswith("es-sigma")]
    shortest = min(r["steps"] * r["seconds_per_step"] for r in full)
    for r in full:
        steps, _, values = zip(*r["curve"])
        r["pass@1_at_equal_time"] = float(np.interp(shortest / r["seconds_per_step"], steps, values))
    return {"rows": rows, "equal_time_seconds": shortest}


def summarize(cfg):
    runs = seeded_runs(cfg)
    finals = {"start": [load(eval_path(cfg, f"start-seed{s}")) for s in range(cfg.seeds)]}
    for name, (method, seed, _) in runs.items():
        finals.setdefault(method, []).append(load(eval_path(cfg, name)))
    table = {m: {k: stats([e.get(k) for e in evs]) for k in METRICS + ("ci95_pass@1", "mean_length")}
             for m, evs in finals.items()}
    transfer = {"start": load(eval_path(cfg, "start-transfer"))}
    for method in METHODS:
        transfer[method] = {k: stats([load(eval_path(cfg, f"{method}-seed{s}-transfer")).get(k)
                                      for s in range(cfg.seeds)]) for k in ("pass@1", "greedy_accuracy")}
    drifts = {method: {kind: stats([load(eval_path(cfg, f"{method}-seed{s}-drift"))[kind] for s in range(cfg.seeds)])
                       for kind in ("total", "embedding", "attention", "mlp", "norm")} for method in METHODS}
    sparsity = {m: {f"{k:g}": load(eval_path(cfg, f"{m}-seed0-keep{k:g}"))["pass@1"] for k in KEEP_FRACTIONS[1:-1]}
                for m in ("es", "grpo")}
    logs = {name: read_log(run_dir) for name, (_, _, run_dir) in runs.items()}
    training = {name: {"tokens": logs[name][-1]["tokens"], "steps": logs[name][-1]["step"],
                       "seconds": load(os.path.join(run_dir, "budget.json"))["seconds"],
                       "entropy": curve(run_dir, "heldout_entropy"), "pass@1": curve(run_dir)}
                for name, (_, _, run_dir) in runs.items()}
    groups = {name: {"groups_solved": [r["groups_solved"] for r in rows if "groups_solved" in r]}
              for name, rows in logs.items()}
    rescued = {f"seed{s}": rescue(groups[f"c3po-seed{s}"], groups[f"grpo-seed{s}"]) for s in range(cfg.seeds)}
    # Paper A's diversity during training: ES's population (js_diversity), GRPO's and C3PO's groups (group_diversity).
    diversity = {name: float(np.mean([r.get("js_diversity", r.get("group_diversity")) for r in rows]))
                 for name, rows in logs.items()}
    calibration = {"chosen": finals["start"][0], **{name: load(eval_path(cfg, name)) for name in levels(cfg)}}
    noise = {"temperature": [load(eval_path(cfg, f"noise-T{t:g}")) for t in cfg.temperatures],
             "weights": [load(eval_path(cfg, f"noise-s{s:g}")) for s in cfg.noise_scales]}
    return {"finals": finals, "table": table, "transfer": transfer, "drift": drifts, "sparsity": sparsity,
            "training": training,
            "rescue": rescued, "diversity": diversity, "es_check": es_check(cfg), "calibration": calibration,
            "sequential": load(eval_path(cfg, "grpo-es-seed0")), "noise": noise}


def paired(finals, metric, a, b):
    """Per seed, `metric` of a's final model minus b's (b may be "start": each seed's own split), over seeds: the
    mean ± std, and on how many seeds a is above b."""
    diffs = [x[metric] - y[metric] for x, y in zip(finals[a], finals[b])]
    return {**stats(diffs), "above": sum(d > 0 for d in diffs)}


def kept_gain(results, method, keep="0.1"):
    """The share of seed 0's pass@1 gain that the largest `keep` of its changes keep (functional sparsity)."""
    start, final = results["finals"]["start"][0]["pass@1"], results["finals"][method][0]["pass@1"]
    return f"{(results['sparsity'][method][keep] - start) / (final - start) * 100:.0f}%" if final != start else "no gain"


def at_diversity(points, diversity):
    """The best pass@1 that temperature reaches at answer diversity `diversity` (None if it never does), read along
    its curve in temperature order: diversity rises with temperature, then falls once hot samples are mostly
    malformed (one label), so the curve can cross a diversity twice, and the weights are held to the better."""
    points = sorted(points, key=lambda p: p["temperature"])
    found = []
    for a, b in zip(points, points[1:]):
        low, high = sorted((a["answer_diversity"], b["answer_diversity"]))
        if low <= diversity <= high:
            rise = b["answer_diversity"] - a["answer_diversity"]
            share = (diversity - a["answer_diversity"]) / rise if rise else 0.0
            found.append(a["pass@1"] + share * (b["pass@1"] - a["pass@1"]))
    return max(found) if found else None


def claims(results, samples):
    """[(claim, SmolLM2's figure)] for docs/results.md's claims table, pass@k at k = 1, 16 and `samples` (the
    evaluations' samples per problem): differences are paired by seed, in points, "mean ± std over seeds (on how
    many seeds above)"."""
    f, n = results["finals"], len(results["finals"]["start"])
    ks = list(dict.fromkeys(("pass@1", f"pass@{min(16, samples)}", f"pass@{samples}")))

    def delta(metric, a, b="start"):
        d = paired(f, metric, a, b)
        return f"{d['mean'] * 100:+.1f} ± {d['std'] * 100:.1f} ({d['above']}/{n} above)"

    def entropy(method):
        return f"{np.mean([e['entropy'] for e in f['start']]):.3f} → {fmt(results['table'][method]['entropy'], 1, 3)}"

    def mean_over(method):
        return stats([d for name, d in results["diversity"].items() if name.startswith(f"{method}-seed")])

    rows = []
    for method in ("grpo", "es"):
        rows.append((f"A: {LABELS[method]} against the start model: {', '.join(ks)}; entropy",
                     "; ".join(f"{k} {delta(k, method)}" for k in ks)
                     + f"; entropy {entropy(method)}"))
    rows.append(("A: ES's population more diverse than GRPO's groups (mean JS diversity over training)",
                 f"ES {fmt(mean_over('es'), 1, 3)}, GRPO {fmt(mean_over('grpo'), 1, 3)}, "
                 f"C3PO {fmt(mean_over('c3po'), 1, 3)}"))
    rows.append(("A: functional sparsity (share of seed 0's pass@1 gain kept by the largest 10% of the changes θ − θ0)",
                 f"ES {kept_gain(results, 'es')}, GRPO {kept_gain(results, 'grpo')}"))
    transfer, drift = results["transfer"], results["drift"]
    rows.append(("A: large drift without forgetting (‖θ − θ0‖; pass@1 on the other task level against the start "
                 "model's)", "; ".join(f"{LABELS[m]} {fmt(drift[m]['total'], 1, 2)}, "
                                      f"{(transfer[m]['pass@1']['mean'] - transfer['start']['pass@1']) * 100:+.1f}"
                                      for m in METHODS)))
    seq, grpo, es = results["sequential"], f["grpo"][0], f["es"][0]
    rows.append((f"A: GRPO → ES against either alone (seed 0: pass@1 / {ks[-1]})",
                 "; ".join(f"{name} {pct(e['pass@1'])} / {pct(e[ks[-1]])}" for name, e in (
                     ("GRPO → ES", seq), ("GRPO", grpo), ("ES", es)))))
    rows.append((f"B: C3PO against GRPO: {', '.join(ks)}", "; ".join(f"{k} {delta(k, 'c3po', 'grpo')}" for k in ks)))
    rescued = results["rescue"].values()
    rows.append(("B: zero-advantage groups rescued / lost against GRPO (same prompts)",
                 f"{sum(r['rescued'] for r in rescued)} / {sum(r['lost'] for r in rescued)} over {n} seeds"))
    rows.append(("B: malformed rate (final models)", "; ".join(f"{LABELS[m]} {fmt(results['table'][m]['malformed_rate'])}%"
                                                             for m in ("start", *METHODS))))
    noise = results["noise"]
    matched = [(p["scale"], p["pass@1"], at_diversity(noise["temperature"], p["answer_diversity"]))
               for p in noise["weights"]]
    rows.append(("B: weight noise against temperature at the same answer diversity (pass@1, weights − temperature)",
                 "; ".join(f"s = {s:g}: " + ("outside the temperatures' range" if t is None else f"{(w - t) * 100:+.1f}")
                           for s, w, t in matched)))
    return rows


def fmt(stat, scale=100, digits=1):
    return "—" if stat is None else f"{stat['mean'] * scale:.{digits}f} ± {stat['std'] * scale:.{digits}f}"


def pct(x):
    return f"{x * 100:.1f}"


def markdown(cfg, results):
    t = results["table"]
    lines = [f"# The papers' claims on `{cfg['model']}`", "",
             f"Sums of {' or '.join(map(str, cfg['numbers']))} numbers in 0..{cfg['high']}; {cfg['tokens']} generated "
             f"training tokens per run, seeds 0..{cfg['seeds'] - 1}; {cfg['problems']} held-out problems × "
             f"{cfg['samples']} samples per model. Mean ± std over seeds [mean 95% interval over problems], in %.", "",
             "| claim | measured |", "|---|---|", *(f"| {claim} | {figure} |" for claim, figure in results["claims"]), "",
             "| model | pass@1 | pass@4 | pass@16 | pass@64 | greedy | entropy | malformed | solved only by sampling | "
             "answer diversity |", "|---|" + "---:|" * 9]
    for m in ("start", *METHODS):
        row = t[m]
        lines.append(f"| {LABELS[m]} | {fmt(row['pass@1'])} [± {row['ci95_pass@1']['mean'] * 100:.1f}] | "
                     + " | ".join(fmt(row[k]) for k in ("pass@4", "pass@16", "pass@64", "greedy_accuracy")) + " | "
                     + fmt(row["entropy"], 1, 3) + " | " + fmt(row["malformed_rate"]) + " | "
                     + fmt(row["sampling_only"]) + " | " + fmt(row["answer_diversity"], 1, 3) + " |")
    lines += ["", "| run | steps | tokens | wall (min) | held-out entropy start → end |", "|---|---:|---:|---:|---|"]
    for name, r in results["training"].items():
        lines.append(f"| {name} | {r['steps']} | {r['tokens']} | {r['seconds'] / 60:.1f} | "
                     f"{r['entropy'][0][3]:.3f} → {r['entropy'][-1][3]:.3f} |")
    check = results["es_check"]
    lines += ["", "ES check (seed 0; pass@1 at equal time: read at "
              f"{check['equal_time_seconds'] / 60:.1f} min of steps, evaluations aside)", "",
              "| run | mode | rank | σ | α | steps | tied steps | tokens | s/step | pass@1 | pass@1 at equal time |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in check["rows"].items():
        equal = pct(r["pass@1_at_equal_time"]) if "pass@1_at_equal_time" in r else "—"
        lines.append(f"| {name} | {r['mode']} | {r['rank'] or '–'} | {r['sigma']:g} | {r['alpha']:g} | {r['steps']} | "
                     f"{r['tied_steps']} | "
                     f"{r['tokens']} | {r['seconds_per_step']:.1f} | {pct(r['pass@1'])} ± {pct(r['ci95_pass@1'])} | "
                     f"{equal} |")
    lines += ["", "Calibration (the start model, seed 0's split)", "",
              "| level | pass@1 | pass@8 | pass@64 | greedy | malformed | solved only by sampling |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for name, e in results["calibration"].items():
        lines.append(f"| {name} | " + " | ".join(pct(e.get(k, float("nan"))) for k in (
            "pass@1", "pass@8", f"pass@{cfg['samples']}", "greedy_accuracy", "malformed_rate", "sampling_only")) + " |")
    seq, grpo, es = results["sequential"], results["finals"]["grpo"][0], results["finals"]["es"][0]
    lines += ["", "Seed 0 at the same total budget: GRPO → ES against either alone", "",
              "| run | pass@1 | pass@16 | pass@64 | greedy |", "|---|---:|---:|---:|---:|"]
    for name, e in (("GRPO", grpo), ("ES", es), ("GRPO → ES", seq)):
        lines.append(f"| {name} | " + " | ".join(pct(e.get(k, float("nan"))) for k in (
            "pass@1", "pass@16", f"pass@{cfg['samples']}", "greedy_accuracy")) + " |")
    tr = results["transfer"]
    lines += ["", f"Another task level ({cfg['transfer_numbers']} numbers in 0..99), pass@1 / greedy", "",
              f"start model {pct(tr['start']['pass@1'])} / {pct(tr['start']['greedy_accuracy'])}; "
              + "; ".join(f"{LABELS[m]} {fmt(tr[m]['pass@1'])} / {fmt(tr[m]['greedy_accuracy'])}" for m in METHODS)]
    kinds = ("embedding", "attention", "mlp", "norm")
    lines += ["", f"Drift ‖θ − θ0‖ (total; {', '.join(kinds)})", "",
              "; ".join(f"{LABELS[m]} {fmt(d['total'], 1, 2)} (" + ", ".join(fmt(d[k], 1, 2) for k in kinds) + ")"
                        for m, d in results["drift"].items())]
    lines += ["", "Functional sparsity (seed 0, pass@1 with only the largest x of |θ − θ0| applied)", "",
              "; ".join(f"{LABELS[m]}: " + ", ".join(f"{k}: {pct(v)}" for k, v in keeps.items())
                        for m, keeps in results["sparsity"].items())]
    lines += ["", "C3PO's zero-advantage rescue against GRPO (same prompts, step by step)", "",
              "; ".join(f"{seed}: {r['rescued']} rescued, {r['lost']} lost of {r['baseline_failed']} GRPO groups "
                        f"that failed" for seed, r in results["rescue"].items())]
    lines += ["", "Diversity over training (mean verifier-projected JS diversity of ES's members' greedy answers, of "
              "GRPO's and C3PO's groups of samples): " + "; ".join(f"{n} {d:.3f}" for n, d in results["diversity"].items())]
    lines += ["", "Temperature against weight noise (the start model; pass@1 and answer diversity)", "",
              "| setting | pass@1 | answer diversity |", "|---|---:|---:|"]
    for e in results["noise"]["temperature"]:
        lines.append(f"| T = {e['temperature']:g} | {pct(e['pass@1'])} | {e['answer_diversity']:.3f} |")
    for e in results["noise"]["weights"]:
        lines.append(f"| s = {e['scale']:g} | {pct(e['pass@1'])} | {e['answer_diversity']:.3f} |")
    return "\n".join(lines) + "\n"


def plot(results, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed; plots skipped (pip install matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(5, 4))
    for method, evs in results["finals"].items():
        ks = sorted(int(k[5:]) for k in evs[0] if k.startswith("pass@"))
        ax.plot(ks, [np.mean([e[f"pass@{k}"] for e in evs]) * 100 for k in ks], marker="o", label=LABELS[method])
    ax.set(xscale="log", xlabel="k", ylabel="pass@k (%)")
    ax.legend()
    fig.savefig(os.path.join(out, "pass_at_k.png"), dpi=120, bbox_inches="tight")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name, r in results["training"].items():
        color = {"es": "tab:green", "grpo": "tab:red", "c3po": "tab:blue"}[name.split("-")[0]]
        for ax, key in zip(axes, ("pass@1", "entropy")):
            _, tokens, _, values = zip(*r[key])
            ax.plot(tokens, values, color=color, alpha=0.7, label=name if name.endswith("seed0") else None)
    axes[0].set(xlabel="generated training tokens", ylabel="held-out pass@1")
    axes[1].set(xlabel="generated training tokens", ylabel="held-out entropy (nats)")
    axes[0].legend()
    fig.savefig(os.path.join(out, "curves.png"), dpi=120, bbox_inches="tight")
    fig, ax = plt.subplots(figsize=(5, 4))
    for kind, key, label in (("temperature", "temperature", "temperature"), ("weights", "scale", "weight noise")):
        points = results["noise"][kind]
        ax.plot([p["answer_diversity"] for p in points], [p["pass@1"] * 100 for p in points], marker="o", label=label)
        for p in points:
            ax.annotate(f"{p[key]:g}", (p["answer_diversity"], p["pass@1"] * 100), fontsize=7)
    ax.set(xlabel="answer diversity (JS)", ylabel="pass@1 (%)")
    ax.legend()
    fig.savefig(os.path.join(out, "temperature_vs_weight_noise.png"), dpi=120, bbox_inches="tight")


def write(cfg, config, seconds):
    results = {"config": config, **summarize(cfg), "seconds_this_invocation": seconds,
               "threads": os.environ.get("OMP_NUM_THREADS")}
    results["claims"] = claims(results, cfg.samples)
    write_json(os.path.join(cfg.out, "results.json"), results)
    with written(os.path.join(cfg.out, "results.md")) as f:
        f.write(markdown(config, results))
    plot(results, cfg.out)
    print(f"wrote {cfg.out}/results.json, results.md and plots")
