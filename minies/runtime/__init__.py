"""The runtime: how minies runs, not what it computes. A learner can skip this package.

threads.py     CPU threads that leave room for other programs (set_up_process turns it on)
allocator.py   glibc's malloc keeps freed memory for the next large tensor (set_up_process)
decoding.py    on CUDA: a static KV cache and a compiled decoding step
placement.py   ES: which mode scores the population, and where its fp32 masters live
spilled.py     tensors kept in a temporary file, not in memory: ES's θ0 on a CPU
masters.py     fp32 master weights for an optimizer of half-precision parameters
distributed.py torchrun: ranks, sharding, all-reduce
checkpoint.py  atomic checkpoints, the log's truncation, files written with one-line errors
resume.py      --resume: which checkpoint, whether this command may continue it, restoring it
run_lock.py    one process per run directory; a killed holder's lock taken over
guard.py       stops a diverging run before it saves
"""
import logging

import torch

from minies.runtime import allocator, threads


def set_up_process(device):
    """Every process-wide setting minies makes, in one call that train.py, eval.py and the benches make first.
    Nothing computed changes; library code never changes them behind a caller's back.
    - transformers' and huggingface_hub's own bars and warnings off: they would clutter minies' progress bars,
      and without a network the one-line error minies prints says it all; bitsandbytes' log off (it logs at
      every 8-bit matmul that casts its fp32 inputs, and at import that an optional CPU kernel is missing).
    - On a CPU (`device`): glibc's malloc keeps freed memory for the next large tensor (allocator.py), and each
      generation runs on the cores other programs leave free (threads.py)."""
    import huggingface_hub
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    huggingface_hub.utils.logging.set_verbosity_error()
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    if torch.device(device).type == "cpu":
        allocator.reuse_freed_memory()
        threads.follow_load_from_now_on()
