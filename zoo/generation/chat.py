"""`ChatSession`: a conversation with a decoder-only model, through its tokenizer's chat template.

    session = ChatSession(model, tokenizer, system="Answer briefly.", max_new_tokens=128)
    for piece in session.reply("What is a transformer?"):
        print(piece, end="", flush=True)
    session.messages    # [{"role": "system", ...}, {"role": "user", ...}, {"role": "assistant", ...}]
    session.reset()     # the system prompt stays; set_system(text) replaces it and clears the history

Each turn renders the whole conversation with the template (``add_generation_prompt=True``), encodes it
and generates from it: simple and always what the template says; no KV cache is kept across turns (the
prompt is recomputed, which is cheap next to the answer's tokens for the short conversations of a terminal).

When to stop. An answer ends at the model's eos, the tokenizer's eos, or the template's end-of-turn token:
`end_of_turn_ids` renders a probe conversation (a user message and an assistant message with known
content) and takes the special tokens the template writes right after the assistant's content —
``<|im_end|>`` (ChatML), ``<|eot_id|>`` (Llama 3), ``<end_of_turn>`` (Gemma), ``</s>`` (Llama 2, Mistral).
A token is special when decoding it with ``skip_special_tokens=True`` gives nothing. A template whose turns
end in plain text only ("\\n\\n") has no such token: its answers stop at eos or ``max_new_tokens``.

The history. An answer is appended as the assistant's message once it ends — also when the caller stops
early (Ctrl-C, ``break``, ``close()``): the partial answer is kept as it is, unmarked, since it is what the
model said. When the rendered prompt would not leave ``max_new_tokens`` positions free
(``max_positions - max_new_tokens``), the oldest turns (a user message and its answers) are dropped from
the history for good, the system prompt kept; `ChatSession.dropped_turns` counts them, so a front end can
say so once. A message too long on its own is a ValueError, and the history is left as it was.

The tokenizer is anything with the methods of `ChatTokenizer`: zoo's `Tokenizer` (its chat template, or
its default one). Generation sits below io, so this module names no tokenizer class.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import Any, Protocol, cast

import torch

from zoo.generation.config import GenerationConfig, check_model, validated
from zoo.generation.generate import Run, iterate, prepare_stream
from zoo.generation.protocol import GenerativeModel
from zoo.generation.text import TextStream

__all__ = ["ChatSession", "ChatTokenizer", "Message", "apply_template", "end_of_turn_ids"]

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": text}

# The assistant's content in the probe conversation: plain ASCII letters, which no template rewrites
# (Llama 2's strips spaces, some capitalise roles, none touches content like this).
PROBE = "zoochatprobe"


class ChatTokenizer(Protocol):
    """What `ChatSession` needs of a tokenizer (zoo's `Tokenizer` has all of it)."""

    def apply_chat_template(
        self,
        messages: list[Message],
        *,
        add_generation_prompt: bool = ...,
        tokenize: bool = ...,
    ) -> str | list[int]: ...

    def encode(self, text: str, *, add_bos: bool = ..., add_eos: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int], *, skip_special_tokens: bool = ...) -> str: ...

    @property
    def eos_id(self) -> int | None: ...


def apply_template(
    tokenizer: ChatTokenizer,
    messages: Sequence[Mapping[str, str]],
    *,
    add_generation_prompt: bool,
    tokenize: bool,
) -> Any:
    """``messages`` through the tokenizer's chat template: text, or ids (no special tokens added beyond
    what the template writes). The one place this module calls the template."""
    return tokenizer.apply_chat_template(
        [dict(m) for m in messages], add_generation_prompt=add_generation_prompt, tokenize=tokenize
    )


def end_of_turn_ids(tokenizer: ChatTokenizer) -> tuple[int, ...]:
    """The special token ids the chat template writes right after an assistant message's content, in order
    (``(id of "<|im_end|>",)`` for ChatML); ``()`` when it writes none, or rewrites the content."""
    probe = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": PROBE}]
    text = apply_template(tokenizer, probe, add_generation_prompt=False, tokenize=False)
    at = text.rfind(PROBE)
    if at < 0:
        return ()
    found: list[int] = []
    for token in tokenizer.encode(text[at + len(PROBE) :], add_bos=False, add_eos=False):
        if token not in found and _is_special(tokenizer, token):
            found.append(token)
    return tuple(found)


