"""``task: chat``: conversations rendered by their chat template, the loss on the assistant's turns only.

The key invariant: the prepared 0/1 mask equals the one found independently, by rendering each prefix of
the conversation with the template and tokenizing it (and equals transformers' ``assistant_masks`` for a
template marked with ``{% generation %}``), for multi-turn conversations with a system message, on zoo's
default template and on real ones (Llama 3.1's and Qwen2.5's, from tests/io/data/chat_templates).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

import zoo
from zoo.cli import main
from zoo.io.tokenizer import Tokenizer, train_tokenizer
from zoo.losses import IGNORE_INDEX
from zoo.models.build import build_model
from zoo.spec import preset
from zoo.training import TrainConfig, train
from zoo.training.config import ConfigError
from zoo.training.corpus import prepare_corpus
from zoo.training.data import DataError
from zoo.training.data.shards import PreparedData, open_prepared
from zoo.training.data.sources import ReadStats
from zoo.training.tasks import build_task, get_task
from zoo.training.tasks.base import Limits, Split, Tokenizers

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

CHAT = get_task("chat")
CONVERSATION = [
    {"role": "system", "content": "You answer in a few words."},
    {"role": "user", "content": "Which animal sleeps all day?"},
    {"role": "assistant", "content": "The cat sleeps all day."},
    {"role": "user", "content": "And the dog?"},
    {"role": "assistant", "content": "The dog runs and eats."},
]
CONVERSATIONS = [
    CONVERSATION,
    [{"role": "user", "content": "Name a red bird."}, {"role": "assistant", "content": "A small red bird."}],
    [*CONVERSATION[1:], {"role": "user", "content": "Why?"}],  # ends on a user turn: nothing after it trained
]

TEMPLATES = Path(__file__).parents[1] / "io" / "data" / "chat_templates"  # real ones (SOURCES.md there)
LLAMA3 = (TEMPLATES / "llama-3.1-instruct.jinja").read_text(encoding="utf-8")
QWEN25 = (TEMPLATES / "qwen2.5-instruct.jinja").read_text(encoding="utf-8")
QWEN3 = (TEMPLATES / "qwen3.jinja").read_text(encoding="utf-8")
LLAMA3_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]


def chatml(*, generation: bool = False) -> str:
    """Qwen2.5's template without its tool branches (a default system message, ChatML turns); with
    ``generation`` the assistant's turn (content and ``<|im_end|>\\n``) is marked for transformers'
    ``return_assistant_tokens_mask``."""
    start, end = ("{% generation %}", "{% endgeneration %}") if generation else ("", "")
    return (
        "{%- if messages[0]['role'] == 'system' %}"
        "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
        "{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
        "{%- for message in messages %}"
        "{%- if message['role'] == 'assistant' %}{{- '<|im_start|>assistant\\n' }}"
        + start
        + "{{- message['content'] + '<|im_end|>\\n' }}"
        + end
        + "{%- elif message['role'] == 'user' or not loop.first %}"
        "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
        "{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )


CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def texts() -> list[str]:
    return [m["content"] for conversation in CONVERSATIONS for m in conversation] + [
        "system user assistant You are a helpful assistant."
    ]


def byte_level(specials: list[str], template: str) -> Tokenizer:
    """A small byte-level BPE (GPT-2 / Llama 3 / Qwen style) with ``specials`` as added tokens."""
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        min_frequency=1,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    hf.train_from_iterator(texts() * 3, trainer)
    pad = {"pad": "<|endoftext|>"} if "<|endoftext|>" in specials else None  # as Qwen's config names it
    return Tokenizer(hf, chat_template=template, special_tokens=pad)


def zoo_trained() -> Tokenizer:
    """A tokenizer as zoo trains it (no chat template: the default one renders)."""
    return train_tokenizer(
        iter([f"{m['role']}: {m['content']}" for c in CONVERSATIONS for m in c] * 3),
        kind="bpe",
        vocab_size=200,
        min_frequency=1,
    )


TOKENIZERS = {
    "default": zoo_trained,
    "llama3": lambda: byte_level(LLAMA3_SPECIALS, LLAMA3),
    "qwen2.5": lambda: byte_level(CHATML_SPECIALS, QWEN25),
    "chatml": lambda: byte_level(CHATML_SPECIALS, chatml()),
}


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text(
        "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8"
    )
    return path


def prepared(tmp_path: Path, tok: Tokenizer, rows: list[Any], name: str = "chat") -> PreparedData:
    source = write_jsonl(tmp_path / f"{name}.jsonl", rows)
    prepare_corpus("chat", [source], tokenizer=tok, out=tmp_path / name)
    return open_prepared(tmp_path / name)


def independent_mask(tok: Tokenizer, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """(ids, mask) found by tokenizing each prefix: an answer's tokens are those the conversation through
    it has beyond the prompt before it (rendered with the generation prompt)."""
    full = tok.apply_chat_template(messages)
    assert isinstance(full, list)
    mask = [0] * len(full)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = tok.apply_chat_template(messages[:i], add_generation_prompt=True)
        through = tok.apply_chat_template(messages[: i + 1])
        assert isinstance(prompt, list) and isinstance(through, list)
        assert through[: len(prompt)] == prompt and full[: len(through)] == through
        mask[len(prompt) : len(through)] = [1] * (len(through) - len(prompt))
    return full, mask


def rows_of(data: PreparedData, i: int) -> tuple[list[int], list[int]]:
    example = data.example(i)
    return example["tokens"].tolist(), example["labels"].tolist()


# --- the mask -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(TOKENIZERS))
def test_the_mask_is_the_tokens_each_answer_adds_to_its_prompt(name: str, tmp_path: Path) -> None:
    tok = TOKENIZERS[name]()
    data = prepared(tmp_path, tok, [{"messages": c} for c in CONVERSATIONS])
    assert data.num_examples == len(CONVERSATIONS)
    for i, conversation in enumerate(CONVERSATIONS):
        ids, mask = rows_of(data, i)
        assert (ids, mask) == independent_mask(tok, conversation)
    ids, mask = rows_of(data, 0)
    trained = tok.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=False)
    for answer in ("The cat sleeps all day.", "The dog runs and eats."):
        assert answer in trained
    for prompt in ("You answer in a few words.", "Which animal", "And the dog?"):
        assert prompt not in trained


@pytest.mark.parametrize(
    ("name", "end_of_turn"), [("default", "</s>"), ("llama3", "<|eot_id|>"), ("qwen2.5", "<|im_end|>")]
)
def test_the_end_of_turn_token_is_trained_and_the_generation_prompt_is_not(
    name: str, end_of_turn: str, tmp_path: Path
) -> None:
    tok = TOKENIZERS[name]()
    data = prepared(tmp_path, tok, [{"messages": CONVERSATION}])
    ids, mask = rows_of(data, 0)
    stop = tok.token_to_id(end_of_turn)
    ends = [k for k, t in enumerate(ids) if t == stop]
    trained_ends = [k for k in ends if mask[k]]
    assert len(trained_ends) == 2  # one per answer; the system's and users' are not trained
    prompt = tok.apply_chat_template(CONVERSATION[:2], add_generation_prompt=True)
    assert isinstance(prompt, list) and not any(mask[: len(prompt)])


def test_the_mask_equals_transformers_assistant_masks(tmp_path: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    tok = byte_level(CHATML_SPECIALS, chatml())
    reference = PreTrainedTokenizerFast(tokenizer_object=tok.hf)
    data = prepared(tmp_path, tok, [{"messages": c} for c in CONVERSATIONS])
    for i, conversation in enumerate(CONVERSATIONS):
        out = reference.apply_chat_template(
            conversation,
            chat_template=chatml(generation=True),
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        assert isinstance(out, Mapping)  # return_dict: a BatchEncoding
        assert rows_of(data, i) == (list(out["input_ids"]), list(out["assistant_masks"]))


def test_a_template_that_rewrites_earlier_turns_is_refused_naming_the_line(tmp_path: Path) -> None:
    # Qwen3's: the answer after the last user message gets a (here empty) <think> block, earlier ones not, so
    # the first answer is rendered one way as the last message and another once the conversation goes on.
    tok = byte_level(CHATML_SPECIALS, QWEN3)
    rows = [{"messages": CONVERSATION[1:3]}, {"messages": CONVERSATION}]
    with pytest.raises(DataError, match=r"chat\.jsonl:2: .*assistant message 2 .*not prefix-consistent"):
        prepared(tmp_path, tok, rows)


def test_a_template_that_refuses_the_conversation_is_a_data_error_naming_the_line(tmp_path: Path) -> None:
    strict = (
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system role, please') }}{% endif %}"
    )
    tok = byte_level(CHATML_SPECIALS, strict + chatml())
    with pytest.raises(DataError, match=r"chat\.jsonl:1: the chat template cannot render .*no system role"):
        prepared(tmp_path, tok, [{"messages": CONVERSATION}])


def test_a_lone_surrogate_in_a_message_is_a_data_error_naming_the_line(tmp_path: Path) -> None:
    """It was tokenizers' TextEncodeInput TypeError traceback."""
    tok = byte_level(CHATML_SPECIALS, chatml())
    broken = [{"role": "user", "content": "hi \ud800"}, {"role": "assistant", "content": "hello"}]
    with pytest.raises(
        DataError, match=r"chat\.jsonl:2: messages\[0\] holds a lone UTF-16 surrogate at character 3"
    ):
        prepared(tmp_path, tok, [{"messages": CONVERSATION}, {"messages": broken}])


