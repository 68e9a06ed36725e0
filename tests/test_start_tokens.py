"""Start tokens as the tokenizer intends: a raw prompt (no chat template) gets the special tokens the tokenizer
puts before a text, once; a chat-templated prompt gets exactly what its template writes, never a second one.
Prompts are encoded without special tokens (rollout.encode), so the prompt string is what the model reads."""
import json
import shutil

import pytest

from minies.models import SHIPPED_MODEL, load_tokenizer
from minies.rollout import encode, format_prompts, start_text

# A template that writes nothing of its own before the turns, and one that starts with the BOS as Llama 3's does.
PLAIN_TEMPLATE = "{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}<|assistant|>"
BOS_TEMPLATE = "{{ bos_token }}" + PLAIN_TEMPLATE


def tokenizer_dir(tmp_path, adds_bos, template):
    """The shipped model's tokenizer, made to add a <s> before every text it encodes (or not), with a chat
    template (or none)."""
    shutil.copytree(SHIPPED_MODEL, tmp_path, dirs_exist_ok=True)
    data = json.loads((tmp_path / "tokenizer.json").read_text())
    bos = len(data["model"]["vocab"])
    data["model"]["vocab"]["<s>"] = bos
    data["added_tokens"].append({"id": bos, "content": "<s>", "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": False, "special": True})
    if adds_bos:
        data["post_processor"] = {"type": "TemplateProcessing",
                                  "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                             {"Sequence": {"id": "A", "type_id": 0}}],
                                  "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                                  "special_tokens": {"<s>": {"id": "<s>", "ids": [bos], "tokens": ["<s>"]}}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["bos_token"] = "<s>"
    config.pop("chat_template", None)
    if template:
        config["chat_template"] = template
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "chat_template.jinja").unlink(missing_ok=True)
    return load_tokenizer(str(tmp_path)), bos


@pytest.mark.parametrize("adds_bos", [True, False])
def test_raw_prompts_start_as_the_tokenizer_starts_a_text(tmp_path, adds_bos):
    tok, bos = tokenizer_dir(tmp_path, adds_bos, template=None)
    assert tok("1+2")["input_ids"][:1] == ([bos] if adds_bos else tok("1+2", add_special_tokens=False)["input_ids"][:1])
    prompts = format_prompts(tok, ["1+2", "30+4"], chat_template=True, prefill="=")
    assert prompts == [("<s>" if adds_bos else "") + q for q in ("1+2=", "30+4=")]
    ids = encode(tok, prompts)["input_ids"]
    assert (ids == bos).sum(1).tolist() == ([1, 1] if adds_bos else [0, 0])
    # What the model reads is what tokenizing the question the tokenizer's own way gives.
    assert ids[1].tolist() == tok("30+4=")["input_ids"]


@pytest.mark.parametrize("adds_bos", [True, False])
@pytest.mark.parametrize("template", [PLAIN_TEMPLATE, BOS_TEMPLATE])
def test_chat_prompts_hold_what_their_template_writes_once(tmp_path, adds_bos, template):
    tok, bos = tokenizer_dir(tmp_path, adds_bos, template)
    prompt = format_prompts(tok, ["1+2"], chat_template=True)[0]
    assert prompt == ("<s>" if template == BOS_TEMPLATE else "") + "<|user|>1+2<|assistant|>"
    ids = encode(tok, [prompt])["input_ids"][0]
    assert int((ids == bos).sum()) == (1 if template == BOS_TEMPLATE else 0)
    # --no-chat-template: the raw question, with the tokenizer's own start tokens.
    raw = format_prompts(tok, ["1+2"], chat_template=False)[0]
    assert raw == ("<s>" if adds_bos else "") + "1+2"


def test_the_shipped_tokenizers_add_nothing():
    """Their prompts, hence every pinned result, are unchanged."""
    from minies.models import SHIPPED_MODELS

    for path in {SHIPPED_MODEL, *SHIPPED_MODELS.values()}:
        assert start_text(load_tokenizer(path)) == ""
