"""Held-out evaluation shared by eval.py and train.py: pass@k from n samples per problem, greedy accuracy,
malformed rate, the reward scheme's mean format credit ("format_reward"), truncated rate (completions cut off at
max_new_tokens, which a reasoning model needs to watch: a cut-off trace has no answer), mean full-vocabulary token
entropy, mean completion length, and for tasks with several correct solutions per problem (Countdown) how many
distinct ones the n samples found per solved problem ("distinct_correct") and which share of all of them
("solution_coverage"). "sampling_only" is the share of problems that greedy decoding gets wrong but at least one of
the n samples gets right: the problems a policy that sharpens towards its greedy answer can stop solving, where a
fall in pass@k at large k shows first. "answer_diversity" is the verifier-projected Jensen-Shannon diversity of the
n samples, each taken as a member (minies/analysis.py; 0: every sample of a problem answers alike, 1: all differ):
the diversity of a policy's samples, on the scale of ES's population diversity. "ci95_pass@1" is the half-width of
pass@1's 95% interval over problems: 1.96 standard errors of the mean of the problems' own pass@1 (a run that moves
pass@1 by less than the two intervals' overlap may not have moved it at all)."""
import numpy as np
import torch
from tqdm import tqdm

from minies.analysis import answer_outcome, js_diversity
from minies.metrics import masked_mean, mean_pass_at_k
from minies.rollout import completion_logprobs, generate


@torch.no_grad()
def evaluate(model, tokenizer, task, problems, n=16, ks=(1, 16), temperature=1.0, greedy=True, seed=0,
             micro_batch=256, chat_template=True, compile_decoding=True, progress=False):
    """Returns a dict of metrics. n=0 skips sampling (greedy only); greedy=False skips greedy.
    `compile_decoding`: rollout.generate's."""
    prompts = task.prompts(tokenizer, problems, chat_template)
    result = {"problems": len(problems), "n": n}
    if n > 0:
        correct = np.zeros(len(problems), dtype=int)
        malformed, format_credit, truncated, entropy, length = [], [], [], [], []
        found = [set() for _ in problems]  # the distinct correct solutions sampled for each problem
        outcomes = [[] for _ in range(n)]  # outcomes[m][i]: what the verifier read in problem i's m-th sample
        # One block of problems at a time, so the bar moves and memory stays bounded.
        block = max(1, micro_batch // n)
        starts = range(0, len(problems), block)
        for s in tqdm(starts, desc="sampling", disable=not progress, leave=False):
            batch_prompts = [p for p in prompts[s:s + block] for _ in range(n)]
            batch_problems = [p for p in problems[s:s + block] for _ in range(n)]
            r = generate(model, tokenizer, batch_prompts, task.max_new_tokens, temperature, greedy=False,
                         micro_batch=micro_batch, seed=seed + s, share_prompts=True, compile_decoding=compile_decoding)
            scores = [task.score(text, problem) for problem, text in zip(batch_problems, r.texts)]
            correct[s:s + block] = np.array([sc.correct for sc in scores]).reshape(-1, n).sum(1)
            for i, sc in enumerate(scores):
                if sc.correct:
                    found[s + i // n].add(sc.solution)
                outcomes[i % n].append([answer_outcome(sc)])
            malformed += [sc.malformed for sc in scores]
            format_credit += [sc.format for sc in scores]
            truncated += r.truncated.tolist()
            _, ent = completion_logprobs(model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask,
                                         temperature, with_entropy=True, chunk=micro_batch)
            entropy.append(masked_mean(ent, r.completion_mask) * r.completion_mask.sum().item())
            length.append(r.completion_mask.sum().item())
        for k in ks:
            if k <= n:
                result[f"pass@{k}"] = mean_pass_at_k(correct, n, k)
        if 1 in ks:
            result["ci95_pass@1"] = pass_at_1_interval(correct, n)
        result["malformed_rate"] = float(np.mean(malformed))
        result["format_reward"] = float(np.mean(format_credit))
        result["truncated_rate"] = float(np.mean(truncated))
        result["entropy"] = sum(entropy) / max(sum(length), 1)
        result["mean_length"] = sum(length) / (len(problems) * n)
        if n > 1:
            result["answer_diversity"] = js_diversity(outcomes)
        result.update(solution_metrics(task, problems, found))
    if greedy:
        right = greedy_correct(model, tokenizer, task, problems, micro_batch, chat_template, compile_decoding)
        result["greedy_accuracy"] = float(np.mean(right))
        if n > 0:
            result["sampling_only"] = float(np.mean((correct > 0) & ~right))
    return result


def pass_at_1_interval(correct_counts, n):
    """1.96 × the standard error of the mean over problems of c_i / n (0 for a single problem)."""
    per_problem = np.asarray(correct_counts, dtype=float) / n
    if len(per_problem) < 2:
        return 0.0
    return float(1.96 * per_problem.std(ddof=1) / np.sqrt(len(per_problem)))


def solution_metrics(task, problems, found):
    """From the set of distinct correct solutions (Score.solution) sampled for each problem: how many were
    found per solved problem, and which share of the problem's solutions that is (both 0 if none solved)."""
    solved = [i for i, solutions in enumerate(found) if solutions]
    if not solved:
        return {"distinct_correct": 0.0, "solution_coverage": 0.0}
    return {"distinct_correct": float(np.mean([len(found[i]) for i in solved])),
            "solution_coverage": float(np.mean([len(found[i]) / task.solution_count(problems[i]) for i in solved]))}


def greedy_correct(model, tokenizer, task, problems, micro_batch=256, chat_template=True, compile_decoding=True):
    """Whether greedy decoding answers each problem correctly (a bool array)."""
    prompts = task.prompts(tokenizer, problems, chat_template)
    r = generate(model, tokenizer, prompts, task.max_new_tokens, greedy=True, micro_batch=micro_batch,
                 compile_decoding=compile_decoding)
    return np.array([task.score(text, problem).correct for problem, text in zip(problems, r.texts)], dtype=bool)
