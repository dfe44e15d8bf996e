"""Supervised fine-tuning on conversations (``task: chat``): a decoder learns the assistant's answers.

Raw data is JSON lines, one conversation a line, in any of three shapes:

    {"messages": [{"role": "system", "content": "..."}, {"role": "user", ...}, {"role": "assistant", ...}]}
    {"conversations": [{"from": "system" | "human" | "gpt", "value": "..."}, ...]}     ShareGPT
    {"prompt": "...", "response": "..."}                  one user turn and one assistant turn

Roles are OpenAI's: system, user, assistant (ShareGPT's human is user, gpt is assistant). A conversation
needs at least one assistant message. A bad line (not JSON, a missing key, a role of another name, content
that is not a string) is a `DataError` naming ``file:line`` and the field, or is skipped and counted with
``data.on_bad_line: skip``.

A conversation is rendered to text by the tokenizer's chat template (its ``chat_template``, else
`Tokenizer.default_chat_template`) and that text encoded once, without added special tokens: the template
writes bos and every role marker. What is trained is found by rendering prefixes with the same template:
for assistant message i,

    prefix_i   = render(messages[:i], add_generation_prompt=True)     the prompt the model answers
    through_i  = render(messages[:i + 1])                             the conversation through the answer
    trained    = characters [len(prefix_i), len(through_i)) of the whole rendering

so an answer's span is its content and whatever the template closes the turn with (``<|im_end|>\\n`` in
ChatML, ``<|eot_id|>`` in Llama 3, ``</s>`` in the default template): the model learns to stop. The
generation prompt itself (``<|im_start|>assistant\\n``) is the prompt's, not trained. Each rendering must be
a prefix of the next (prefix_i of through_i, through_i of the whole): a template that renders earlier
turns differently once later ones follow (some drop earlier reasoning) has no such spans, and is refused
naming the line. A token is trained when any character it covers is in a trained span (offsets of the one
encoding); prepared data keeps that 0/1 mask per token as its ``labels`` side, beside the ``tokens``
side, both memory-mapped. ``task: {kind: chat, train_on_prompt: true}`` trains every token instead, the
mask unused.

With a length limit a conversation is cut before it is rendered (`rendering`: its messages kept until their
contents hold more characters than the limit can cover), and one left with no answer within the limit is
dropped, counted (`LengthCuts`), as it is prepared and when a run's shorter limit cuts prepared data.

Batches are those of causal LM: right-padded ids and mask, position t predicting token t + 1 where token
t + 1 is trained (-100 elsewhere, and on padding). With ``data.packing`` the conversations are concatenated
and cut into ``block_size`` windows (`zoo.training.tasks.language_model.Windows`, no framing: the template
framed them); ``documents: separate`` gives each conversation its own attention block and positions, and
no target crosses from one conversation into the next. ``documents: joined`` lets a window's later
conversations see the earlier ones, as early packed SFT did; the loss still covers only answers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from zoo.io.tokenizer import ChatTemplateError, Tokenizer
from zoo.io.tokenizer.errors import encode_checked, lone_surrogate
from zoo.io.tokenizer.lengths import char_budget, cut_messages
from zoo.losses import IGNORE_INDEX
from zoo.spec import DecoderSpec, ModelSpec
from zoo.training.batching import Batch
from zoo.training.config import ConfigError, DataConfig
from zoo.training.data import DataError
from zoo.training.data.prepare import tokenizer_fingerprint
from zoo.training.data.shards import PreparedData, SideInfo
from zoo.training.data.sources import OnBadLine, ReadStats, Record, Source
from zoo.training.task_settings import ChatSettings
from zoo.training.tasks.base import (
    Encode,
    Framing,
    LengthCuts,
    Limits,
    Split,
    Task,
    Tokenizers,
    Units,
    cut_texts,
    example_units,
    pad,
    rows,
)
from zoo.training.tasks.jsonl import parsed_lines
from zoo.training.tasks.language_model import NextTokens, Windows, packed_windows

ROLES = ("system", "user", "assistant")
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
}
NO_FRAMING = Framing()  # the template writes bos and the turn markers


class Chat(Task):
    name = "chat"
    settings_type = ChatSettings
    settings: ChatSettings
    family = "decoder"
    chunks_loss = True
    sides: ClassVar[tuple[str, ...]] = ("tokens", "labels")
    fields: ClassVar[tuple[str, ...]] = ("json",)  # the raw line; `records` parses it
    packs = True

    # -- the model -------------------------------------------------------------------------------------------

    @classmethod
    def natural_for(cls, spec: ModelSpec) -> bool:
        return False  # a decoder trains as causal_lm unless the config names chat

    def check_model(self, spec: ModelSpec, *, where: str) -> None:
        if isinstance(spec, DecoderSpec) and spec.lm_head is None:
            raise ConfigError("task chat needs an LM head; the spec has lm_head: null")

    # -- tokenizers --------------------------------------------------------------------------------------

    def tokenizer_lines(self, records: Iterator[Record], *, side: str) -> Iterator[str]:
        """Each message as zoo's default template writes it (``role: content``), for a tokenizer trained on
        the conversations, which will render with that template."""
        for record in records:
            for role, content in zip(record.fields["roles"], record.fields["contents"]):
                yield f"{role}: {content}"

    # -- data --------------------------------------------------------------------------------------------

    def check_data(self, data: DataConfig) -> None:
        self.refuse_parallel_files(
            data, "data: chat reads one JSON-lines file per split, not {source, target} files"
        )

    def source(self, files: Path | Any, *, on_bad_line: OnBadLine = "error") -> Source:
        return Source("text", (files,), fields=self.fields, on_bad_line=on_bad_line)

    def records(self, source: Source, *, stats: ReadStats | None = None) -> Iterator[Record]:
        """Conversations as ``{"roles": [...], "contents": [...]}`` records, whichever shape the line has."""
        return parsed_lines(source, task="chat", stats=stats, parse=_conversation_record)

    def side_infos(self, tokenizers: Tokenizers, *, info: Mapping[str, Any]) -> dict[str, SideInfo]:
        sides = super().side_infos(tokenizers, info=info)
        sides["labels"] = SideInfo(dtype="uint8")  # 1: the token is trained
        return sides

    def tokenizer_of(self, side: str, tokenizers: Tokenizers) -> Tokenizer | None:
        return tokenizers.target if side == "tokens" else None

    def frame_tokenizer(self, tokenizer: Tokenizer) -> Tokenizer:
        """The tokenizer with the template its conversations are rendered by written into it: zoo's default
        one when it has none of its own, so that the run's ``tokenizer_config.json``, its checkpoints and an
        export (``zoo convert --to-hf``) carry the template the model was fine-tuned with, and transformers,
        ``zoo chat`` and ``zoo serve`` ask the model the same way. (Prepared data is unaffected: its
        fingerprint already names the template in use, default or not.)"""
        if tokenizer.chat_template is None:
            tokenizer.chat_template = tokenizer.default_chat_template
        return tokenizer

    def fingerprint(self, side: str, tokenizers: Tokenizers) -> str | None:
        """The tokenizer's fingerprint and the chat template's: either changes the ids and the mask."""
        if side != "tokens":
            return None
        tok = tokenizers.target
        both = f"{tokenizer_fingerprint(tok)}\n{chat_template(tok)}"
        return "sha256:" + hashlib.sha256(both.encode("utf-8")).hexdigest()

    def encoder(self, tokenizers: Tokenizers, *, cuts: LengthCuts | None, labels: Any = ()) -> Encode:
        tok = tokenizers.target
        template = chat_template(tok)
        encode_batch = partial(tok.hf.encode_batch, add_special_tokens=False)  # with offsets
        budget = char_budget(tok, cuts.limits.max_length) if cuts is not None else None

        def encode(records: list[Record]) -> dict[str, list[Any]]:
            rendered = [rendering(record, tok, template, budget=budget) for record in records]
            texts, over = cut_texts([text for text, _ in rendered], tok, cuts)
            encodings = encode_checked(encode_batch, texts, source=tok.source)
            ids = [encoding.ids for encoding in encodings]
            masks = [
                trained_tokens(np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2), spans).tolist()
                for encoding, (_, spans) in zip(encodings, rendered)
            ]
            if cuts is not None:  # the first max_length tokens kept: the template framed them already
                cuts.apply(records, [(ids, 0), (masks, 0)], set(over), trains=lambda i: any(masks[i][1:]))
            return {"tokens": ids, "labels": masks}

        return encode

    def framed_sides(self, tokenizers: Tokenizers) -> dict[str, int]:
        return {"tokens": 0}

    def units(self, split: Split, *, tokenizers: Tokenizers, limits: Limits) -> Units:
        packing = self.packing
        if packing is None:  # a conversation the limit leaves without an answer is skipped, counted
            trains = partial(answers_within, split.data, limits.max_length)
            return example_units(split, self.framed_sides(tokenizers), limits=limits, trains=trains)
        return packed_windows(split, NO_FRAMING, packing, limits, side="tokens").units()

    def collator(
        self,
        split: Split,
        units: Units,
        *,
        spec: ModelSpec,
        tokenizers: Tokenizers,
        limits: Limits,
    ) -> ChatCollator:
        assert spec.pad_token_id is not None  # wire_spec refuses a spec without one
        packing = self.packing
        windows = (
            packed_windows(split, NO_FRAMING, packing, limits, side="tokens") if packing is not None else None
        )
        return ChatCollator(
            split,
            units,
            pad_id=spec.pad_token_id,
            max_length=limits.max_length,
            train_on_prompt=self.settings.train_on_prompt,
            windows=windows,
            separate=packing is not None and packing.documents == "separate",
        )


# --- reading conversations ----------------------------------------------------------------------------------


def _conversation_record(record: Record, line: str) -> Record | str:
    """``record``'s line as a ``{"roles": [...], "contents": [...]}`` record, or what is wrong with it."""
    found = conversation(line)
    if isinstance(found, str):
        return found
    roles, contents = found
    return Record(record.path, record.line, {"roles": roles, "contents": contents})