def _is_special(tokenizer: ChatTokenizer, token: int) -> bool:
    """A special token has text of its own that ``skip_special_tokens`` removes."""
    return bool(tokenizer.decode([token], skip_special_tokens=False)) and not tokenizer.decode(
        [token], skip_special_tokens=True
    )


class ChatSession:
    """A conversation with a decoder-only model: its history, and `reply` to stream each answer.

    Args:
        model: a decoder-only zoo model (anything `zoo.generation` generates from that continues its input).
        tokenizer: its tokenizer, with a chat template (`ChatTokenizer`).
        system: the system prompt, or None for none.
        config, **settings: the search, as `zoo.generation.generate` takes it (``max_new_tokens``,
            ``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``repetition_penalty``, ``seed``...):
            greedy search or sampling, one answer at a time. ``seed`` seeds one generator for the whole
            session, so a session is reproducible and its answers still differ from turn to turn.
            ``eos_token_id``, when given, replaces the stop tokens found (see the module's docstring).
        assistant_model: speculative decoding's draft model (``prompt_lookup_num_tokens`` is a setting).

    Bad settings are a ValueError here, before any turn.
    """

    def __init__(
        self,
        model: GenerativeModel,
        tokenizer: ChatTokenizer,
        *,
        system: str | None = None,
        config: GenerationConfig | None = None,
        assistant_model: GenerativeModel | None = None,
        **settings: Any,
    ) -> None:
        model = check_model(model)
        self.assistant_model = assistant_model  # speculative decoding's draft (`zoo.generation.speculative`)
        if not model.continues_input:
            raise ValueError(
                f"ChatSession needs a decoder-only model; this one is a {model.spec.family} (its input is a "
                "source, not the conversation)"
            )
        config = validated(config, settings)
        if config.num_beams != 1 or config.num_return_sequences != 1:
            raise ValueError(
                "ChatSession streams one answer by greedy search or sampling: num_beams and "
                f"num_return_sequences must be 1, got {config.num_beams} and {config.num_return_sequences}"
            )
        limit = model.spec.max_positions
        if config.max_new_tokens >= limit:
            raise ValueError(
                f"ChatSession: max_new_tokens ({config.max_new_tokens}) leaves no room for the conversation "
                f"within the model's max_positions ({limit})"
            )
        self.model = model
        self.tokenizer = tokenizer
        vocab = model.spec.vocab_size
        if config.eos_token_id is None:
            found = [*end_of_turn_ids(tokenizer), tokenizer.eos_id, model.spec.eos_token_id]
            stops = tuple(dict.fromkeys(t for t in found if t is not None and 0 <= t < vocab))
        else:
            given = config.eos_token_id
            stops = (given,) if isinstance(given, int) else tuple(given)
        self.stop_ids: tuple[int, ...] = stops
        """The ids an answer ends at: end-of-turn token(s), the tokenizer's eos, the model's eos."""
        self._generator: torch.Generator | None = None
        if config.seed is not None:
            device = next(iter(model.parameters())).device
            self._generator = torch.Generator(device=device).manual_seed(config.seed)
        self.config = config.model_copy(update={"seed": None, "eos_token_id": list(stops)})
        self.dropped_turns = 0
        """How many of the oldest turns were dropped so far to fit the model's positions."""
        self._system = system or None
        self._messages: list[Message] = []
        self._turn = 0  # bumped by every reply and reset: an older answer then no longer writes the history
        self.reset()

    # --- the conversation -----------------------------------------------------------------------------
    @property
    def system(self) -> str | None:
        """The system prompt, or None."""
        return self._system

    @property
    def messages(self) -> list[Message]:
        """The conversation so far (a copy): the system message, if any, then user and assistant turns."""
        return [dict(m) for m in self._messages]

    def reset(self) -> None:
        """Clear the history; the system prompt stays."""
        self._turn += 1
        self._messages = [{"role": "system", "content": self._system}] if self._system else []

    def set_system(self, text: str | None) -> None:
        """Replace the system prompt (None or ``""``: none) and clear the history."""
        self._system = text or None
        self.reset()

    def render(self, *, add_generation_prompt: bool = True) -> str:
        """The text the model would see next: the conversation through the template ("" while it is
        empty: templates refuse an empty conversation)."""
        if not self._messages:
            return ""
        return str(
            apply_template(
                self.tokenizer, self._messages, add_generation_prompt=add_generation_prompt, tokenize=False
            )
        )

    def prompt_ids(self, message: str | None = None) -> list[int]:
        """The ids the model would be given for ``message`` as the next user turn (None: the conversation as
        it is), with the generation prompt; older turns are not dropped here."""
        messages = [*self._messages, *([{"role": "user", "content": message}] if message is not None else [])]
        return self._encode(messages)

    # --- answering --------------------------------------------------------------------------------------
    def reply(self, message: str) -> Iterator[str]:
        """Add ``message`` as the user's turn and stream the answer, piece by piece, as text.

        The prompt is built and every setting checked now (a ValueError before any compute); the tokens
        are computed as the iterator is read. The user message and the answer enter the history when the
        iterator ends, is closed or is dropped — with a partial answer if it was stopped early.
        """
        if not isinstance(message, str) or not message.strip():
            raise ValueError("ChatSession.reply: the message is empty; give some text")
        messages, prompt, dropped = self._fit([*self._messages, {"role": "user", "content": message}])
        run = prepare_stream(
            self.model,
            torch.tensor([prompt]),
            None,
            self.config,
            {},
            self._generator,
            False,
            assistant_model=self.assistant_model,
        )
        self.dropped_turns += dropped
        self._messages = messages[:-1]  # the dropped turns are gone for good
        self._turn += 1
        return self._answer(run, messages, self._turn)

    def _answer(self, run: Run, messages: list[Message], turn: int) -> Iterator[str]:
        stops = set(self.stop_ids)
        # No prompt as context: the pieces then join to decode(answer), the history's text (a continuation
        # would keep the space a word-joining decoder puts after the prompt's last word).
        text = TextStream(self.tokenizer)
        new: list[int] = []
        steps = cast("Generator[torch.Tensor, None, None]", iterate(run))  # a generator function's
        try:
            for tokens in steps:  # (1,)
                token = int(tokens[0])
                if token in stops:  # the last step: the stop token is not part of the answer
                    break
                new.append(token)
                piece = text.push(token)
                if piece:
                    yield piece
            rest = text.flush()
            if rest:
                yield rest
        finally:
            steps.close()  # the model's train/eval mode is restored now, not when collected
            if turn == self._turn:  # no reply or reset since: this answer is the conversation's latest
                answer = self.tokenizer.decode(new, skip_special_tokens=True)
                self._messages = [*messages, {"role": "assistant", "content": answer}]

    def _fit(self, messages: list[Message]) -> tuple[list[Message], list[int], int]:
        """``messages`` without their oldest turns, as few as needed for the prompt to leave
        ``max_new_tokens`` positions free; the prompt's ids; how many turns were dropped."""
        limit, room = self.model.spec.max_positions, self.config.max_new_tokens
        budget = limit - room
        dropped = 0
        while True:
            ids = self._encode(messages)
            if len(ids) <= budget:
                return messages, ids, dropped
            first = 1 if messages[0]["role"] == "system" else 0
            if len(messages) - first <= 1:  # the new message is all that is left
                raise ValueError(
                    f"the message is too long: with the template it takes {len(ids)} tokens, more than the "
                    f"model's max_positions ({limit}) - max_new_tokens ({room}) = {budget}"
                )
            end = first + 1  # the oldest turn: its user message and what follows up to the next one
            while end < len(messages) - 1 and messages[end]["role"] != "user":
                end += 1
            messages = [*messages[:first], *messages[end:]]
            dropped += 1

    def _encode(self, messages: list[Message]) -> list[int]:
        ids = apply_template(self.tokenizer, messages, add_generation_prompt=True, tokenize=True)
        return [int(i) for i in ids]
