"""`Tokenizer.apply_chat_template`: the text and ids of transformers' ``apply_chat_template``, for the real
chat templates of Llama 3.1 / 3.2, Qwen 2.5 / 3, Mistral v0.3, Gemma 2 / 3 and Phi-3.5 (tests/io/data/
chat_templates, SOURCES.md there names each model), and zoo's default template for tokenizers without one.

Each family gets a small byte-level BPE tokenizer with the family's special tokens added, written as a
transformers folder (tokenizer.json + tokenizer_config.json holding the real template), which zoo and
``transformers.AutoTokenizer`` both load.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

import zoo
from zoo.io.tokenizer import ChatTemplateError, Tokenizer, TokenizerError, train_tokenizer
from zoo.io.tokenizer.chat import _compiled

transformers = pytest.importorskip("transformers")

DATA = Path(__file__).parent / "data" / "chat_templates"
DATE = {"date_string": "26 Jul 2024"}  # Llama 3.x print today's date otherwise

# family: (template file, {config key: token}, other added tokens)
FAMILIES: dict[str, tuple[str, dict[str, Any], list[str]]] = {
    "llama-3.1": (
        "llama-3.1-instruct.jinja",
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
        ["<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|python_tag|>"],
    ),
    "llama-3.2": (
        "llama-3.2-instruct.jinja",
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
        ["<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|python_tag|>"],
    ),
    "qwen2.5": (
        "qwen2.5-instruct.jinja",
        {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        ["<|im_start|>", "<tool_call>", "</tool_call>"],
    ),
    "qwen3": (
        "qwen3.jinja",
        {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        ["<|im_start|>", "<think>", "</think>", "<tool_call>", "</tool_call>"],
    ),
    "mistral-v0.3": (  # tokens as older configs write them: serialised AddedTokens
        "mistral-7b-instruct-v0.3.jinja",
        {
            "bos_token": {
                "__type": "AddedToken",
                "content": "<s>",
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
            },
            "eos_token": {
                "__type": "AddedToken",
                "content": "</s>",
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
            },
            "unk_token": "<unk>",
        },
        ["[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]", "[TOOL_RESULTS]"],
    ),
    "gemma-2": (
        "gemma-2-it.jinja",
        {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"},
        ["<start_of_turn>", "<end_of_turn>"],
    ),
    "gemma-3": (
        "gemma-3-it.jinja",
        {
            "bos_token": "<bos>",
            "eos_token": "<eos>",
            "pad_token": "<pad>",
            "image_token": "<image_soft_token>",
        },
        ["<start_of_turn>", "<end_of_turn>", "<start_of_image>"],
    ),
    "phi-3.5": (
        "phi-3.5-mini-instruct.jinja",
        {
            "bos_token": "<s>",
            "eos_token": "<|endoftext|>",
            "unk_token": "<unk>",
            "pad_token": "<|endoftext|>",
        },
        ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
    ),
}
SYSTEM_FREE = {"gemma-2"}  # its template refuses a system message
NO_GENERATION_PROMPT = {"mistral-v0.3"}  # its prompt ends with [/INST] either way

CHAT = [
    {"role": "user", "content": "Hello, how are you?"},
    {"role": "assistant", "content": " I'm fine — thanks! \n"},
    {"role": "user", "content": 'Écris « bonjour » en JSON: {"a": 1}'},
]
WITH_SYSTEM = [{"role": "system", "content": "You are terse.  "}, *CHAT]
PREFILL = [*CHAT, {"role": "assistant", "content": "Sure: here it is"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def base() -> str:
    """A byte-level BPE (every text encodes), as JSON: each family adds its tokens to a copy."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator([" ".join(m["content"] for m in WITH_SYSTEM)] * 4, trainer=trainer)
    return tok.to_str()