def test_a_changed_template_prepares_again(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "c.jsonl", [{"messages": CONVERSATION}])
    first = prepare_corpus(
        "chat", [source], tokenizer=byte_level(CHATML_SPECIALS, chatml()), out=tmp_path / "p"
    )
    same = prepare_corpus(
        "chat", [source], tokenizer=byte_level(CHATML_SPECIALS, chatml()), out=tmp_path / "p"
    )
    other = prepare_corpus(
        "chat", [source], tokenizer=byte_level(CHATML_SPECIALS, "\n" + chatml()), out=tmp_path / "p"
    )
    assert first.written and not same.written and other.written


# --- input shapes and bad lines ---------------------------------------------------------------------------


def test_sharegpt_and_prompt_response_lines_are_the_same_conversations(tmp_path: Path) -> None:
    tok = zoo_trained()
    pair = CONVERSATIONS[1]
    sharegpt = {
        "conversations": [
            {
                "from": {"system": "system", "user": "human", "assistant": "gpt"}[m["role"]],
                "value": m["content"],
            }
            for m in CONVERSATION
        ]
    }
    openai = prepared(tmp_path, tok, [{"messages": CONVERSATION}, {"messages": pair}], name="openai")
    other = prepared(
        tmp_path,
        tok,
        [sharegpt, {"prompt": pair[0]["content"], "response": pair[1]["content"]}],
        name="other",
    )
    for i in range(2):
        assert rows_of(openai, i) == rows_of(other, i)


