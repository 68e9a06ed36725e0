"""Loading causal language models and their tokenizers: a hub id, a local directory or a GGUF file (converted
once to a directory: minies/gguf.py), float32 / bfloat16 / float16, or LLM.int8 through bitsandbytes (on CUDA
and on CPU)."""
import json
import os
import sys
from typing import NamedTuple

import torch

from minies import UserError
from minies.gguf import convert_gguf, damaged_copy_hint, is_gguf, packaged_file

SHIPPED_MODEL = os.path.join(os.path.dirname(__file__), "assets", "tiny")
# The shipped model trained on each task (docs/tiny-model.md); any other task uses SHIPPED_MODEL.
SHIPPED_MODELS = {"arithmetic": SHIPPED_MODEL,
                  "countdown": os.path.join(os.path.dirname(__file__), "assets", "tiny-countdown")}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def default_model(task):
    """The model used when --model is not given: the shipped model trained on `task`, else SHIPPED_MODEL."""
    return SHIPPED_MODELS.get(task, SHIPPED_MODEL)


class LocalModel(NamedTuple):
    """A --model resolved (resolve_model): `name` as given, for messages; `path`, what transformers reads."""
    name: str
    path: str


def resolve_model(name):
    """Model `name` (a LocalModel, resolved already, is returned as it is) as transformers reads it: a GGUF file's
    converted directory (converted on first use, minies/gguf.py; a packaged model's name stands for its file),
    else `name` with ~ expanded (a local directory or a hub id). The scripts resolve --model once and hand the
    result to load_config, load_tokenizer and load_model, which resolve a plain name themselves."""
    if isinstance(name, LocalModel):
        return name
    file = packaged_file(name)
    _check_source(file)
    return LocalModel(name, convert_gguf(file) if is_gguf(file) else os.path.expanduser(file))


def load_config(name=SHIPPED_MODEL):
    """The model's transformers config (config.json alone, no weights): enough to choose defaults before
    a large model is loaded."""
    from transformers import AutoConfig

    name, path = resolve_model(name)
    try:
        return AutoConfig.from_pretrained(path)
    except Exception as e:  # network, missing files, bad id: one line for the user
        raise UserError(f"--model {name}: cannot load its config ({type(e).__name__}: {str(e).splitlines()[0]})"
                        f"{damaged_copy_hint(name)}")


def position_notes(config, max_new_tokens):
    """A note for the user when the completions alone may run past the positions the model was trained on
    (its config's max_position_embeddings): a rotary model still generates there, but from positions it never
    saw, so its completions degrade; the run goes on, as the user may mean it."""
    positions = getattr(config, "max_position_embeddings", None)
    if positions and max_new_tokens >= positions:
        return [f"--max-new-tokens {max_new_tokens} reaches past the {positions} positions the model was trained on "
                "(max_position_embeddings in its config.json): what it generates there is outside what it learned"]
    return []


NOTED = set()  # the models note_long_prompts has spoken for


def note_long_prompts(model, width, max_new_tokens):
    """Once per model, a note when prompts of `width` tokens and their completions run past the positions the
    model was trained on (models.position_notes speaks for --max-new-tokens alone): a long data row makes every
    step slow, and the model generates from positions it never saw."""
    positions = getattr(model.config, "max_position_embeddings", None)
    if positions and max_new_tokens < positions < width + max_new_tokens and id(model) not in NOTED:
        NOTED.add(id(model))
        print(f"note: a prompt of {width} tokens with {max_new_tokens} new ones runs past the {positions} positions "
              "the model was trained on: its steps slow down, and it generates from positions it never saw; shorten "
              "what makes prompts long (rows of --data, --system, the numbers of generated problems)", file=sys.stderr)


def default_device():
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _check_source(name):
    # A hub id is "name" or "owner/name": a second "/" makes it a path.
    looks_local = os.path.isabs(name) or name.startswith((".", "~")) or name.count("/") > 1 or os.path.exists(name)
    if looks_local and not is_gguf(name) and not os.path.isdir(os.path.expanduser(name)):
        raise UserError(f"--model {name}: no such directory; give a local model directory, a .gguf file or a hub id")


def tokenizer_class(path):
    """The tokenizer class a local model directory's tokenizer_config.json names, or None."""
    config_file = os.path.join(path, "tokenizer_config.json")
    if not os.path.isfile(config_file):
        return None
    with open(config_file) as f:
        return json.load(f).get("tokenizer_class")