def write_folder(folder: Path, base: str, family: str, *, template_file: bool = False) -> Path:
    """A transformers folder for ``family``: its tokens added, its real template in the config (or in
    ``chat_template.jinja`` with ``template_file``)."""
    name, config_tokens, others = FAMILIES[family]
    tok = HFTokenizer.from_str(base)
    specials = [t["content"] if isinstance(t, dict) else t for t in config_tokens.values() if t is not None]
    tok.add_special_tokens(list(dict.fromkeys([*specials, *others])))
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    template = (DATA / name).read_text(encoding="utf-8")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **config_tokens}
    if template_file:
        (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
    else:
        config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return folder


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, base: str, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    # Llama 3.2's folder keeps its template in chat_template.jinja, as transformers >= 4.43 writes it.
    folder = write_folder(
        tmp_path_factory.mktemp(request.param),
        base,
        request.param,
        template_file=request.param == "llama-3.2",
    )
    return request.param, zoo.load_tokenizer(folder), transformers.AutoTokenizer.from_pretrained(folder)


def assert_same(
    ours: Tokenizer, theirs: Any, messages: list[dict[str, Any]], *, decodes: bool = True, **kwargs: Any
) -> str:
    """zoo and transformers give the same text and the same ids; returns the text. ``decodes``: the ids
    decode to the text (a byte-level tokenizer's do)."""
    text = ours.apply_chat_template(copy.deepcopy(messages), tokenize=False, **kwargs)
    assert isinstance(text, str)
    assert text == theirs.apply_chat_template(copy.deepcopy(messages), tokenize=False, **kwargs)
    ids = ours.apply_chat_template(copy.deepcopy(messages), **kwargs)
    assert ids == theirs.apply_chat_template(
        copy.deepcopy(messages), tokenize=True, return_dict=False, **kwargs
    )
    assert not decodes or theirs.decode(ids) == text  # the ids of the whole text, special tokens matched
    return text


# --- parity with transformers, family by family ---------------------------------------------------------
@pytest.mark.parametrize("generation_prompt", [False, True])
@pytest.mark.parametrize("messages", [CHAT, WITH_SYSTEM], ids=["chat", "with-system"])
def test_real_templates_render_as_transformers_does(
    family: tuple, messages: list[dict[str, Any]], generation_prompt: bool
) -> None:
    name, ours, theirs = family
    assert ours.has_chat_template and ours.chat_template == theirs.chat_template
    if name in SYSTEM_FREE and messages is WITH_SYSTEM:
        with pytest.raises(ChatTemplateError, match="System role not supported") as caught:
            ours.apply_chat_template(messages, add_generation_prompt=generation_prompt)
        assert "tokenizer_config.json" in str(caught.value)
        with pytest.raises(Exception, match="System role not supported"):
            theirs.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)
        return
    text = assert_same(ours, theirs, messages, add_generation_prompt=generation_prompt, **DATE)
    assert "Hello, how are you?" in text and "bonjour" in text  # rendered, not empty
    other = ours.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=not generation_prompt, **DATE
    )
    assert (other == text) == (name in NO_GENERATION_PROMPT)  # the switch reaches the template


def test_continue_final_message_leaves_the_last_message_open(family: tuple) -> None:
    _, ours, theirs = family
    text = assert_same(ours, theirs, PREFILL, continue_final_message=True, **DATE)
    assert text.endswith("Sure: here it is")
    with pytest.raises(ChatTemplateError, match="continue_final_message and add_generation_prompt"):
        ours.apply_chat_template(PREFILL, continue_final_message=True, add_generation_prompt=True)


@pytest.mark.parametrize("family_name", ["llama-3.1", "llama-3.2", "qwen2.5", "qwen3", "mistral-v0.3"])
def test_tools_render_as_transformers_does(family_name: str, base: str, tmp_path: Path) -> None:
    folder = write_folder(tmp_path / family_name, base, family_name)
    ours, theirs = zoo.load_tokenizer(folder), transformers.AutoTokenizer.from_pretrained(folder)
    text = assert_same(ours, theirs, CHAT, tools=[WEATHER], add_generation_prompt=True, **DATE)
    assert "get_weather" in text


def test_tool_calls_and_results_render_as_transformers_does(base: str, tmp_path: Path) -> None:
    # An OpenAI-style turn: the assistant's content is None beside its tool calls (the key is dropped).
    turns = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
            ],
        },
        {"role": "tool", "content": '{"temperature": 21}'},
    ]
    for family_name in ("qwen2.5", "qwen3"):
        folder = write_folder(tmp_path / family_name, base, family_name)
        ours, theirs = zoo.load_tokenizer(folder), transformers.AutoTokenizer.from_pretrained(folder)
        if family_name == "qwen3":  # this Qwen3 template reads the content of every assistant turn: both fail
            with pytest.raises(ChatTemplateError, match="has no attribute 'content'"):
                ours.apply_chat_template(turns, tools=[WEATHER])
            with pytest.raises(Exception, match="has no attribute 'content'"):
                theirs.apply_chat_template(turns, tools=[WEATHER], tokenize=False)
            turns[1]["content"] = ""
        text = assert_same(ours, theirs, turns, tools=[WEATHER], add_generation_prompt=True)
        assert '"city": "Paris"' in text and "<tool_response>" in text


def test_qwen3_thinking_switch_and_reasoning_fields_render_as_transformers_does(
    base: str, tmp_path: Path
) -> None:
    folder = write_folder(tmp_path / "qwen3", base, "qwen3")
    ours, theirs = zoo.load_tokenizer(folder), transformers.AutoTokenizer.from_pretrained(folder)
    text = assert_same(ours, theirs, CHAT, add_generation_prompt=True, enable_thinking=False)
    assert text.endswith("<think>\n\n</think>\n\n")
    # reasoning given under "reasoning": transformers copies it to "reasoning_content", which Qwen3 reads.
    reasoned = [*CHAT, {"role": "assistant", "content": "Done.", "reasoning": "They want JSON."}]
    text = assert_same(ours, theirs, reasoned)
    assert "<think>\nThey want JSON.\n</think>" in text


