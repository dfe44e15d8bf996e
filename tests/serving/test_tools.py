"""Tool calling (`zoo.serving.tools`): each held chat template's format found and read back from literal
answers; tools, the assistant's calls and the tools' results rendered as transformers renders them; and
through the real `openai` client, a server whose tokenizer carries Qwen 2.5's template (Hermes format)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

import zoo
from tests.io.test_chat_template import DATA, FAMILIES, write_folder
from tests.serving.conftest import tiny_decoder
from zoo.serving import Engine
from zoo.serving.chat import check_messages
from zoo.serving.requests import RequestError
from zoo.serving.server import Server
from zoo.serving.tools import FORMATS, CallStream, read_calls, read_tools, tool_format

transformers = pytest.importorskip("transformers")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}
FORMAT = {f.name: f for f in FORMATS}
SPEAKS = {
    "qwen2.5": "hermes",
    "qwen3": "hermes",
    "llama-3.1": "llama3",
    "llama-3.2": "llama3",
    "mistral-v0.3": "mistral",
    "gemma-2": None,
    "gemma-3": None,
    "phi-3.5": None,
}


def _tools(format_name: str, **body: Any) -> Any:
    tools = read_tools({"tools": [WEATHER, TIME], **body}, FORMAT[format_name])
    assert tools is not None
    return tools


def _called(found: Any) -> list[tuple[str, dict[str, Any]]]:
    assert found is not None
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in found[1]]


@pytest.mark.parametrize("family", sorted(SPEAKS))
def test_each_held_template_speaks_its_format(family: str) -> None:
    found = tool_format((DATA / FAMILIES[family][0]).read_text(encoding="utf-8"))
    assert (found and found.name) == SPEAKS[family]


PARIS = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
ANSWERS = [  # (format, answer, content, calls); calls None: plain content
    ("hermes", f"<tool_call>\n{PARIS}\n</tool_call>", None, [("get_weather", {"city": "Paris"})]),
    (
        "hermes",
        f'Let me look.\n<tool_call>\n{PARIS}\n</tool_call>\n<tool_call>{{"name": "get_time", "arguments": {{}}}}'
        "</tool_call>",
        "Let me look.",
        [("get_weather", {"city": "Paris"}), ("get_time", {})],
    ),
    ("hermes", f"<tool_call>\n{PARIS}", None, [("get_weather", {"city": "Paris"})]),  # cut at the close
    (  # the arguments as a JSON string, as some models write them
        "hermes",
        '<tool_call>{"name": "get_time", "arguments": "{}"}</tool_call>',
        None,
        [("get_time", {})],
    ),
    ("hermes", "It is sunny in Paris.", None, None),
    ("hermes", '<tool_call>{"name": "get_news", "arguments": {}}</tool_call>', None, None),  # unknown
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>', None, None),
    ("hermes", f"<tool_call>{PARIS}</tool_call> and more text", None, None),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": [1]}</tool_call>', None, None),
    (
        "llama3",
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        None,
        [("get_weather", {"city": "Paris"})],
    ),
    (
        "llama3",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", '
        '"parameters": {}}',
        None,
        [("get_weather", {"city": "Paris"}), ("get_time", {})],
    ),
    ("llama3", "Paris is sunny: {not a call}", None, None),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}} trailing', None, None),
    (
        "mistral",
        f"[TOOL_CALLS] [{PARIS}, {{'name': 1}}]".replace(
            "{'name': 1}", '{"name": "get_time", "arguments": {}}'
        ),
        None,
        [("get_weather", {"city": "Paris"}), ("get_time", {})],
    ),
    ("mistral", f"Sure. [TOOL_CALLS] [{PARIS}]", "Sure.", [("get_weather", {"city": "Paris"})]),
    ("mistral", "[TOOL_CALLS] [{]", None, None),
]


@pytest.mark.parametrize(("format_name", "answer", "content", "calls"), ANSWERS)
def test_answers_are_read_into_tool_calls_or_left_as_content(
    format_name: str, answer: str, content: str | None, calls: list | None
) -> None:
    found = read_calls(answer, _tools(format_name))
    if calls is None:
        assert found is None
        return
    assert found is not None and found[0] == content and _called(found) == calls
    for call in found[1]:
        assert call["type"] == "function" and isinstance(call["function"]["arguments"], str)
        if format_name == "mistral":  # its template takes 9 letters and digits in later turns
            assert len(call["id"]) == 9 and call["id"].isalnum()
        else:
            assert call["id"].startswith("call_")
    assert len({c["id"] for c in found[1]}) == len(found[1])


def test_parallel_tool_calls_false_keeps_the_first_call() -> None:
    answer = f'<tool_call>{PARIS}</tool_call><tool_call>{{"name": "get_time", "arguments": {{}}}}</tool_call>'
    assert len(_called(read_calls(answer, _tools("hermes")))) == 2
    assert _called(read_calls(answer, _tools("hermes", parallel_tool_calls=False))) == [
        ("get_weather", {"city": "Paris"})
    ]


def test_a_forced_answer_is_read_after_the_opener_the_prompt_ends_with() -> None:
    forced = _tools("hermes", tool_choice="required")
    assert _called(read_calls(PARIS + "\n</tool_call>", forced, forced=True)) == [
        ("get_weather", {"city": "Paris"})
    ]
    mistral = _tools("mistral", tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert mistral.choice == "get_weather"
    assert _called(read_calls(f" [{PARIS}]", mistral, forced=True)) == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize(
    ("format_name", "pieces", "sent", "calls"),
    [
        ("hermes", ["It is ", "sunny <tool", "_call>\n", PARIS, "\n</tool_call>"], "It is sunny ", 1),
        ("hermes", ["a <tool", " b"], "a <tool b", 0),  # held while it could begin a call, then sent
        ("llama3", [" ", '{"name": "get_weather", ', '"parameters": {"city": "Paris"}}'], "", 1),
        ("llama3", [" ", "{not json"], " {not json", 0),  # held, then sent as content at the end
        ("llama3", ["Paris", " is sunny"], "Paris is sunny", 0),
        ("mistral", ["OK ", "[TOOL_", f"CALLS] [{PARIS}]"], "OK ", 1),
    ],
)
def test_a_stream_sends_content_until_a_call_may_begin(
    format_name: str, pieces: list[str], sent: str, calls: int
) -> None:
    stream = CallStream(_tools(format_name))
    text = "".join(stream.push(piece) for piece in pieces)
    rest, found = stream.finish()
    assert text + rest == sent if not calls else (text == sent and not rest)
    assert len(found or []) == calls


def test_tool_choice_none_never_reads_calls() -> None:
    tools = _tools("hermes", tool_choice="none")
    assert not tools.reads and not tools.forced
    stream = CallStream(tools)
    answer = f"<tool_call>{PARIS}</tool_call>"
    assert stream.push(answer) == answer and stream.finish() == ("", None)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),  # without tools
        ({"tools": [], "parallel_tool_calls": True}, "parallel_tool_calls"),
        ({"tools": [WEATHER], "parallel_tool_calls": 1}, "parallel_tool_calls"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "colour": 1}}]},
            "tools[0].function.colour",
        ),
        ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
            "tools[0].function.parameters",
        ),
    ],
)
def test_bad_tools_are_refused_naming_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as caught:
        read_tools(body, FORMAT["hermes"])
    assert caught.value.param == param


def test_tools_for_a_template_without_a_known_format_are_refused() -> None:
    with pytest.raises(RequestError, match="does not render tools") as caught:
        read_tools({"tools": [WEATHER]}, None)
    assert caught.value.param == "tools"
    assert read_tools({"tools": None, "tool_choice": "none"}, None) is None  # asks for nothing


# ---- rendering, in later turns too, as transformers renders it ----


def _base(texts: list[str]) -> str:
    """A byte-level BPE (every text encodes) trained on ``texts``, as JSON."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(texts * 4, trainer=trainer)
    return tok.to_str()


