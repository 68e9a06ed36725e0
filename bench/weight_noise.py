"""Temperature against weight noise, the 3PO paper's first figure: two ways to make a model's answers differ.

A temperature rescales the logits of one model, so it can only spread probability over the tokens that model
already ranks; a weight sample is another model, which can rank them otherwise. For each temperature the start
model is sampled n times per problem; for each noise scale s, n models θ + s·ε (ε ~ N(0, I), every weight: IVON's
posterior at its initialization, where every σ is the same, scaled to s) each answer every problem greedily, so
that all their diversity comes from the weights. Both give, per setting, the accuracy of one answer (pass@1) and
the verifier-projected JS diversity of the n answers (minies/analysis.py, each answer taken as a member): the
curves of accuracy against diversity say which way of exploring keeps more accuracy at the same diversity.
"""
import numpy as np
import torch

from minies.analysis import answer_outcome, js_diversity
from minies.evaluate import evaluate
from minies.rollout import generate


@torch.no_grad()
def weight_noise(model, tokenizer, task, problems, scale, n, seed=0, micro_batch=256):
    """{"pass@1", "answer_diversity", "scale"} of n greedy answers per problem, each from θ + scale·ε_m."""
    params = [p for p in model.parameters()]
    theta0 = [p.detach().clone() for p in params]
    prompts = task.prompts(tokenizer, problems)
    outcomes, correct = [], []
    generator = torch.Generator().manual_seed(seed)
    for _ in range(n):
        for p, p0 in zip(params, theta0):
            p.copy_(p0 + scale * torch.randn(p.shape, generator=generator).to(p.device, p.dtype))
        r = generate(model, tokenizer, prompts, task.max_new_tokens, greedy=True, micro_batch=micro_batch)
        scores = [task.score(text, problem) for problem, text in zip(problems, r.texts)]
        outcomes.append([[answer_outcome(s)] for s in scores])
        correct.append([s.correct for s in scores])
    for p, p0 in zip(params, theta0):
        p.copy_(p0)  # exactly the start model again
    return {"scale": scale, "pass@1": float(np.mean(correct)), "answer_diversity": js_diversity(outcomes)}


def temperature(model, tokenizer, task, problems, value, n, seed=0):
    """The same two figures for n samples per problem at temperature `value`."""
    metrics = evaluate(model, tokenizer, task, problems, n=n, ks=[1], temperature=value, greedy=False, seed=seed)
    return {"temperature": value, "pass@1": metrics["pass@1"], "answer_diversity": metrics["answer_diversity"]}