def test_llama_3_2_prints_today_without_a_date_string(base: str, tmp_path: Path) -> None:
    from datetime import datetime

    folder = write_folder(tmp_path / "llama", base, "llama-3.2", template_file=True)
    ours, theirs = zoo.load_tokenizer(folder), transformers.AutoTokenizer.from_pretrained(folder)
    text = assert_same(ours, theirs, CHAT)
    assert f"Today Date: {datetime.now().strftime('%d %b %Y')}" in text


def test_content_parts_pass_through_as_transformers_does(base: str, tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "gemma", base, "gemma-3")
    ours, theirs = zoo.load_tokenizer(folder), transformers.AutoTokenizer.from_pretrained(folder)
    parts = [
        {"role": "system", "content": [{"type": "text", "text": "Be kind."}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " What is this? "}]},
    ]
    text = assert_same(ours, theirs, parts, add_generation_prompt=True)
    assert "Be kind.\n\n<start_of_image>What is this?<end_of_turn>" in text
    prefill = [*parts, {"role": "assistant", "content": [{"type": "text", "text": "It is a"}]}]
    assert assert_same(ours, theirs, prefill, continue_final_message=True).endswith("It is a")


def test_named_templates_pick_tool_use_with_tools(base: str, tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "named", base, "qwen2.5")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    tool_use = "{% for m in messages %}{{ m['content'] }}{% endfor %}[TOOLS]{{ tools | tojson(indent=2) }}"
    config["chat_template"] = [{"name": "default", "template": config["chat_template"]},
                               {"name": "tool_use", "template": tool_use}]  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    ours, theirs = zoo.load_tokenizer(folder), transformers.AutoTokenizer.from_pretrained(folder)
    assert set(ours.chat_templates) == {"default", "tool_use"}
    assert "<|im_start|>" in assert_same(ours, theirs, CHAT)
    assert "[TOOLS]" in assert_same(ours, theirs, CHAT, tools=[WEATHER])
    assert "[TOOLS]" in assert_same(ours, theirs, CHAT, chat_template="tool_use", tools=[])


def test_a_chat_template_file_wins_over_the_config_as_in_transformers(base: str, tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "both", base, "phi-3.5")
    (folder / "chat_template.jinja").write_text("{{ messages[0]['content'] }}!", encoding="utf-8")
    ours, theirs = zoo.load_tokenizer(folder), transformers.AutoTokenizer.from_pretrained(folder)
    assert assert_same(ours, theirs, CHAT) == "Hello, how are you?!"


@pytest.mark.parametrize(
    "template",
    [
        "{{ data | tojson }}",
        "{{ data | tojson(indent=2) }}|{{ data | tojson(separators=(',', ':'), sort_keys=true) }}",
        "{% generation %}{{ messages[0]['content'] }}{% endgeneration %}{% for x in [1, 2, 3] %}"
        "{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}",
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}"
        "{{ dict(a=1) | tojson }}{{ eos_token }}{{ sep_token is defined }}",
        "  {% if true %}\n    x\n  {% endif %}\n{{ messages | length }}",  # trim_blocks, lstrip_blocks
    ],
)
def test_environment_matches_transformers(base: str, tmp_path: Path, template: str) -> None:
    folder = write_folder(tmp_path / "env", base, "phi-3.5")
    ours, theirs = zoo.load_tokenizer(folder), transformers.AutoTokenizer.from_pretrained(folder)
    data = {"é": ["ü", 1.5, None, True], "b": {"c": "<tag>"}}
    assert_same(ours, theirs, CHAT, chat_template=template, data=data)


# --- zoo's default template -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained() -> Tokenizer:
    return train_tokenizer(
        iter(["hello there", "how are you", "fine thanks"] * 20), kind="bpe", vocab_size=120
    )


def test_a_trained_tokenizer_uses_the_default_template(trained: Tokenizer) -> None:
    assert not trained.has_chat_template and trained.chat_template is None
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "fine thanks"}]
    text = trained.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<s>user: hello</s>assistant: fine thanks</s>assistant:"
    ids = trained.apply_chat_template(messages, add_generation_prompt=True)
    assert isinstance(ids, list) and ids[0] == trained.bos_id and ids.count(trained.eos_id) == 2
    assert ids == trained.encode(text, add_eos=False)
    parts = [{"role": "user", "content": [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}]}]
    assert trained.apply_chat_template(parts, tokenize=False) == "<s>user: hello</s>"


def test_the_default_template_writes_only_the_tokens_a_tokenizer_has() -> None:
    bare = HFTokenizer(models.WordLevel({"[UNK]": 0, "hi": 1}, unk_token="[UNK]"))
    bare.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = Tokenizer(bare)
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "user: hi\n"