@pytest.fixture(scope="module")
def base() -> str:
    return _base([(DATA / FAMILIES["qwen2.5"][0]).read_text(encoding="utf-8"), json.dumps(WEATHER), PARIS])


def _conversation(call_id: str) -> list[dict[str, Any]]:
    """A later turn as an OpenAI client sends it: the assistant's call (arguments as a JSON string, no
    content) and the tool's result."""
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": '{"temperature": 21}'},
    ]


@pytest.mark.parametrize("family", ["qwen2.5", "qwen3", "llama-3.1", "llama-3.2", "mistral-v0.3"])
def test_tools_and_later_turns_render_as_transformers_does(family: str, base: str, tmp_path: Path) -> None:
    folder = write_folder(tmp_path / family, base, family)
    ours, theirs = zoo.load_tokenizer(folder), transformers.AutoTokenizer.from_pretrained(folder)
    fmt = tool_format(ours.chat_template)
    assert fmt is not None
    call_id = fmt.call_id()
    messages = check_messages(_conversation(call_id), ours.chat_template, fmt)
    # what transformers is given: the arguments as an object (its documented shape), content "" beside them
    expected = copy.deepcopy(_conversation(call_id))
    expected[2] |= {"content": "", "tool_calls": [{**expected[2]["tool_calls"][0]}]}
    expected[2]["tool_calls"][0]["function"] = {"name": "get_weather", "arguments": {"city": "Paris"}}
    kwargs: dict[str, Any] = {"tools": [WEATHER], "add_generation_prompt": True, "date_string": "26 Jul 2024"}
    text = ours.apply_chat_template(messages, tokenize=False, **kwargs)
    assert text == theirs.apply_chat_template(expected, tokenize=False, **kwargs)
    ids = ours.apply_chat_template(messages, **kwargs)
    assert ids == theirs.apply_chat_template(expected, tokenize=True, return_dict=False, **kwargs)
    assert "get_weather" in text and "Paris" in text and "21" in text  # the tools, the call, its result


