"""Qwen2.5's shapes and formats without its weights: for testing the real-model path with no download.

    python -m bench.qwen_shapes        # prints the memory table of docs/real-models.md (computed, not measured)

- QWEN2_SHAPES: the public config values of Qwen2.5-0.5B/1.5B/7B(-Instruct) (their config.json files);
- scaled_shape: the same architecture a thousand times smaller, for CPU tests;
- chatml_tokenizer: a byte-level tokenizer with Qwen2.5's special tokens and ChatML chat template;
- save_random_qwen2: a randomly initialized Qwen2ForCausalLM + that tokenizer, saved like a hub model;
- parameter_count / memory_rows: bytes per parameter of every method, read off the code (docs/real-models.md).
"""
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

_COMMON = dict(vocab_size=151936, tie_word_embeddings=True, rope_theta=1e6, max_position_embeddings=32768,
               rms_norm_eps=1e-6)
QWEN2_SHAPES = {
    "0.5b": dict(_COMMON, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2),
    "1.5b": dict(_COMMON, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2),
    "7b": dict(_COMMON, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
}
QWEN_05B = QWEN2_SHAPES["0.5b"]

SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
# ChatML as Qwen2.5-Instruct renders it (without tool calls): a default system message when the
# conversation has none, each message as <|im_start|>role\ncontent<|im_end|>\n.
CHATML = ("{%- if messages[0]['role'] != 'system' %}"
          "{{- '<|im_start|>system\\n" + SYSTEM + "<|im_end|>\\n' }}"
          "{%- endif %}"
          "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{%- endfor %}"
          "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # Qwen2.5's: pad, turn start, EOS of a turn


def scaled_shape(name, hidden=64, layers=2):
    """`name`'s architecture at about `hidden` width and `layers` blocks, for CPU tests: the same ratio of
    query heads to key/value heads (one kv head), an even head size (rotary embeddings need one), the
    same intermediate/hidden ratio and tying, and the vocabulary of chatml_tokenizer (259 ids).
    The hidden size is rounded to a multiple of the head count, as heads × head_dim = hidden in Qwen2."""
    full = QWEN2_SHAPES[name]
    heads = full["num_attention_heads"] // full["num_key_value_heads"]
    head_dim = 2 * max(1, round(hidden / heads / 2))
    width = heads * head_dim
    ratio = full["intermediate_size"] / full["hidden_size"]
    return dict(full, hidden_size=width, intermediate_size=round(width * ratio), num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=1, vocab_size=len(chatml_tokenizer()))


def chatml_tokenizer():
    """A byte-level tokenizer (one token per byte, no merges: any text round-trips) with Qwen2.5's special
    tokens and chat template; EOS <|im_end|>, pad <|endoftext|>, left padding, as Qwen2.5-Instruct."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tk = Tokenizer(models.BPE({c: i for i, c in enumerate(alphabet)}, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(SPECIAL)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  additional_special_tokens=["<|im_start|>"])
    tok.chat_template = CHATML
    tok.padding_side = "left"
    return tok


def save_random_qwen2(out_dir, shape, dtype="float32", seed=0):
    """Save a random Qwen2ForCausalLM of `shape` with chatml_tokenizer() to `out_dir`, as save_pretrained
    writes a hub model, so that minies.models.load_model/load_tokenizer (and --load-in-8bit) read it the
    same way. The vocabulary is at least the tokenizer's, so every id it produces has an embedding."""
    tok = chatml_tokenizer()
    torch.manual_seed(seed)
    config = Qwen2Config(**dict(shape, vocab_size=max(shape["vocab_size"], len(tok))),
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
    model = Qwen2ForCausalLM(config).to(getattr(torch, dtype)).eval()
    model.generation_config.top_k = None  # sample from the full distribution, as the shipped model does
    # Qwen2.5-Instruct's generation_config.json lists two end tokens: <|im_end|> and <|endoftext|>.
    model.generation_config.eos_token_id = [tok.eos_token_id, tok.convert_tokens_to_ids("<|endoftext|>")]
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return str(out_dir)


def parameter_count(shape, lora_rank=0):
    """Parameters of a Qwen2 model of `shape`, by how --load-in-8bit stores them, without building it:
    `linear` (the blocks' projection weights: int8 under 8-bit), `rows` (their output rows: one fp32 scale
    each), `other` (embeddings, an untied LM head, norms, q/k/v biases: kept in the load dtype, since
    bitsandbytes skips the head and converts only nn.Linear), `total`, `largest` (the biggest tensor: the
    embedding) and `lora` (adapters of rank `lora_rank` on the 7 projections of every block)."""
    h, inter, v = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    q = shape["num_attention_heads"] * shape.get("head_dim", h // shape["num_attention_heads"])
    kv = shape["num_key_value_heads"] * shape.get("head_dim", h // shape["num_attention_heads"])
    projections = [(h, q), (h, kv), (h, kv), (q, h), (h, inter), (h, inter), (inter, h)]  # (in, out)
    n = shape["num_hidden_layers"]
    linear = n * sum(i * o for i, o in projections)
    embeddings = v * h * (1 if shape["tie_word_embeddings"] else 2)
    other = embeddings + n * (q + 2 * kv + 2 * h) + h  # + biases of q, k, v, two norms per block; final norm
    return {"linear": linear, "rows": n * sum(o for _, o in projections), "other": other,
            "total": linear + other, "largest": v * h, "lora": n * lora_rank * sum(i + o for i, o in projections)}


def memory_rows(shape):
    """(method, weights, device bytes, host bytes) for each method on a model of `shape`: weights and
    optimizer/ES state only (no activations, KV cache or logits). Bytes per parameter as in docs/real-models.md."""
    c = parameter_count(shape, lora_rank=16)
    bf16, int8 = 2 * c["total"], c["linear"] + 4 * c["rows"] + 2 * c["other"]  # the weights as loaded
    # ES on the largest tensor: writing it holds σ·ε (computed in the fp32 noise itself) and, with the masters
    # in host memory (--master-device cpu), the master copied to the device; the update holds Σ c·ε and one ε
    es_temp = 8 * c["largest"]
    # AdamW on fp32 values (masters, adapters): the value 4, two moments 8, at the step the fp32 gradient 4 and
    # the sqrt of the second moments that the foreach implementation (CUDA's default) makes for all at once, 4
    adamw = 20
    # ES's host memory: 4 B per weight either way, the fp32 masters (--master-device cpu; θ0 then goes to a
    # temporary file, minies/runtime/spilled.py) or θ0 in pinned memory (the masters on the device)
    return [("ES in-place / lowrank", "bfloat16", bf16 + es_temp, 4 * c["total"]),
            ("ES in-place / lowrank", "8-bit", int8 + es_temp, 4 * c["total"]),
            ("GRPO, full, AdamW", "bfloat16", bf16 + adamw * c["total"], 0),
            ("GRPO, LoRA r=16, AdamW", "8-bit", int8 + adamw * c["lora"], 0),
            ("3PO, full, IVON", "bfloat16", 17 * bf16, 0),
            ("3PO, LoRA r=16, IVON", "8-bit", int8 + 36 * c["lora"], 0)]


def memory_table():
    """The markdown table of memory_rows for Qwen2.5-0.5B, 1.5B and 7B, in GiB."""
    names = list(QWEN2_SHAPES)
    rows = {name: memory_rows(QWEN2_SHAPES[name]) for name in names}
    head = " | ".join(f"{n.upper()} device" for n in names) + " | " + " | ".join(f"{n.upper()} host" for n in names)
    lines = [f"| method | weights | {head} |", "|---|---|" + "---:|" * 2 * len(names)]
    gib = lambda b: f"{b / 2**30:.1f}" if b else "-"  # noqa: E731
    for i, (method, weights, _, _) in enumerate(rows[names[0]]):
        cells = [gib(rows[n][i][2]) for n in names] + [gib(rows[n][i][3]) for n in names]
        lines.append(f"| {method} | {weights} | " + " | ".join(cells) + " |")
    counts = ", ".join(f"{n.upper()} {parameter_count(QWEN2_SHAPES[n])['total'] / 1e9:.3f}B" for n in names)
    return "\n".join(lines) + f"\n\nParameters: {counts}."


if __name__ == "__main__":
    print(memory_table())
