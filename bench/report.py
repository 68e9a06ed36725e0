"""results.md and the PNG plots of bench/reproduce.py, from its results dict (the content of results.json).

matplotlib is optional and deliberately not in requirements.txt (the library never plots): without it
the plots are skipped with one line saying so, and results.json and results.md are written as usual.
"""
import os

ORDER = ("start", "es", "grpo", "grpo-hot", "c3po", "grpo-es", "es-grpo")
LABELS = {"start": "start model", "es": "ES", "grpo": "GRPO", "grpo-hot": "GRPO-hot", "c3po": "C3PO",
          "grpo-es": "GRPO→ES", "es-grpo": "ES→GRPO"}
SWEEP_COLORS = ("tab:olive", "tab:cyan", "darkgreen", "tab:pink", "tab:gray")  # ES at other σ, by σ
COLORS = {"start": "black", "es": "tab:green", "grpo": "tab:red", "grpo-hot": "tab:brown", "c3po": "tab:blue",
          "grpo-es": "tab:orange", "es-grpo": "tab:purple"}


def ordered(methods):
    """The methods in ORDER, ES's runs at other σ ("es-sigma<σ>", by σ) right after ES."""
    sweeps = sorted((m for m in methods if m.startswith("es-sigma")), key=lambda m: float(m[len("es-sigma"):]))
    known = [m for m in ORDER if m in methods]
    after_es = known.index("es") + 1 if "es" in known else len(known)
    return known[:after_es] + sweeps + known[after_es:]


def label(method):
    return LABELS.get(method) or f"ES σ={method[len('es-sigma'):]}"


def colors(methods):
    sweeps = [m for m in ordered(methods) if m.startswith("es-sigma")]
    return {**COLORS, **{m: SWEEP_COLORS[i % len(SWEEP_COLORS)] for i, m in enumerate(sweeps)}}


def fmt(stat, percent=False, digits=3):
    """"mean ± std" of a summary entry; "—" when it is missing."""
    if stat is None:
        return "—"
    scale, digits = (100, 1) if percent else (1, digits)
    return f"{stat['mean'] * scale:.{digits}f} ± {stat['std'] * scale:.{digits}f}"


def table(header, rows):
    return ["| " + " | ".join(line) + " |" for line in [header, ["---"] * len(header), *rows]]


def keep_fractions(summary):
    keys = {k.split("_")[0][len("sparse"):] for m in summary.values() for k in m if k.startswith("sparse")}
    return sorted((k for k in keys if float(k) not in (0.0, 1.0)), key=float)