def conversation(line: str) -> tuple[list[str], list[str]] | str:
    """(roles, contents) of one JSON line in any of the three shapes, or what is wrong with it."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as error:
        return f"not JSON ({error.msg} at column {error.colno})"
    except (ValueError, RecursionError):  # Python's 4,300-digit integers; nesting past the C parser's depth
        return "not JSON this reader accepts (an integer over 4,300 digits, or nested too deeply)"
    if not isinstance(obj, dict):
        return f"expected a JSON object, found {_kind(obj)}"
    if "messages" in obj:
        found = _turns(obj["messages"], "messages", "role", "content", {r: r for r in ROLES})
    elif "conversations" in obj:
        found = _turns(obj["conversations"], "conversations", "from", "value", SHAREGPT_ROLES)
    elif "prompt" in obj or "response" in obj:
        for key in ("prompt", "response"):
            if not isinstance(obj.get(key), str):
                return f"{key} must be a string (a prompt / response pair), found {_kind(obj.get(key))}"
        return ["user", "assistant"], [obj["prompt"], obj["response"]]
    else:
        keys = ", ".join(map(repr, list(obj)[:8])) or "none"
        return f'expected "messages", "conversations" or "prompt" and "response" (keys: {keys})'
    if isinstance(found, str):
        return found
    if "assistant" not in found[0]:
        return "no assistant message: nothing to train on"
    if found[0][0] == "assistant":  # its prompt would be an empty conversation, which no template renders
        return "the first message is the assistant's; a conversation opens with a system or user message"
    return found


def _turns(
    items: Any, key: str, role_key: str, content_key: str, roles: Mapping[str, str]
) -> tuple[list[str], list[str]] | str:
    if not isinstance(items, list) or not items:
        return f"{key} must be a non-empty list of messages, found {_kind(items)}"
    names, contents = [], []
    for i, item in enumerate(items):
        where = f"{key}[{i}]"
        if not isinstance(item, dict):
            return f"{where} must be an object with {role_key!r} and {content_key!r}, found {_kind(item)}"
        role, content = item.get(role_key), item.get(content_key)
        if not isinstance(role, str) or role not in roles:
            found = repr(role) if isinstance(role, str) else _kind(role)
            return f"{where}.{role_key} is {found}; expected one of {', '.join(roles)}"
        if not isinstance(content, str):
            return f"{where}.{content_key} must be a string, found {_kind(content)}"
        names.append(roles[role])
        contents.append(content)
    return names, contents


def _kind(value: Any) -> str:
    kinds = {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
    }
    return "nothing" if value is None else kinds.get(type(value), f"a {type(value).__name__}")


# --- the template and the trained spans ---------------------------------------------------------------------


def chat_template(tokenizer: Tokenizer) -> str:
    """The template conversations are rendered with: the tokenizer's own, else zoo's default."""
    return tokenizer.chat_template if tokenizer.chat_template is not None else tokenizer.default_chat_template


def render(
    tokenizer: Tokenizer, template: str, messages: list[dict[str, str]], *, add_generation_prompt: bool
) -> str:
    """``messages`` as ``template`` writes them (text, not ids)."""
    text = tokenizer.apply_chat_template(
        messages, chat_template=template, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    assert isinstance(text, str)
    return text


def rendering(
    record: Record, tokenizer: Tokenizer, template: str, *, budget: int | None = None
) -> tuple[str, list[tuple[int, int]]]:
    """(the whole conversation as text, the character spans trained: each answer through its turn's end).

    With ``budget``, the characters a length limit can keep (`zoo.io.tokenizer.lengths.char_budget`), a
    conversation whose contents hold more is cut before it is rendered (`cut_messages`), so a 50 MB line is
    never rendered (nor its prompts, once per answer): its rendering is then longer than the budget and
    begins as the whole conversation's does. Should the template write less than the cut contents (one
    that leaves a message out), the whole conversation is rendered instead.

    A template that cannot render the conversation, or whose renderings are not prefixes of each other,
    is a `DataError` naming the line."""
    roles, contents = record.fields["roles"], record.fields["contents"]
    for i, content in enumerate(contents):
        if (at := lone_surrogate(content)) is not None:
            raise DataError(
                f"{record.origin}: messages[{i}] holds a lone UTF-16 surrogate at character {at}: not valid "
                "Unicode, so no tokenizer can encode it"
            )
    if budget is not None:
        kept, cut = cut_messages(contents, budget)
        if cut:
            try:
                full, spans = _spans(record, tokenizer, template, list(zip(roles, kept)), stop=budget)
            except DataError:  # a template that refuses the cut conversation: the whole one decides
                pass
            else:
                if len(full) > budget and len(full) >= sum(map(len, kept)):  # all it was given written
                    return full, spans
    return _spans(record, tokenizer, template, list(zip(roles, contents)))


def _spans(
    record: Record,
    tokenizer: Tokenizer,
    template: str,
    turns: list[tuple[str, str]],
    *,
    stop: int | None = None,
) -> tuple[str, list[tuple[int, int]]]:
    """`rendering` of the messages ``turns`` (role, content); with ``stop``, the answers whose prompt
    renders past that many characters (past the cut) are not looked for: each costs a render."""
    messages = [{"role": role, "content": content} for role, content in turns]

    def text(upto: int, *, prompt: bool) -> str:
        try:
            return render(tokenizer, template, messages[:upto], add_generation_prompt=prompt)
        except ChatTemplateError as error:  # the template's raise_exception, or Jinja's errors, in its words
            what = "the conversation" if upto == len(messages) else f"messages[:{upto}]"
            raise DataError(f"{record.origin}: the chat template cannot render {what}: {error}") from None

    full = text(len(messages), prompt=False)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prefix = text(i, prompt=True)
        if stop is not None and len(prefix) >= stop:
            break  # this answer and the later ones begin past the cut: nothing of theirs is trained
        through = text(i + 1, prompt=False)
        if not through.startswith(prefix):
            raise DataError(
                f"{record.origin}: the chat template does not begin assistant message {i} with its generation "
                "prompt (the rendering of the messages before it with add_generation_prompt is not a prefix "
                "of the rendering through it), so the answer cannot be found"
            )
        if not full.startswith(through):
            raise DataError(
                f"{record.origin}: the chat template renders the conversation through assistant message {i} "
                "differently once later messages follow (it is not prefix-consistent: some templates drop "
                "earlier turns' reasoning), so the answer cannot be found; use a template that renders "
                "earlier turns unchanged"
            )
        spans.append((len(prefix), len(through)))
    return full, spans


def answers_within(data: PreparedData, limit: int, examples: np.ndarray) -> np.ndarray:
    """(n,) bool: whether each of ``examples`` trains a token within its first ``limit`` (a target: a
    trained token after the first)."""
    return np.array([row[1:].any() for row in data.read_rows(examples, "labels", limit=limit)], dtype=bool)


def trained_tokens(offsets: np.ndarray, spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """(T,) uint8: 1 for a token covering any character of a trained span. ``offsets``: (T, 2) character
    [start, end) of each token in the rendered text."""
    starts, ends = offsets[:, 0], offsets[:, 1]
    trained = np.zeros(len(offsets), dtype=bool)
    for low, high in spans:  # one pass per answer, vectorised over the tokens
        trained |= (starts < high) & (ends > low)
    return trained.astype(np.uint8)


# --- batches ------------------------------------------------------------------------------------------------


class ChatCollator:
    """Units -> a `Batch`: ``input_ids``, ``attention_mask`` (and, for separate packed conversations,
    ``document_ids``); targets the next token where it is trained, -100 elsewhere."""

    def __init__(
        self,
        split: Split,
        units: Units,
        *,
        pad_id: int,
        max_length: int,
        train_on_prompt: bool,
        windows: Windows | None,
        separate: bool,
    ) -> None:
        self.data, self.units, self.pad_id, self.max_length = split.data, units, pad_id, max_length
        self.train_on_prompt, self.windows, self.separate = train_on_prompt, windows, separate

    def __call__(self, units: np.ndarray, *, generator: torch.Generator | None = None) -> Batch:
        documents = None
        if self.windows is None:
            examples = self.units.example_indices(units)
            limit = self.max_length  # prepared data cut to a longer limit (or none) is cut here
            ids, mask = pad(
                [row[:limit] for row in rows(self.data, examples, "tokens")], self.pad_id
            )  # (B, T)
            trained, _ = pad([row[:limit] for row in rows(self.data, examples, "labels")], 0)  # (B, T)
        else:
            tokens, docs = self.windows.tokens(units)
            ids, mask = pad(tokens, self.pad_id)  # (B, T)
            trained, _ = pad(self.windows.tokens(units, side="labels")[0], 0)  # (B, T)
            if self.separate:
                documents, _ = pad(docs, -1)  # (B, T); padding: a document of its own
        _, targets = NextTokens()(ids, mask, documents, None)  # (B, T)
        if not self.train_on_prompt:
            targets[:, :-1].masked_fill_(trained[:, 1:] == 0, IGNORE_INDEX)  # t predicts t + 1: its label
        inputs = {"input_ids": ids, "attention_mask": mask}
        if documents is not None:
            inputs["document_ids"] = documents
        return Batch(inputs, targets, int(mask.sum()))