BAD_LINES = [
    ("not json", r"not JSON"),
    ('["a list"]', r"expected a JSON object, found a list"),
    (
        '{"text": "hello"}',
        r'expected "messages", "conversations" or "prompt" and "response" \(keys: \'text\'\)',
    ),
    ('{"messages": []}', r"messages must be a non-empty list"),
    (
        '{"messages": [{"role": "tool", "content": "x"}]}',
        r"messages\[0\]\.role is 'tool'; expected one of system",
    ),
    (
        '{"messages": [{"role": "user", "content": 3}]}',
        r"messages\[0\]\.content must be a string, found a number",
    ),
    ('{"messages": [{"role": "user", "content": "hi"}]}', r"no assistant message"),
    ('{"messages": [{"role": "assistant", "content": "hi"}]}', r"the first message is the assistant's"),
    ('{"conversations": [{"from": "bot", "value": "x"}]}', r"conversations\[0\]\.from is 'bot'"),
    ('{"messages": [{"role": ["user"], "content": "x"}]}', r"messages\[0\]\.role is a list; expected one of"),
    ('{"prompt": "hi"}', r"response must be a string .*found nothing"),
]


@pytest.mark.parametrize(("line", "problem"), BAD_LINES, ids=[p for _, p in BAD_LINES])
def test_a_bad_line_is_named_by_file_line_and_field(line: str, problem: str, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": CONVERSATION}, line])
    with pytest.raises(DataError, match=rf"c\.jsonl:2: {problem}"):
        list(CHAT.records(CHAT.source(path)))


def test_bad_lines_are_skipped_and_counted_with_on_bad_line_skip(tmp_path: Path) -> None:
    lines = [line for line, _ in BAD_LINES]
    path = write_jsonl(tmp_path / "c.jsonl", [lines[0], {"messages": CONVERSATION}, *lines[1:]])
    stats = ReadStats()
    records = list(CHAT.records(CHAT.source(path, on_bad_line="skip"), stats=stats))
    assert [r.line for r in records] == [2]
    assert stats.skipped == len(BAD_LINES) and stats.examples[0].endswith(
        "c.jsonl:1: not JSON (Expecting value at column 1)"
    )


def test_train_on_prompt_is_refused_for_other_tasks() -> None:
    with pytest.raises(
        ConfigError, match=r"task\.causal_lm\.train_on_prompt: Extra inputs are not permitted"
    ):
        TrainConfig.from_dict(
            {
                "model": "llama-tiny",
                "task": {"kind": "causal_lm", "train_on_prompt": True},
                "data": {"train": "t.txt"},
                "max_steps": 1,
            }
        )
    with pytest.raises(ConfigError) as moved:  # at its old place: one line saying where it went
        TrainConfig.from_dict(
            {
                "model": "llama-tiny",
                "task": "causal_lm",
                "data": {"train": "t.txt", "train_on_prompt": True},
                "max_steps": 1,
            }
        )
    assert str(moved.value) == (
        "training config: data.train_on_prompt moved: write task: {kind: chat, train_on_prompt: true} "
        "(chat settings; this config's task is causal_lm)"
    )


# --- length ---------------------------------------------------------------------------------------------------

LONG_PROMPT = [  # its prompt alone is longer than the limit below: its answer falls wholly past the cut
    {"role": "user", "content": " ".join(["Which animal sleeps all day? And the dog?"] * 12)},
    {"role": "assistant", "content": "The cat sleeps all day."},
]


def cut_below(tok: Tokenizer) -> int:
    """A limit that cuts CONVERSATION inside its last answer (keeping the first) and LONG_PROMPT before its
    answer begins."""
    ids, _ = independent_mask(tok, CONVERSATION)
    prompt = tok.apply_chat_template(LONG_PROMPT[:1], add_generation_prompt=True)
    assert isinstance(prompt, list) and len(prompt) > len(ids)
    return len(ids) - 2


def test_a_conversation_whose_answers_all_fall_past_the_cut_is_skipped_and_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With too_long: truncate it was kept with no trained token: it trained on nothing (a loss of 0.0)."""
    tok = byte_level(CHATML_SPECIALS, chatml())
    tok.save_pretrained(tmp_path / "tok")
    limit = cut_below(tok)
    source = write_jsonl(tmp_path / "c.jsonl", [{"messages": CONVERSATION}, {"messages": LONG_PROMPT}])
    args = ["data", "prepare", "--task", "chat", "--tokenizer", str(tmp_path / "tok"), "--out"]
    assert main([*args, str(tmp_path / "p"), "--max-length", str(limit), str(source)]) == 0
    assert "1 with nothing left to train (skipped)" in " ".join(capsys.readouterr().out.split())
    data = open_prepared(tmp_path / "p")
    counts = data.manifest.counts
    assert data.num_examples == 1 and counts["over_max_length"] == 2 and counts["nothing_to_train"] == 1
    ids, mask = rows_of(data, 0)  # CONVERSATION, cut in its last answer: its first answer still trained
    assert (ids, mask) == tuple(row[:limit] for row in independent_mask(tok, CONVERSATION))


def test_prepared_conversations_cut_when_batched_skip_those_left_with_nothing_to_train(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Prepared without a limit, cut by a run's: the units leave out the conversation whose answers are all
    past the cut (it was planned into batches, every target -100)."""
    tok = byte_level(CHATML_SPECIALS, chatml())
    data = prepared(tmp_path, tok, [{"messages": LONG_PROMPT}, {"messages": CONVERSATION}] * 2)
    limits = Limits(cut_below(tok))
    with caplog.at_level("WARNING"):
        units = CHAT.units(Split("train", data), tokenizers=Tokenizers(tok), limits=limits)
    assert units.examples is not None and units.examples.tolist() == [1, 3]
    assert "2 of them left nothing to train" in caplog.text and "chat.jsonl:1" in caplog.text
    with pytest.raises(DataError, match=r"every example is longer than \d+ tokens or left nothing to train"):
        only = prepared(tmp_path, tok, [{"messages": LONG_PROMPT}], name="only")
        CHAT.units(Split("train", only), tokenizers=Tokenizers(tok), limits=limits)


# --- batches --------------------------------------------------------------------------------------------------


def collator(
    data: PreparedData, tok: Tokenizer, *, train_on_prompt: bool = False, **data_config: Any
) -> tuple[Any, Any]:
    config = TrainConfig.from_dict({
        "model": "llama-tiny", "task": {"kind": "chat", "train_on_prompt": train_on_prompt},
        "data": {"train": "c.jsonl", **data_config}, "max_steps": 1,
    })  # fmt: skip
    assert config.task is not None
    chat = build_task(config.task, packing=config.data.packing)
    spec = preset("llama-tiny").override(vocab_size=tok.vocab_size)
    split, tokenizers, limits = Split("train", data), Tokenizers(tok), Limits(spec.max_positions)
    units = chat.units(split, tokenizers=tokenizers, limits=limits)
    return units, chat.collator(split, units, spec=spec, tokenizers=tokenizers, limits=limits)


def test_targets_are_the_next_trained_tokens_and_train_on_prompt_takes_every_token(tmp_path: Path) -> None:
    tok = zoo_trained()
    data = prepared(tmp_path, tok, [{"messages": c} for c in CONVERSATIONS])
    _, answers = collator(data, tok)
    _, everything = collator(data, tok, train_on_prompt=True)
    units = np.arange(len(CONVERSATIONS))
    batch, full = answers(units), everything(units)
    assert torch.equal(batch.inputs["input_ids"], full.inputs["input_ids"])
    for row in range(len(CONVERSATIONS)):
        ids, mask = rows_of(data, row)
        expected = [ids[t + 1] if mask[t + 1] else IGNORE_INDEX for t in range(len(ids) - 1)]
        assert batch.targets[row, : len(ids) - 1].tolist() == expected
        assert full.targets[row, : len(ids) - 1].tolist() == ids[1:]
        assert (batch.targets[row, len(ids) - 1 :] == IGNORE_INDEX).all()  # the last token and padding
        assert (full.targets[row, len(ids) - 1 :] == IGNORE_INDEX).all()


def token_losses(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    logits = model(**batch.inputs).logits  # (B, T, V)
    losses = F.cross_entropy(
        logits.transpose(1, 2), batch.targets, reduction="none", ignore_index=IGNORE_INDEX
    )
    return losses[batch.targets != IGNORE_INDEX]


@pytest.mark.parametrize("documents", ["separate", "joined"])
def test_packed_conversations_have_the_loss_of_each_conversation_alone(
    documents: str, tmp_path: Path
) -> None:
    tok = zoo_trained()
    data = prepared(tmp_path, tok, [{"messages": c} for c in CONVERSATIONS])
    total = int(data.manifest.sides["tokens"].tokens)
    units, packed = collator(data, tok, packing={"block_size": total, "documents": documents})
    _, alone = collator(data, tok)
    assert len(units) == 1  # one window holds every conversation
    torch.manual_seed(0)
    net = build_model(preset("llama-tiny").override(vocab_size=tok.vocab_size)).eval()
    with torch.no_grad():
        batch = packed(np.array([0]))
        together = token_losses(net, batch)
        one_by_one = torch.cat([token_losses(net, alone(np.array([i]))) for i in range(len(CONVERSATIONS))])
    trained = sum(sum(rows_of(data, i)[1][1:]) for i in range(len(CONVERSATIONS)))
    assert together.shape == one_by_one.shape == (trained,)
    if documents == "separate":
        assert batch.inputs["document_ids"][0].unique().tolist() == [0, 1, 2]
        torch.testing.assert_close(together, one_by_one, atol=1e-5, rtol=1e-5)
    else:  # later conversations see the earlier ones: the same targets, other losses
        assert "document_ids" not in batch.inputs
        assert not torch.allclose(together, one_by_one)


# --- end to end ------------------------------------------------------------------------------------------------

LLAMA = {
    "preset": "llama-tiny",
    "overrides": {"d_model": 32, "attention.num_heads": 2, "attention.num_kv_heads": 1, "ffn.d_ff": 64},
}


def run_config(tmp_path: Path, output: str, **extra: Any) -> dict[str, Any]:
    rows = [{"messages": c} for c in CONVERSATIONS] * 8
    write_jsonl(tmp_path / "train.jsonl", rows)
    write_jsonl(tmp_path / "valid.jsonl", rows[:3])
    return {
        "model": LLAMA,
        "task": "chat",
        "data": {"train": str(tmp_path / "train.jsonl"), "valid": str(tmp_path / "valid.jsonl")},
        "tokenizer": {"vocab_size": 120, "min_frequency": 1},
        "schedule": {"kind": "constant", "lr": 1e-3},
        "batch": {"max_tokens": 256},
        "max_steps": 3,
        "log_every": 1,
        "output_dir": str(tmp_path / output),
        **extra,
    }


def losses(run: Path) -> list[float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if r.get("loss") is not None]


def test_zoo_train_fine_tunes_a_llama_on_conversations_from_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "chat.yaml"
    path.write_text(yaml.safe_dump(run_config(tmp_path, "run")), encoding="utf-8")
    assert main(["train", str(path)]) == 0
    assert len(losses(tmp_path / "run")) == 3 and all(np.isfinite(losses(tmp_path / "run")))
    model = zoo.load(tmp_path / "run")
    assert model.spec.family == "decoder"
    # the zoo-trained tokenizer had no template: the default one it was fine-tuned with is recorded, and an
    # export to transformers renders conversations exactly as the run did
    tok = zoo.load_tokenizer(tmp_path / "run")
    assert tok.chat_template == tok.default_chat_template
    assert main(["convert", "--to-hf", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    from transformers import AutoTokenizer

    messages = CONVERSATIONS[0][:2]
    theirs = AutoTokenizer.from_pretrained(tmp_path / "hf").apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    assert theirs == tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def test_a_stage_started_from_a_chat_run_keeps_its_template_and_exports_it(tmp_path: Path) -> None:
    """SFT then DPO, each given the same bare tokenizer.json (as examples/instruct.py's stages are): the DPO run
    starts from the SFT run, so it keeps the SFT run's tokenizer, chat template included, and its export
    renders conversations in transformers exactly as zoo does."""
    bare = train_tokenizer(iter(texts()), kind="bpe", vocab_size=120, min_frequency=1)
    bare.save(tmp_path / "tokenizer.json")  # no tokenizer_config.json: no template
    given = {"path": str(tmp_path / "tokenizer.json")}
    train(TrainConfig.from_dict(run_config(tmp_path, "sft", max_steps=1, tokenizer=given)), progress=False)
    sft = zoo.load_tokenizer(tmp_path / "sft")
    assert sft.chat_template == sft.default_chat_template  # what chat fine-tuned it with
    question = [{"role": "user", "content": "Which animal sleeps all day?"}]
    prompt = str(sft.apply_chat_template(question, add_generation_prompt=True, tokenize=False))
    pairs = [{"prompt": prompt.removeprefix("<s>"), "chosen": " The cat.", "rejected": " The dog runs."}] * 8
    write_jsonl(tmp_path / "pairs.jsonl", pairs)
    config = run_config(tmp_path, "dpo", max_steps=1, task="dpo", tokenizer=given)
    config["model"] = {"init_from": str(tmp_path / "sft")}
    config["data"] = {"train": str(tmp_path / "pairs.jsonl")}
    train(TrainConfig.from_dict(config), progress=False)

    dpo = zoo.load_tokenizer(tmp_path / "dpo")
    assert dpo.chat_template == sft.chat_template
    assert main(["convert", "--to-hf", str(tmp_path / "dpo"), "--out", str(tmp_path / "hf")]) == 0
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(tmp_path / "hf")
    for messages in (CONVERSATIONS[0], question):
        ours = dpo.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == ours
        ids = theirs.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
        assert ids == dpo.apply_chat_template(messages, add_generation_prompt=True)


def test_lora_fine_tunes_adapters_on_conversations(tmp_path: Path) -> None:
    base = train(TrainConfig.from_dict(run_config(tmp_path, "base", max_steps=2)), progress=False)
    config = run_config(
        tmp_path,
        "lora",
        model={"init_from": str(tmp_path / "base")},
        lora={"r": 4, "alpha": 8, "targets": ["qkv"]},
        schedule={"kind": "constant", "lr": 1e-2},
    )
    del config["tokenizer"]  # the base model's
    result = train(TrainConfig.from_dict(config), progress=False)
    assert (tmp_path / "lora" / "adapter.safetensors").is_file()
    assert all(np.isfinite(losses(tmp_path / "lora")))
    before, after = base.model.state_dict(), zoo.load(tmp_path / "lora").state_dict()
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed and all("qkv" in name for name in changed)  # merged adapters, nothing else moved
    assert result.step == 3


def test_zoo_data_prepare_prepares_conversations_a_run_then_trains_on(tmp_path: Path) -> None:
    tok = byte_level(CHATML_SPECIALS, chatml())
    tok.save_pretrained(tmp_path / "tok")  # tokenizer.json and tokenizer_config.json, the template in it
    source = write_jsonl(tmp_path / "c.jsonl", [{"messages": c} for c in CONVERSATIONS])
    args = [
        "data",
        "prepare",
        "--task",
        "chat",
        "--tokenizer",
        str(tmp_path / "tok"),
        "--out",
        str(tmp_path / "p"),
    ]
    assert main([*args, str(source)]) == 0
    data = open_prepared(tmp_path / "p")
    assert data.manifest.task == "chat" and rows_of(data, 0) == independent_mask(tok, CONVERSATION)
    config = run_config(tmp_path, "run", max_steps=1, tokenizer={"path": str(tmp_path / "tok")})
    config["data"] = {"train": {"prepared": str(tmp_path / "p")}}
    end = tok.token_to_id("<|endoftext|>")  # Qwen's pad, and the bos and eos the alias lookup finds
    specials = {"pad_token_id": end, "bos_token_id": end, "eos_token_id": end}
    config["model"] = {**LLAMA, "overrides": {**LLAMA["overrides"], **specials}}
    assert train(TrainConfig.from_dict(config), progress=False).step == 1


def test_a_run_keeps_its_tokenizers_template_and_resumes_exactly_with_it(tmp_path: Path) -> None:
    tok = byte_level(CHATML_SPECIALS, QWEN25)
    tok.save_pretrained(tmp_path / "tok")
    end = tok.token_to_id("<|endoftext|>")
    specials = {"pad_token_id": end, "bos_token_id": end, "eos_token_id": end}

    def config(output: str, steps: int) -> TrainConfig:
        data = run_config(tmp_path, output, max_steps=steps, tokenizer={"path": str(tmp_path / "tok")})
        data["model"] = {**LLAMA, "overrides": {**LLAMA["overrides"], **specials}}
        data["checkpoint"] = {"every_steps": 2}
        return TrainConfig.from_dict(data)

    train(config("straight", 4), progress=False)
    train(config("split", 2), progress=False)
    train(config("split", 4), progress=False, resume=True)
    assert losses(tmp_path / "split") == pytest.approx(losses(tmp_path / "straight"), abs=1e-6)
    for folder in ("split", "split/checkpoints/step-00000002"):
        assert Tokenizer.from_file(tmp_path / folder).chat_template == QWEN25