def write_markdown(results, path):
    cfg, summary = results["config"], results["summary"]
    methods = ordered(summary)
    ks = sorted(int(k[len("pass@"):]) for k in summary["start"] if k.startswith("pass@"))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    model = os.path.relpath(cfg["model"], root) if cfg["model"].startswith(root + os.sep) else cfg["model"]
    lines = [f"# Reproducing the papers' findings on `{model}`, task {cfg.get('task', 'arithmetic')}", "",
             f"Seeds 0..{cfg['seeds'] - 1}; every run generated {cfg['tokens']} training tokens (a sequential run half "
             f"in each stage); held-out evaluation on {cfg['problems']} problems × {cfg['samples']} samples at "
             f"temperature 1 (pass@k, unbiased estimator), plus greedy decoding. Mean ± sample std over seeds; "
             f"rates in %. Wall time {results['seconds'] / 60:.1f} min "
             f"(estimated {results['estimated_seconds'] / 60:.0f}).",
             *([f"GRPO-hot is GRPO sampling its training rollouts at temperature {cfg['hot_temperature']:g}; its "
                "evaluations are at temperature 1 like every other run's."] if "hot_temperature" in cfg else []),
             "", "## Final models", ""]
    rows = [[label(m), fmt(summary[m].get("tokens"), digits=0), fmt(summary[m].get("steps"), digits=0),
             *[fmt(summary[m].get(f"pass@{k}"), True) for k in ks], fmt(summary[m]["greedy_accuracy"], True),
             fmt(summary[m]["entropy"]), fmt(summary[m]["malformed_rate"], True), fmt(summary[m].get("drift_total"))]
            for m in methods]
    lines += table(["method", "tokens", "steps", *[f"pass@{k}" for k in ks], "greedy", "entropy", "malformed",
                    "drift ‖θ−θ0‖"], rows)

    space = results.get("solution_space")
    if space and space["mean"] > 1:
        lines += ["", "## Coverage of the solution space", "",
                  f"The {cfg['problems']} held-out problems have {space['mean']:.2f} distinct correct expressions "
                  f"each on average (brute force, `minies.tasks.countdown.solutions`), and {space['multi'] * 100:.1f}% "
                  f"have two or more. Of the {cfg['samples']} samples per problem: the distinct correct expressions "
                  "found per solved problem, and the share of all of that problem's solutions they are (mean over "
                  "solved problems).", ""]
        lines += table(["method", "solved (%)", "distinct correct per solved problem", "share of its solutions (%)"],
                       [[label(m), fmt(summary[m].get(f"pass@{cfg['samples']}"), True),
                         fmt(summary[m].get("distinct_correct")), fmt(summary[m].get("solution_coverage"), True)]
                        for m in methods])

    keeps = keep_fractions(summary)
    lines += ["", "## Functional sparsity", "",
              "Share of the gain over the start model (pass@1 at "
              f"{cfg['sparsity_samples']} samples, and greedy accuracy) kept when only the largest-magnitude "
              "fraction of the update's entries is applied (`minies.analysis.sparsified`); — where training gained "
              "nothing.", ""]
    rows = [[f"{label(m)} {metric}", *[fmt(summary[m].get(f"sparse{k}_{metric}_gain_kept"), True) for k in keeps]]
            for m in ("es", "grpo") if m in summary for metric in ("pass@1", "greedy_accuracy")]
    lines += table(["method, metric", *[f"top {float(k) * 100:g}%" for k in keeps]], rows)

    kinds = ("total", "embedding", "attention", "mlp", "norm", "other")
    lines += ["", "## Drift per layer type", "", "L2 norm of θ − θ0 (`minies.analysis.drift`).", ""]
    lines += table(["method", *kinds], [[label(m), *[fmt(summary[m].get(f"drift_{k}")) for k in kinds]]
                                        for m in methods if m != "start"])

    fractions = [k[len("malformed_at"):] for k in summary.get("grpo", {}) if k.startswith("malformed_at")]
    if fractions:
        lines += ["", "## Malformed rate over training", "",
                  f"Held-out malformed rate from train.py's evaluations during training ({cfg['eval_problems']} "
                  "problems × 4 samples at temperature 1, its before and after evaluations included) at a share of "
                  "the token budget, interpolated linearly between evaluations; and the malformed rate of the "
                  "training rollouts themselves over the last 10% of the budget (GRPO and C3PO stages only, each at "
                  "its own sampling temperature).", ""]
        lines += table(["method", *[f"{float(f) * 100:g}% of budget" for f in fractions], "rollouts, last 10%"],
                       [[label(m), *[fmt(summary[m].get(f"malformed_at{f}"), True) for f in fractions],
                         fmt(summary[m].get("train_malformed_last"), True)] for m in methods if m != "start"])

    rescue = results["rescue"]
    lines += ["", "## Zero-advantage rescue", "",
              "A method against a baseline on the same seed, hence the same prompts at every step: a prompt is "
              "rescued when the method's group had a correct completion and the baseline's whole group failed, "
              "lost in the reverse case (`minies.analysis.rescue_counts`).", ""]
    lines += table(["method", "baseline", "seed", "paired steps", "prompts", "baseline group all wrong", "rescued",
                    "lost"],
                   [[*(label(m) for m in pair.split("-vs-")), seed,
                     *(str(r[k]) for k in ("steps", "prompts", "baseline_failed", "rescued", "lost"))]
                    for pair, seeds in rescue.items() for seed, r in seeds.items()])

    quarters = [q["steps"] for q in next(iter(rescue.values()))["seed0"]["quarters"]]
    lines += ["", "Over training: prompts rescued / lost in each quarter of the paired steps (mean over seeds; "
              "the step ranges are seed 0's).", ""]
    lines += table(["method", "baseline", *[f"steps {a}–{b}" for a, b in quarters]],
                   [[*(label(m) for m in pair.split("-vs-")),
                     *[f"{mean(seeds, i, 'rescued'):.0f} / {mean(seeds, i, 'lost'):.0f}" for i in range(len(quarters))]]
                    for pair, seeds in rescue.items()])

    lines += ["", "## ES population diversity and pass@k", ""]
    es_rows = [m for m in methods if m == "es" or m.startswith("es-sigma")]
    if any(summary[m].get("js_diversity_mean") for m in es_rows):
        lines += ["Verifier-projected Jensen–Shannon diversity of the ES population (`minies.analysis.js_diversity`; "
                  "0: every member gives the same outcomes, 1: all differ), averaged over each run's steps and at "
                  "its last step, beside the final pass@k. The noise scale σ sets how far the members spread.", ""]
        ks = list(dict.fromkeys(("pass@1", "pass@8", f"pass@{cfg['samples']}")))
        lines += table(["method", "diversity, mean", "diversity, last step", *ks],
                       [[label(m), fmt(summary[m].get("js_diversity_mean")), fmt(summary[m].get("js_diversity_last")),
                         *[fmt(summary[m].get(k), True) for k in ks]] for m in es_rows])
        link = results.get("diversity_link", {}).get("rank_correlation", {})
        if link:
            runs = len(results["diversity_link"]["runs"])
            lines += ["", f"Rank correlation (Spearman) across the {runs} ES runs between mean diversity and the gain "
                      "in pass@k over the start model on the run's seed: "
                      + ", ".join(f"{k} {'—' if r is None else f'{r:+.2f}'}" for k, r in link.items()) + "."]
    else:
        lines.append("The ES runs logged no `js_diversity`, so there is no diversity series.")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


