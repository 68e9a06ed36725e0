"""What a task can only check once the model's tokenizer is known, before any step runs: that an answer fits in
--max-new-tokens, and that --system is a message the model reads and fits in its positions. A problem whose
every answer is cut off scores 0 however the model learns, and a system message no template renders is
dropped: both would run for hours in silence.

Lengths are in the tokens of the model's own tokenizer, of the shortest completion the verifier accepts
(Task.shortest_answer): the hardest generated problem's (Task.hardest_problem) is refused when it cannot fit;
a data file's rows that cannot are counted in a note (the rest train)."""
from minies import UserError

# Rows of the data files whose answers are measured: parsing and tokenizing take ~20 µs a row, so a file of
# half a million rows is sampled by its first ones.
CHECKED_ROWS = 20_000


def token_counts(tokenizer, texts):
    return [len(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]] if texts else []


def check_answer_room(task, tokenizer):
    """A UserError when the hardest generated problem's shortest answer is longer than --max-new-tokens; for
    data files, notes (strings) counting the rows whose answers are."""
    hardest = task.hardest_problem()
    if hardest is not None:
        answer = task.shortest_answer(hardest)
        need = token_counts(tokenizer, [answer])[0]
        if need > task.max_new_tokens:
            raise UserError(f"{task.difficulty_flags()}: an answer can take {need} tokens ({answer!r} with "
                            f"{task.prompt_style} prompts), past --max-new-tokens {task.max_new_tokens}: it would be "
                            f"cut off and score 0; pass --max-new-tokens {need} or more, or lower --high or --numbers")
        return []
    rows = [problem for split in (task._test, task._train or []) for problem in split[:CHECKED_ROWS]]
    lengths = token_counts(tokenizer, [task.shortest_answer(problem) for problem in rows])
    too_long = [n for n in lengths if n > task.max_new_tokens]
    if not too_long:
        return []
    return [f"{len(too_long)} of the {len(rows)} problems checked in the data files need an answer longer than "
            f"--max-new-tokens {task.max_new_tokens} (up to {max(too_long)} tokens): no completion can answer them, "
            "and they score 0"]


def check_system(task, tokenizer, chat_template, system, positions, max_new_tokens):
    """A UserError when --system `system` (None: not given) would be dropped (no chat template renders it) or
    alone fills the model's `positions` (its max_position_embeddings; None: unknown) with the completion."""
    if system is None:
        return
    if not chat_template:
        raise UserError("--system: with --no-chat-template the prompts are raw text, which has no system message; "
                        "drop --system or --no-chat-template")
    if not tokenizer.chat_template:
        raise UserError("--system: the model's tokenizer has no chat template, so its prompts have no system "
                        "message; drop --system")
    if system.strip() and system.strip() not in task.prompts(tokenizer, task.test_problems(1), chat_template)[0]:
        raise UserError("--system: the model's chat template does not write a system message; drop --system")
    length = token_counts(tokenizer, [system])[0]
    if positions and length + max_new_tokens > positions:
        raise UserError(f"--system: {length} tokens, which with --max-new-tokens {max_new_tokens} run past the "
                        f"{positions} positions the model was trained on (max_position_embeddings) in every prompt; "
                        "shorten it")