def test_later_turns_are_checked_naming_the_message_field() -> None:
    fmt = FORMAT["hermes"]
    for change, param in [
        (lambda m: m[3].update(tool_call_id="call_other"), "messages[3].tool_call_id"),
        (lambda m: m[2]["tool_calls"][0]["function"].update(arguments="{"), "messages[2].tool_calls[0].function.arguments"),
        (lambda m: m[2]["tool_calls"][0].update(extra=1), "messages[2].tool_calls[0]"),
        (lambda m: m[1].update(tool_calls=[]), "messages[1].tool_calls"),  # a user message
    ]:  # fmt: skip
        messages = _conversation("call_1")
        change(messages)
        with pytest.raises(RequestError) as caught:
            check_messages(messages, None, fmt)
        assert caught.value.param == param
    with pytest.raises(RequestError, match="renders no tool calls") as caught:
        check_messages(_conversation("call_1"), None, None)
    assert caught.value.param == "messages[2].tool_calls"


# ---- through the real client ----

MODEL = "tiny-qwen"


@pytest.fixture(scope="module")
def qwen(base: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A random tiny decoder served with a tokenizer carrying Qwen 2.5's template (all its tokens special)."""
    root = tmp_path_factory.mktemp("tools")
    tokenizer = zoo.load_tokenizer(write_folder(root / "tokenizer", base, "qwen2.5"))
    model = tiny_decoder(tokenizer.vocab_size, max_positions=512)
    zoo.save(model, root / "model", tokenizer=tokenizer)
    loaded = zoo.load_pretrained(root / "model")
    engine = Engine(loaded.model, loaded.tokenizer, max_batch=4, max_queue=16, max_length=512)
    with Server(engine, loaded.tokenizer, model_name=MODEL) as running:
        yield running


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.mark.parametrize("choice", ["auto", "none"])
def test_an_answer_without_a_call_is_plain_content(qwen: Server, choice: str) -> None:
    out = _client(qwen).chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER],
        tool_choice=choice,
        max_tokens=12,
        temperature=0,
    )
    choice_ = out.choices[0]
    assert choice_.message.tool_calls is None and choice_.finish_reason == "length"
    assert choice_.message.content and "<tool_call>" not in choice_.message.content


def test_tools_change_the_prompt_the_model_reads(qwen: Server) -> None:
    client = _client(qwen)
    plain = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, temperature=0)
    tooled = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER],
        max_tokens=4,
        temperature=0,
    )
    assert plain.usage is not None and tooled.usage is not None
    assert tooled.usage.prompt_tokens > plain.usage.prompt_tokens + 30  # the tools' schemas are in it


def test_a_streamed_answer_without_a_call_streams_its_content(qwen: Server) -> None:
    client = _client(qwen)
    whole = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER],
        max_tokens=12,
        temperature=0,
    )
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=ASK,
            tools=[WEATHER],
            max_tokens=12,
            temperature=0,
            stream=True,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert all(c.choices[0].delta.tool_calls is None for c in chunks if c.choices)