# The panels of the reward plot: one per family of methods, so that each holds a few lines.
FAMILIES = (("ES", lambda m: m == "es" or m.startswith("es-sigma")), ("GRPO", lambda m: m in ("grpo", "grpo-hot")),
            ("3PO", lambda m: m == "c3po"), ("sequential", lambda m: m in ("grpo-es", "es-grpo")))


def running_mean(values, window):
    """Mean of each value and the window − 1 before it (fewer at the start)."""
    total, out = 0.0, []
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def smoothed_reward(runs, method, points=200):
    """(tokens, mean over seeds, min, max) of a method's training reward, each seed's series first
    smoothed over a tenth of its run, then read on a common grid of generated tokens."""
    import numpy as np

    series = [list(zip(*r["reward"])) for r in runs.values() if r["method"] == method and r.get("reward")]
    grid = np.linspace(max(s[0][0] for s in series), min(s[0][-1] for s in series), points)
    curves = np.array([np.interp(grid, tokens, running_mean(reward, max(1, len(reward) // 10)))
                       for tokens, reward in series])
    return grid, curves.mean(0), curves.min(0), curves.max(0)


def plot_reward(plt, runs, color):
    """Training reward against generated tokens, a panel per family of methods: per method the mean over
    seeds (line) and their range (band). The axes are shared so that the panels compare."""
    from matplotlib.ticker import FuncFormatter

    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex=True, sharey=True)
    methods = ordered({r["method"] for r in runs.values() if r.get("reward")})
    for ax, (family, member) in zip(axes.flat, FAMILIES):
        for m in filter(member, methods):
            grid, mean_, low, high = smoothed_reward(runs, m)
            ax.plot(grid, mean_, color=color[m], lw=2, label=label(m))
            ax.fill_between(grid, low, high, color=color[m], alpha=0.15, lw=0)
        ax.legend(loc="lower right")
        ax.set_title(family)
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x / 1000:g}k"))
    for ax in axes[1]:
        ax.set_xlabel("generated training tokens")
    for ax in axes[:, 0]:
        ax.set_ylabel("training reward")
    fig.suptitle("Training reward, running mean over a tenth of each run; band: range over seeds\n"
                 "(ES: the members' mean reward at greedy decoding; the others: sampled rollouts)")
    return fig


def mean(seeds, quarter, key):
    """Mean over seeds of one quarter's rescued or lost count."""
    return sum(r["quarters"][quarter][key] for r in seeds.values()) / len(seeds)


def plot(results, out):
    """Writes the PNG plots into `out`; returns their paths (none without matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plots skipped: matplotlib is not installed (pip install matplotlib enables them)")
        return []
    summary, runs, paths = results["summary"], results["runs"], []
    color = colors(summary)

    def finish(ax, title, xlabel, ylabel):
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
        handles = dict(zip(*reversed(ax.get_legend_handles_labels())))  # one entry per label
        if handles:
            ax.legend(handles.values(), handles.keys(), fontsize="small")

    def save(fig, name):
        fig.tight_layout()
        paths.append(os.path.join(out, name))
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for m in ordered(summary):
        ks = sorted(int(k[len("pass@"):]) for k in summary[m] if k.startswith("pass@"))
        ax.errorbar(ks, [summary[m][f"pass@{k}"]["mean"] for k in ks], [summary[m][f"pass@{k}"]["std"] for k in ks],
                    color=color[m], label=label(m), marker="o", ms=3, capsize=2)
    ax.set_xscale("log", base=2)
    finish(ax, "held-out pass@k (mean ± std over seeds)", "k", "pass@k")
    save(fig, "pass_at_k.png")

    # One line per run (seeds of a method share its color); runs without the series are left out.
    for key, name, title, ylabel in (
            ("heldout_entropy", "entropy.png", "held-out token entropy during training", "entropy (nats)"),
            ("heldout_malformed", "malformed.png", "held-out malformed rate during training (temperature 1)",
             "malformed rate"),
            ("train_malformed", "train_malformed.png",
             "training rollouts' malformed rate (own temperature)", "malformed rate"),
            ("js_diversity", "es_diversity.png", "ES population diversity (verifier-projected JS)", "JS diversity")):
        fig, ax = plt.subplots(figsize=(6, 4))
        for run in (r for r in runs.values() if r.get(key)):
            ax.plot(*zip(*run[key]), color=color[run["method"]], lw=1, alpha=0.8, label=label(run["method"]))
        finish(ax, title, "generated training tokens", ylabel)
        save(fig, name)

    fig = plot_reward(plt, runs, color)
    save(fig, "reward.png")

    points = results.get("diversity_link", {}).get("runs", [])
    if points:  # one point per ES run: its mean diversity against its final pass@k, for the smallest and largest k
        ks = [k for k in points[0] if k.startswith("pass@")]
        fig, axes = plt.subplots(1, 2, figsize=(9, 4))
        for ax, k in zip(axes, (ks[0], ks[-1])):
            for p in points:
                method = p["run"].rsplit("-seed", 1)[0]
                ax.scatter(p["js_diversity_mean"], p[f"gain_{k}"], color=color[method], label=label(method))
            finish(ax, f"ES runs: {k} gain over the start model", "mean JS diversity over training", f"{k} gain")
        save(fig, "diversity_pass_at_k.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (pair, seeds) in enumerate(results["rescue"].items()):
        quarters = seeds["seed0"]["quarters"]
        middles = [(a + b) / 2 for a, b in (q["steps"] for q in quarters)]
        names = " vs ".join(label(m) for m in pair.split("-vs-"))
        for key, style in (("rescued", "-"), ("lost", "--")):
            ax.plot(middles, [mean(seeds, q, key) for q in range(len(quarters))], style, marker="o",
                    color=f"C{i}", label=f"{names}: {key}")
    finish(ax, "zero-advantage rescue per quarter of training (mean over seeds)", "step", "prompts per quarter")
    save(fig, "rescue.png")

    if "distinct_correct" in summary["start"] and results.get("solution_space", {}).get("mean", 1) > 1:
        methods = ordered(summary)
        fig, ax = plt.subplots(figsize=(7, 4))
        stats = [summary[m]["distinct_correct"] for m in methods]
        ax.bar(range(len(methods)), [s["mean"] for s in stats], yerr=[s["std"] for s in stats], capsize=3,
               color=[color[m] for m in methods])
        ax.set_xticks(range(len(methods)), [label(m) for m in methods], rotation=30, ha="right")
        ax.set_ylim(bottom=1)
        finish(ax, f"distinct correct expressions per solved problem ({results['config']['samples']} samples)", "",
               "distinct correct expressions")
        save(fig, "solutions.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    for m in ("es", "grpo"):
        keeps = [k for k in keep_fractions(summary) if summary.get(m, {}).get(f"sparse{k}_pass@1_gain_kept")]
        if keeps:
            stats = [summary[m][f"sparse{k}_pass@1_gain_kept"] for k in keeps]
            ax.errorbar([float(k) * 100 for k in keeps], [s["mean"] for s in stats], [s["std"] for s in stats],
                        color=color[m], label=label(m), marker="o", capsize=2)
    percents = [float(k) * 100 for k in keep_fractions(summary)]
    ax.set_xscale("log")
    ax.set_xticks(percents, [f"{p:g}" for p in percents])
    finish(ax, "pass@1 gain kept by the largest updates", "entries of θ − θ0 kept (%)", "share of the pass@1 gain")
    save(fig, "sparsity.png")
    return paths