def test_the_default_template_exported_renders_the_same_in_transformers(
    trained: Tokenizer, tmp_path: Path
) -> None:
    tok = Tokenizer(trained.hf, chat_template=trained.default_chat_template)
    tok.save_pretrained(tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert_same(tok, theirs, CHAT, add_generation_prompt=True, decodes=False)  # its vocabulary lacks "É"


# --- saving ---------------------------------------------------------------------------------------------
def test_save_pretrained_keeps_the_template_for_transformers(base: str, tmp_path: Path) -> None:
    source = write_folder(tmp_path / "src", base, "gemma-3")
    tok = zoo.load_tokenizer(source)
    tok.save_pretrained(tmp_path / "out")
    config = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())
    assert config["chat_template"] == tok.chat_template and config["image_token"] == "<image_soft_token>"
    again = Tokenizer.from_file(tmp_path / "out")
    assert again.chat_template == tok.chat_template
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    text = assert_same(again, theirs, WITH_SYSTEM, add_generation_prompt=True)
    assert text == tok.apply_chat_template(WITH_SYSTEM, tokenize=False, add_generation_prompt=True)


def test_zoo_save_keeps_the_template(base: str, tmp_path: Path) -> None:
    tok = zoo.load_tokenizer(write_folder(tmp_path / "src", base, "qwen3"))
    model = zoo.build(zoo.preset("gpt2-tiny", vocab_size=tok.vocab_size))
    zoo.save(model, tmp_path / "ckpt", tokenizer=tok)
    assert (tmp_path / "ckpt" / "tokenizer_config.json").is_file()
    loaded = zoo.load_tokenizer(tmp_path / "ckpt")
    assert loaded.chat_template == tok.chat_template and loaded.eos_id == tok.eos_id
    kwargs: dict[str, Any] = {"add_generation_prompt": True, "enable_thinking": False}
    assert loaded.apply_chat_template(CHAT, **kwargs) == tok.apply_chat_template(CHAT, **kwargs)
    # A tokenizer without a template, saved over it, leaves none behind.
    zoo.save(model, tmp_path / "ckpt", tokenizer=Tokenizer(tok.hf))
    assert not zoo.load_tokenizer(tmp_path / "ckpt").has_chat_template


# --- errors ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ("hello", "must be a non-empty list"),
        ([], "must be a non-empty list"),
        ([{"role": "user", "content": "a"}, "b"], r"messages\[1\] must be a mapping"),
        ([{"content": "a"}], r"messages\[0\]\['role'\] is missing"),
        ([{"role": 3, "content": "a"}], r"messages\[0\]\['role'\] must be a string, got int"),
        ([{"role": "user", "content": 7}], r"messages\[0\]\['content'\] must be a string or a list"),
        (
            [{"role": "user", "content": [{"text": "a"}]}],
            r"messages\[0\]\['content'\]\[0\] must be a mapping",
        ),
        (
            [{"role": "user", "content": [{"type": "text"}]}],
            r"messages\[0\]\['content'\]\[0\]\['text'\] is missing",
        ),
    ],
)
def test_bad_messages_are_one_error_naming_the_message(
    trained: Tokenizer, messages: Any, expected: str
) -> None:
    with pytest.raises(ChatTemplateError, match=expected):
        trained.apply_chat_template(messages)


def test_template_errors_name_the_file(base: str, tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "bad", base, "phi-3.5")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}{{ m['content'] }"
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    tok = zoo.load_tokenizer(folder)
    with pytest.raises(
        ChatTemplateError, match=r"tokenizer_config.json: the chat template is not valid Jinja"
    ):
        tok.apply_chat_template(CHAT)
    with pytest.raises(ChatTemplateError, match=r"the chat_template argument: .*SecurityError"):
        tok.apply_chat_template(CHAT, chat_template="{{ messages.__class__.__name__ }}")
    with pytest.raises(ChatTemplateError, match="may not set '_x'"):
        tok.apply_chat_template(CHAT, chat_template="{% set ns = namespace() %}{% set ns._x = 1 %}")
    with pytest.raises(ChatTemplateError, match=r"tools\[0\] must be a mapping"):
        tok.apply_chat_template(CHAT, chat_template="x", tools=["get_weather"])
    config["chat_template"] = {"default": "x"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(TokenizerError, match="chat_template must be a string or a list"):
        Tokenizer.from_file(folder)


def test_a_template_is_compiled_once() -> None:
    source = "{{ messages | length }} compiled once"
    assert _compiled(source) is _compiled(source)


def test_importing_the_tokenizer_does_not_import_jinja2() -> None:
    code = "import sys, zoo; from zoo.io.tokenizer import Tokenizer; sys.exit('jinja2' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
