"""`ChatSession`: answers are `generate` on the rendered conversation, stopped at the template's end of
turn; the history grows, resets, keeps a stopped answer and loses its oldest turns to fit; transformers
renders and generates the same tokens."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from chat_support import ANSWER, CHATML, chat_tokenizer, endless_model, save_chat_model, trained_model

import zoo
from zoo.generation import ChatSession
from zoo.generation.chat import end_of_turn_ids
from zoo.io.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[zoo.ZooModel, Tokenizer, Path]:
    tokenizer = chat_tokenizer()
    model = trained_model(tokenizer)
    folder = save_chat_model(model, tokenizer, tmp_path_factory.mktemp("chat") / "trained")
    return model, zoo.load_tokenizer(folder), folder


@pytest.fixture(scope="module")
def endless() -> tuple[zoo.ZooModel, Tokenizer]:
    tokenizer = chat_tokenizer()
    return endless_model(tokenizer), tokenizer


def _ids(tokenizer: Tokenizer, *tokens: str) -> list[int]:
    ids = [tokenizer.token_to_id(token) for token in tokens]
    assert None not in ids
    return ids  # type: ignore[return-value]


def test_the_stop_tokens_are_the_templates_end_of_turn_then_eos(trained) -> None:
    model, tokenizer, _ = trained
    assert tokenizer.has_chat_template
    assert end_of_turn_ids(tokenizer) == tuple(_ids(tokenizer, "<|im_end|>"))
    assert ChatSession(model, tokenizer).stop_ids == tuple(_ids(tokenizer, "<|im_end|>", "</s>"))


def test_without_a_template_the_default_one_ends_a_turn_with_eos() -> None:
    tokenizer = chat_tokenizer(template=None)
    assert not tokenizer.has_chat_template
    assert end_of_turn_ids(tokenizer) == tuple(_ids(tokenizer, "</s>"))


TEMPLATES = Path(__file__).resolve().parents[1] / "io" / "data" / "chat_templates"
# Each public model's template (tests/io/data/chat_templates) and the token that ends its assistant turns.
END_OF_TURN = {
    "llama-3.1-instruct": "<|eot_id|>",
    "llama-3.2-instruct": "<|eot_id|>",
    "qwen2.5-instruct": "<|im_end|>",
    "qwen3": "<|im_end|>",
    "mistral-7b-instruct-v0.3": "</s>",
    "gemma-2-it": "<end_of_turn>",
    "gemma-3-it": "<end_of_turn>",
    "phi-3.5-mini-instruct": "<|end|>",
}


@pytest.mark.parametrize("name", sorted(END_OF_TURN))
def test_the_end_of_turn_token_is_found_in_real_templates(name: str) -> None:
    tokenizer = chat_tokenizer(template=(TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8"))
    # Each family's markers as special tokens (the others stay text, as in a tokenizer without them).
    markers = (
        "<|eot_id|> <|start_header_id|> <|end_header_id|> <start_of_turn> <end_of_turn> <|end|> <|user|>"
    )
    tokenizer.hf.add_special_tokens([*markers.split(), "<|assistant|>", "<|system|>"])
    found = end_of_turn_ids(tokenizer)
    # First the turn's end; then maybe the eos some templates close the conversation with (Phi-3.5).
    assert found[0] == tokenizer.token_to_id(END_OF_TURN[name]) and set(found[1:]) <= {tokenizer.eos_id}


def test_a_greedy_answer_is_generate_on_the_rendered_conversation_token_for_token(trained) -> None:
    model, tokenizer, _ = trained
    session = ChatSession(model, tokenizer, system="be brief", max_new_tokens=24)
    stops = _ids(tokenizer, "<|im_end|>", "</s>")
    for question in ("hello there", "who are you"):
        prompt = session.prompt_ids(question)
        assert prompt == tokenizer.apply_chat_template(
            [*session.messages, {"role": "user", "content": question}], add_generation_prompt=True
        )
        out = model.generate(torch.tensor([prompt]), max_new_tokens=24, eos_token_id=stops)[0, len(prompt) :]
        new = out.tolist()
        assert new[-1] == stops[0] and len(new) < 24  # the trained model ends its turn itself
        answer = "".join(session.reply(question))
        assert answer == tokenizer.decode(new[:-1]) == ANSWER
        # The history holds the answer's very tokens: the next prompt begins with prompt + answer + <|im_end|>.
        assert session.prompt_ids()[: len(prompt) + len(new)] == prompt + new


def test_the_history_grows_resets_and_takes_a_new_system_prompt(trained) -> None:
    model, tokenizer, _ = trained
    session = ChatSession(model, tokenizer, system="be brief", max_new_tokens=16)
    list(session.reply("hello there"))
    list(session.reply("tell me a story"))
    roles = [m["role"] for m in session.messages]
    assert roles == ["system", "user", "assistant", "user", "assistant"]
    assert session.render().count("<|im_start|>user") == 2
    session.reset()
    assert session.messages == [{"role": "system", "content": "be brief"}]
    assert session.render() == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>assistant\n"
    session.set_system("talk like a cat")
    assert session.messages == [{"role": "system", "content": "talk like a cat"}]
    session.set_system(None)
    assert session.messages == [] and session.system is None and session.render() == ""
    assert session.prompt_ids("hi") == tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True
    )


def test_a_stopped_answer_stays_in_the_history_as_far_as_it_got(endless) -> None:
    model, tokenizer = endless
    session = ChatSession(model, tokenizer, max_new_tokens=2000)
    pieces = session.reply("hello")
    said = [next(pieces) for _ in range(5)]
    assert model.training is False
    pieces.close()
    assert session.messages[-1]["role"] == "assistant"
    assert session.messages[-1]["content"].startswith("".join(said).strip())
    assert len(session.messages) == 2
    # The conversation goes on from there.
    more = session.reply("hello again")
    next(more)
    more.close()
    assert [m["role"] for m in session.messages] == ["user", "assistant", "user", "assistant"]


def test_an_answer_dropped_before_a_newer_reply_does_not_overwrite_the_history(endless) -> None:
    model, tokenizer = endless
    session = ChatSession(model, tokenizer, max_new_tokens=5)
    old = session.reply("first")
    next(old)
    session.reset()
    list(session.reply("second"))
    old.close()  # the abandoned answer belongs to a cleared conversation
    assert session.messages[0]["content"] == "second" and len(session.messages) == 2


def test_the_oldest_turns_are_dropped_to_leave_room_for_the_answer(trained) -> None:
    model, tokenizer, _ = trained
    limit = model.spec.max_positions
    session = ChatSession(model, tokenizer, system="be brief", max_new_tokens=limit - 60)
    questions = ["hello there", "who are you", "tell me a story", "what did the dog do", "hello there"]
    for question in questions:
        list(session.reply(question))
        assert len(session.prompt_ids()) <= 60 + 10  # the last answer came on top of a prompt within 60
    assert session.dropped_turns > 0
    messages = session.messages
    assert messages[0] == {"role": "system", "content": "be brief"}
    assert messages[1]["role"] == "user" and messages[-2]["content"] == questions[-1]
    assert len(messages) < 1 + 2 * len(questions)


def test_a_message_too_long_alone_is_an_error_that_leaves_the_history_as_it_was(trained) -> None:
    model, tokenizer, _ = trained
    session = ChatSession(model, tokenizer, max_new_tokens=100)
    list(session.reply("hello there"))
    before = session.messages
    with pytest.raises(ValueError, match=r"too long: .* max_positions \(128\) - max_new_tokens \(100\) = 28"):
        session.reply("the cat sat on the mat " * 10)
    assert session.messages == before
    with pytest.raises(ValueError, match="empty"):
        session.reply("  ")


def test_sampling_with_a_seed_is_reproducible_and_differs_from_turn_to_turn(endless) -> None:
    model, tokenizer = endless
    runs = []
    for _ in range(2):
        session = ChatSession(model, tokenizer, max_new_tokens=12, do_sample=True, top_k=20, seed=7)
        runs.append(["".join(session.reply("hello")) for _ in range(2)])
    assert runs[0] == runs[1]
    assert runs[0][0] != runs[0][1]


def test_bad_settings_and_models_are_refused_up_front(trained) -> None:
    model, tokenizer, _ = trained
    with pytest.raises(ValueError, match="num_beams and num_return_sequences must be 1"):
        ChatSession(model, tokenizer, num_beams=2)
    with pytest.raises(ValueError, match=r"max_new_tokens \(128\) leaves no room"):
        ChatSession(model, tokenizer, max_new_tokens=128)
    with pytest.raises(ValueError, match="temperature"):
        ChatSession(model, tokenizer, temperature=-1.0)
    with pytest.raises(TypeError, match="unexpected"):
        ChatSession(model, tokenizer, beams=2)
    translator = zoo.build(zoo.preset("transformer-tiny").override(num_layers=1)).eval()
    with pytest.raises(ValueError, match="decoder-only model; this one is a encoder-decoder"):
        ChatSession(translator, tokenizer)


def test_an_explicit_eos_token_id_replaces_the_stop_tokens(endless) -> None:
    model, tokenizer = endless
    session = ChatSession(model, tokenizer, max_new_tokens=30, eos_token_id=[])
    assert session.stop_ids == ()
    list(session.reply("hello"))
    assert len(tokenizer.encode(session.messages[-1]["content"], add_eos=False)) >= 25


def test_transformers_renders_the_conversation_and_generates_the_answer_alike(trained, tmp_path) -> None:
    """The reference: the same folder through transformers' tokenizer (its chat template) and the model
    exported to transformers, greedy, stopped at the same tokens, gives the tokens of the zoo session."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    model, tokenizer, folder = trained
    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"), chat_template=CHATML
    )
    hf_model = AutoModelForCausalLM.from_pretrained(zoo.to_hf(model, tmp_path / "hf")).eval()
    session = ChatSession(model, tokenizer, system="be brief", max_new_tokens=20)
    stops = list(session.stop_ids)
    for question in ("what did the dog do", "hello there"):
        expected = hf_tokenizer.apply_chat_template(
            [*session.messages, {"role": "user", "content": question}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        assert session.prompt_ids(question) == expected
        out = hf_model.generate(
            torch.tensor([expected]), max_new_tokens=20, do_sample=False, eos_token_id=stops, pad_token_id=0
        )[0, len(expected) :].tolist()
        answer = "".join(session.reply(question))
        assert out[-1] in stops and answer == hf_tokenizer.decode(out[:-1], skip_special_tokens=True)