def load_tokenizer(name=SHIPPED_MODEL):
    """The tokenizer, set up for batched generation with a decoder-only model: left padding, and a
    pad token (the EOS token when the model defines none, as Llama does)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    name, path = resolve_model(name)
    # A local tokenizer.json saved as a plain fast tokenizer (the shipped models' character tokenizer) is
    # loaded as it is: AutoTokenizer would make it a Qwen2Tokenizer for a qwen2 config, whose byte-level
    # pre-tokenizer drops spaces ("Use 3 7" would lose them).
    plain = tokenizer_class(path) in ("TokenizersBackend", "PreTrainedTokenizerFast")
    try:
        tok = (PreTrainedTokenizerFast if plain else AutoTokenizer).from_pretrained(path)
    except Exception as e:  # network, missing files, bad id: one line for the user
        raise UserError(f"--model {name}: cannot load its tokenizer ({type(e).__name__}: {str(e).splitlines()[0]})"
                        f"{damaged_copy_hint(name)}")
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(name=SHIPPED_MODEL, dtype="float32", load_in_8bit=False, device=None):
    """A causal LM in eval mode on `device` (default: CUDA if present, else CPU).

    With `load_in_8bit`, every nn.Linear except the output head becomes a bitsandbytes Linear8bitLt
    holding int8 weights with one fp32 scale per row; embeddings and norms stay in `dtype`.
    """
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    if dtype not in DTYPES:
        raise UserError(f"--dtype {dtype}: choose one of {', '.join(DTYPES)}")
    name, path = resolve_model(name)
    device = torch.device(device) if device is not None else default_device()
    kwargs = {"dtype": DTYPES[dtype]}
    if load_in_8bit:
        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
        kwargs["device_map"] = {"": device.index if device.type == "cuda" else "cpu"}
    try:
        model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True, **kwargs)
    except Exception as e:
        raise UserError(f"--model {name}: cannot load it ({type(e).__name__}: {str(e).splitlines()[0]})"
                        f"{damaged_copy_hint(name)}")
    check_loaded(name, info)
    if not load_in_8bit:
        model.to(device)
    model.eval()
    contiguous_head_input(model)
    return model


def contiguous_head_input(model):
    """Give the output head (the LM head) a contiguous input. At a prompt's pass, generate asks for the last
    position's logits only, and transformers hands the head hidden_states[:, -1:, :], a strided view. torch's
    matmul multiplies such a 3-D view by a weight that needs no gradient (ES, a LoRA-frozen base) as a
    batched matmul over the weight repeated for every row: on Qwen2.5-0.5B's 151,936 × 896 head and 16 rows
    in bfloat16, where the repeats are materialized, this took 12.2 s and 4.3 GB against 0.03 s for the same
    rows made contiguous (float32, not materialized: 0.38 s against 0.11 s). The copy of the one row per
    prompt costs nothing by comparison."""
    head = model.get_output_embeddings()
    if head is not None:
        head.register_forward_pre_hook(_contiguous_input)


def _contiguous_input(module, args):
    return None if args[0].is_contiguous() else (args[0].contiguous(), *args[1:])


def check_loaded(name, info):
    """A UserError when the weights on disk do not fit the architecture (transformers' loading info): a weight
    it lacks would be silently initialized at random, and an extra one (another architecture's, or a file
    written by a different version) silently dropped. Tied weights (a head that shares the embedding) are
    not stored and are not missing; older checkpoints' rotary-frequency buffers are recomputed on load."""
    problems = {what: sorted(k for k in info.get(key) or () if not k.endswith("inv_freq"))
                for what, key in (("lacks", "missing_keys"), ("has unexpected", "unexpected_keys"),
                                  ("has wrongly shaped", "mismatched_keys"))}
    found = [f"{what} {len(keys)} weight(s) ({', '.join(map(str, keys[:3]))})" for what, keys in problems.items() if keys]
    if found:
        raise UserError(f"--model {name}: its weights do not fit its architecture: it {'; it '.join(found)}; the "
                        f"file is damaged or from another model{damaged_copy_hint(name)}")


def model_device(model):
    return next(model.parameters()).device


def int8_row_scales(linear):
    """The fp32 row scales of a bitsandbytes Linear8bitLt (W ≈ W_int8 · scale / 127), as a column: a view,
    so writing into it changes the layer's scales (ES rescales rows this way). bitsandbytes keeps them on
    the weight until the first forward, then on the layer's state."""
    scales = linear.weight.SCB if linear.weight.SCB is not None else linear.state.SCB
    return scales[:, None]