def test_a_later_turn_with_calls_and_results_is_accepted(qwen: Server) -> None:
    out = _client(qwen).chat.completions.create(
        model=MODEL,
        messages=_conversation("call_1"),
        tools=[WEATHER],
        max_tokens=4,
        temperature=0,
    )
    assert out.choices[0].message.content is not None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "get_news"}}}, "tool_choice"),
        (
            {
                "messages": [
                    *_conversation("call_1")[:3],
                    {"role": "tool", "tool_call_id": "x", "content": "1"},
                ]
            },
            "messages[3].tool_call_id",
        ),
        (  # a forced call has its own grammar: a second one is refused, not merged or dropped
            {"tool_choice": "required", "response_format": {"type": "json_object"}},
            "tool_choice",
        ),
    ],
)
def test_a_bad_tool_field_is_a_400_naming_it(qwen: Server, fields: dict[str, Any], param: str) -> None:
    messages = fields.pop("messages", ASK)
    with pytest.raises(openai.BadRequestError) as caught:
        _client(qwen).chat.completions.create(
            model=MODEL,
            messages=messages,
            tools=[WEATHER],
            max_tokens=4,
            extra_body=fields,
        )
    assert isinstance(caught.value.body, dict) and caught.value.body["param"] == param


def test_the_served_prompt_with_tools_is_the_templates(qwen: Server, base: str, tmp_path: Path) -> None:
    """The ids the server feeds the model are transformers' rendering of the same request."""
    folder = write_folder(tmp_path / "qwen", base, "qwen2.5")
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    expected = theirs.apply_chat_template(
        ASK, tools=[WEATHER], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    out = _client(qwen).chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[WEATHER],
        max_tokens=1,
        temperature=0,
    )
    assert out.usage is not None and out.usage.prompt_tokens == len(expected)


# ---- forced calls: the grammar engine holds the answer to a call whose arguments validate ----

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

BOUNDED = {  # bounded strings and numbers: a random model's call ends well within max_tokens
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 8},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in (BOUNDED, CLOCK)}


@pytest.fixture(scope="module", params=["qwen2.5", "llama-3.1", "mistral-v0.3"])
def forcing(
    request: pytest.FixtureRequest, base: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """A random tiny decoder served with each format's template."""
    root = tmp_path_factory.mktemp(request.param)
    tokenizer = zoo.load_tokenizer(write_folder(root / "tokenizer", base, request.param))
    model = tiny_decoder(tokenizer.vocab_size, max_positions=1024)
    engine = Engine(model, tokenizer, max_batch=4, max_queue=16, max_length=1024)
    with Server(engine, tokenizer, model_name=MODEL) as running:
        yield running


def _validates(calls: Any, names: set[str]) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.function.name in names and call.id
        jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_time"}}], ids=["required", "named"]
)
def test_a_forced_call_returns_tool_calls_whose_arguments_validate(forcing: Server, choice: Any) -> None:
    names = {"get_weather", "get_time"} if choice == "required" else {"get_time"}
    client = _client(forcing)
    for temperature, seed in ((0.0, None), (1.0, 1), (1.0, 2), (2.0, 3)):
        out = client.chat.completions.create(
            model=MODEL,
            messages=ASK,
            tools=[BOUNDED, CLOCK],
            tool_choice=choice,
            max_tokens=200,
            temperature=temperature,
            seed=seed,
        )
        assert out.choices[0].finish_reason == "tool_calls", out.choices[0]
        assert out.choices[0].message.content is None
        _validates(out.choices[0].message.tool_calls, names)


def test_a_forced_call_streams_as_delta_tool_calls(forcing: Server) -> None:
    chunks = list(
        _client(forcing).chat.completions.create(
            model=MODEL,
            messages=ASK,
            tools=[BOUNDED, CLOCK],
            tool_choice="required",
            max_tokens=200,
            temperature=1.0,
            seed=5,
            stream=True,
        )
    )
    calls = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or ()]
    _validates(calls, {"get_weather", "get_time"})
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_a_forced_call_round_trips_in_the_next_turn(forcing: Server) -> None:
    """The call as the client got it (its id included: Mistral's template checks it) and the tool's result
    are taken back, and the template renders them into the next prompt."""
    client = _client(forcing)
    tools: Any = [BOUNDED, CLOCK]
    out = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=tools, tool_choice="required", max_tokens=200, temperature=0
    )
    message = out.choices[0].message
    assert message.tool_calls
    result = {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": '{"temperature": 21}'}
    history: Any = [*ASK, message.model_dump(exclude_none=True), result]
    later = client.chat.completions.create(model=MODEL, messages=history, tools=tools, max_tokens=2)
    assert out.usage is not None and later.usage is not None
    assert later.usage.prompt_tokens > out.usage.prompt_tokens + out.usage.completion_tokens
