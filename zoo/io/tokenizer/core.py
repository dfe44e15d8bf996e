"""The :class:`Tokenizer` wrapper: loading and saving, encode / decode, the batch call, named special ids.

Special tokens are added by :meth:`Tokenizer.encode` itself rather than by a post-processor, so the same
``add_bos`` / ``add_eos`` switches work for foreign tokenizers (BERT's ``[CLS]``/``[SEP]`` included).

Calling the tokenizer (:meth:`Tokenizer.__call__`) is Hugging Face's batch interface instead: a foreign
tokenizer's own post-processor frames each row, so the ids equal ``transformers.AutoTokenizer``'s; a tokenizer
without one (those zoo trains) gets zoo's framing, ``[*ids, eos]``. :meth:`Tokenizer.save_pretrained` writes
a framing into the exported ``tokenizer.json`` so that transformers frames rows too: that one by default, the
model's own from `zoo.to_hf` (a decoder's prompt ``[bos, *ids]``, as zoo's generation feeds it).

:meth:`Tokenizer.apply_chat_template` renders a conversation with the tokenizer's chat template (read from
``tokenizer_config.json`` or ``chat_template.jinja``) exactly as transformers does (`zoo.io.tokenizer.chat`);
a tokenizer without one gets zoo's simple default, ``<role>: <content><eos>`` per message.

Padding and truncation stored in a foreign ``tokenizer.json`` (sentence-transformers ships files padded to a
fixed 128) are dropped on load: padding is a property of a batch, asked for per call, as in transformers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Literal

from tokenizers import Encoding
from tokenizers import Tokenizer as HFTokenizer

from zoo.io.atomic import write_text_atomic
from zoo.io.jsonfile import TOKENIZER_BYTES, check_file_size
from zoo.io.names import CHAT_TEMPLATE_NAME, TOKENIZER_CONFIG_NAME, TOKENIZER_NAME
from zoo.io.paths import inside
from zoo.io.tokenizer.batch import Padding, Truncation, as_tensors, check_call_args, check_length, pad_rows
from zoo.io.tokenizer.chat import default_template, render_chat
from zoo.io.tokenizer.errors import TokenizerError, encode_checked
from zoo.io.tokenizer.pretrained import (
    framing_flags,
    read_tokenizer_config,
    tokenizer_config,
    with_framing,
    write_folder,
)
from zoo.io.tokenizer.specials import SPECIAL_TOKEN_ALIASES, SPECIAL_TOKENS, looked_for

PathLike = str | os.PathLike[str]


class Tokenizer:
    """A ``tokenizers.Tokenizer`` with zoo's conventions: explicit bos/eos switches and named special ids.

    ``tokenizer(texts, padding=True, return_tensors="pt")`` is the batch interface of transformers
    (:meth:`__call__`); :meth:`encode` / :meth:`decode` work on one row of plain ids.
    """

    def __init__(
        self,
        tokenizer: HFTokenizer,
        *,
        model_max_length: int | None = None,
        special_tokens: dict[str, str] | None = None,
        source: str | None = None,
        chat_template: str | Mapping[str, str] | None = None,
        named_tokens: Mapping[str, str] | None = None,
        chat_template_source: str | None = None,
    ) -> None:
        """Wrap ``tokenizer`` (its stored padding and truncation are dropped, on a copy).

        ``special_tokens`` (``{"pad": "[PAD]", ...}``, as a ``tokenizer_config.json`` names them) take
        precedence over the lookup by :data:`SPECIAL_TOKEN_ALIASES`; ``model_max_length`` is the default
        ``max_length`` of :meth:`__call__`; ``source`` (its file) names it in errors.

        ``chat_template``: the Jinja source of its chat template, or ``{name: source}`` for several (the
        ``"default"`` one is :attr:`chat_template`); ``named_tokens``: every special token a
        ``tokenizer_config.json`` names (``{"bos_token": "<s>", "sep_token": ...}``), the variables a
        template sees (by default the special tokens found, as ``{"bos_token": ...}``);
        ``chat_template_source``: the template's file, for errors.
        """
        names = dict(special_tokens or {})
        stored_pad = tokenizer.padding
        if stored_pad is not None or tokenizer.truncation is not None:
            # Stored settings would pad every encode to a fixed length (with zoo's eos landing after the
            # pads) and cut long texts silently. A copy, so the caller's tokenizer keeps its settings.
            tokenizer = HFTokenizer.from_str(tokenizer.to_str())
            tokenizer.no_padding()
            tokenizer.no_truncation()
        # transformers takes the pad token of stored padding when no tokenizer_config.json names one.
        if stored_pad and tokenizer.token_to_id(stored_pad["pad_token"]) == stored_pad["pad_id"]:
            names.setdefault("pad", stored_pad["pad_token"])
        self._tok = tokenizer
        self._names = names
        self.model_max_length = model_max_length
        self.source = source or "the tokenizer"  # for messages: its file, when loaded from one
        self._chars_per_token: int | None = None  # computed on first use (reads the whole vocabulary)
        templates = (
            {"default": chat_template} if isinstance(chat_template, str) else dict(chat_template or {})
        )
        self.chat_template: str | None = templates.pop("default", None)
        self._other_templates = templates  # named ones ("tool_use", ...), chosen by name
        self._named_tokens = dict(named_tokens) if named_tokens is not None else None
        self._template_source = chat_template_source

    @classmethod
    def from_file(cls, path: PathLike) -> Tokenizer:
        """Load a ``tokenizer.json`` (ours or a Hugging Face one); a directory means its ``tokenizer.json``.

        A ``tokenizer_config.json`` beside it (a transformers folder) supplies ``model_max_length``, the
        special tokens it names and its chat template, as ``AutoTokenizer.from_pretrained`` would use them;
        a ``chat_template.jinja`` there is the chat template (it wins over the config's, as in transformers).
        """
        file = Path(path)
        if file.is_dir():  # files found in a folder must not be links out of it (`zoo.io.paths`)
            file = inside(file, TOKENIZER_NAME)
        if not file.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {file}")
        # tokenizers reads the whole file: a 1 GB one is refused by its size first (ZOO_MAX_TOKENIZER_BYTES).
        check_file_size(file, TOKENIZER_BYTES, what=TOKENIZER_NAME, error=TokenizerError)
        try:
            tok = HFTokenizer.from_file(str(file))
        except Exception as err:  # tokenizers raises a bare Exception (bad JSON, a regex Oniguruma rejects)
            reason = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
            raise TokenizerError(
                f"{file}: not a tokenizer the tokenizers library can load: {reason}"
            ) from None
        if tok.get_vocab_size(with_added_tokens=True) == 0:
            raise TokenizerError(f"{file}: the tokenizer's vocabulary is empty: it cannot encode any text")
        config = read_tokenizer_config(
            inside(file.parent, TOKENIZER_CONFIG_NAME), inside(file.parent, CHAT_TEMPLATE_NAME)
        )
        return cls(
            tok,
            model_max_length=config.model_max_length,
            special_tokens=config.special_tokens,
            source=str(file),
            chat_template=config.chat_templates,
            named_tokens=config.named_tokens,
            chat_template_source=config.chat_template_file,
        )

    def save(self, path: PathLike) -> None:
        """Write ``tokenizer.json`` atomically: a reader sees the old file or the new one, never half of one."""
        write_text_atomic(Path(path), self._tok.to_str(pretty=True))

    def save_config(self, path: PathLike) -> None:
        """Write the ``tokenizer_config.json`` that goes beside :meth:`save`'s file (atomically): the special
        tokens, ``model_max_length`` and the chat templates, which :meth:`from_file` reads back."""
        config = tokenizer_config(
            self._tok,
            specials=self._config_specials(),
            model_max_length=self.model_max_length,
            chat_templates=self.chat_templates,
        )
        write_text_atomic(Path(path), json.dumps(config, indent=2, ensure_ascii=False) + "\n")

    def save_pretrained(
        self,
        directory: PathLike,
        *,
        model_max_length: int | None = None,
        add_bos: bool = False,
        add_eos: bool = True,
    ) -> Path:
        """Write a folder from which ``transformers.AutoTokenizer`` gives the ids of :meth:`__call__` (with
        the defaults) or of the framing asked for.

        Three files, each written atomically: ``tokenizer.json``; ``tokenizer_config.json`` (class
        ``PreTrainedTokenizerFast``, the special tokens that exist, ``model_max_length`` when given or
        known, the chat templates when it has any); ``special_tokens_map.json``. Without the config,
        transformers picks a tokenizer class from ``config.json``'s model_type instead (GPT-2's byte-level one
        for an exported gpt2), which splits and frames differently. Returns the folder.

        ``add_bos`` / ``add_eos``: how a tokenizer without a post-processor of its own (one zoo trained)
        frames a row there: its bos first, its eos last, each where the tokenizer has one (by default
        ``[*ids, eos]``, as :meth:`__call__`). Written as its post-processor and as the config's
        ``add_bos_token`` / ``add_eos_token`` (`framing_flags`). A tokenizer with a post-processor (a foreign
        one, a classifier's) keeps its own framing, whatever these say. `zoo.to_hf` passes its model's.
        """
        limit = self.model_max_length if model_max_length is None else model_max_length
        check_length("model_max_length", limit)
        backend, flags = self._tok, None
        if backend.post_processor is None:
            bos, eos = self.bos_id if add_bos else None, self.eos_id if add_eos else None
            backend, flags = with_framing(backend, bos=bos, eos=eos), framing_flags(backend, bos=bos, eos=eos)
        return write_folder(
            Path(directory),
            backend,
            specials=self._config_specials(),
            model_max_length=limit,
            chat_templates=self.chat_templates,
            flags=flags,
        )

    def _config_specials(self) -> dict[str, str | None]:
        """The special tokens a written config names: those found, then every one the read config named
        (``sep_token``, ``image_token``, ...), so that a chat template sees the same variables after a save."""
        found = {
            f"{name}_token": self._tok.id_to_token(token_id)
            for name, token_id in self.special_ids().items()
            if token_id is not None
        }
        return {**found, **(self._named_tokens or {})}

    @property
    def hf(self) -> HFTokenizer:
        """The wrapped ``tokenizers.Tokenizer``."""
        return self._tok

    # --- encoding ---------------------------------------------------------------------------------------
    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = True) -> list[int]:
        """Token ids of ``text``, optionally framed by bos / eos."""
        [encoding] = encode_checked(self._encode_batch, [text], source=self.source)
        return self._frame(encoding.ids, add_bos, add_eos)

    def encode_batch(
        self, texts: Sequence[str], *, add_bos: bool = False, add_eos: bool = True
    ) -> list[list[int]]:
        """:meth:`encode` for many texts (tokenized in parallel by the Rust backend)."""
        encodings = encode_checked(self._encode_batch, list(texts), source=self.source)
        return [self._frame(e.ids, add_bos, add_eos) for e in encodings]

    def encode_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Plain ids of ``texts``, no special tokens, encoded in parallel; without the character offsets where
        the library can skip them (``encode_batch_fast``). Errors: `encode_checked`."""
        batch = getattr(self._tok, "encode_batch_fast", None) or self._tok.encode_batch
        encode = partial(batch, add_special_tokens=False)
        return [encoding.ids for encoding in encode_checked(encode, list(texts), source=self.source)]

    def encode_words(self, words: Sequence[Sequence[str]]) -> list[Encoding]:
        """``tokenizers`` encodings of pre-split words (one list a text), no special tokens: ``word_ids``
        maps each token to its word (token classification puts a word's tag on its first token)."""
        encode = partial(self._tok.encode_batch, is_pretokenized=True, add_special_tokens=False)
        return encode_checked(encode, [list(row) for row in words], source=self.source)

    def _encode_batch(self, texts: Sequence[str]) -> list[Encoding]:
        """The backend's encodings of ``texts``, without special tokens (errors: `encode_checked`)."""
        return self._tok.encode_batch(list(texts), add_special_tokens=False)

    def _frame(self, ids: list[int], add_bos: bool, add_eos: bool) -> list[int]:
        if add_bos:
            ids = [self._required("bos"), *ids]
        if add_eos:
            ids = [*ids, self._required("eos")]
        return ids

    def _required(self, name: str) -> int:
        token_id = self._special_id(name)
        if token_id is None:
            raise ValueError(
                f"add_{name}=True but the tokenizer has no {name} token (looked for {looked_for(name)})"
            )
        return token_id

    # --- the batch interface of transformers ------------------------------------------------------------
    def __call__(
        self,
        text: str | Sequence[str],
        *,
        padding: Padding = False,
        truncation: Truncation = None,
        max_length: int | None = None,
        padding_side: Literal["right", "left"] = "right",
        return_tensors: Literal["pt"] | None = None,
        add_special_tokens: bool = True,
    ) -> dict[str, Any]:
        """Encode a text or a batch as transformers does: ``{"input_ids": ..., "attention_mask": ...}``.

        ``text``: one string (lists of ids, or (1, T) tensors) or a list of strings (lists of rows, or
        (B, T) int64 tensors with ``return_tensors="pt"``).

        Args:
            padding: False / "do_not_pad"; True / "longest" (to the longest row); "max_length" (to
                ``max_length``, longer rows left as they are). Pads with :attr:`pad_id`.
            truncation: True / "longest_first" / "only_first" cut each row to ``max_length`` tokens, special
                tokens included; None (the default) truncates when ``max_length`` is given without padding,
                as transformers does.
            max_length: the length for truncation and ``padding="max_length"``; default
                :attr:`model_max_length`.
            padding_side: "right", or "left" for decoder prompts (``generate`` needs them left-padded).
            return_tensors: None for lists, "pt" for torch tensors (rows must then have one length).
            add_special_tokens: frame each row. A tokenizer with a post-processor (BERT's ``[CLS] … [SEP]``,
                RoBERTa's, Llama's bos) frames as transformers does, giving ``AutoTokenizer``'s ids; one
                without (zoo-trained) gets zoo's ``[*ids, eos]``, as :meth:`encode`.

        Bad arguments raise ``ValueError`` naming the argument, before anything is encoded.
        """
        texts, single, pad_to, truncate = check_call_args(
            text,
            padding=padding,
            truncation=truncation,
            max_length=max_length,
            padding_side=padding_side,
            return_tensors=return_tensors,
            add_special_tokens=add_special_tokens,
        )
        limit = self.model_max_length if max_length is None else max_length
        if limit is None and (truncate or pad_to == "max_length"):
            wanted = f"truncation={truncation!r}" if truncate else "padding='max_length'"
            raise ValueError(f"{wanted} needs max_length (the tokenizer has no model_max_length)")
        pad_id = None
        if pad_to is not None:
            pad_id = self.pad_id
            if pad_id is None:
                raise ValueError(
                    f"padding={padding!r} needs a pad token but the tokenizer has none (looked for "
                    f"{looked_for('pad')}); pass padding=False"
                )

        rows = self._rows(texts, add_special_tokens=add_special_tokens, limit=limit if truncate else None)
        masks = [[1] * len(row) for row in rows]
        if pad_id is not None:
            width = limit if pad_to == "max_length" else max(map(len, rows), default=0)
            assert width is not None  # checked above: "max_length" padding has a limit
            pad_rows(rows, masks, width=width, pad_id=pad_id, side=padding_side)
        if return_tensors == "pt":
            return as_tensors(rows, masks)
        if single:
            return {"input_ids": rows[0], "attention_mask": masks[0]}
        return {"input_ids": rows, "attention_mask": masks}

    def _rows(self, texts: list[str], *, add_special_tokens: bool, limit: int | None) -> list[list[int]]:
        """Framed ids of each text, each cut to ``limit`` tokens (special tokens included) when given."""
        encodings = encode_checked(self._encode_batch, texts, source=self.source)
        processor = self._tok.post_processor if add_special_tokens else None
        eos = self.eos_id
        frame = [eos] if add_special_tokens and processor is None and eos is not None else []
        added = processor.num_special_tokens_to_add(False) if processor is not None else len(frame)
        if limit is not None and limit < added:
            raise ValueError(
                f"max_length ({limit}) is shorter than the {added} special tokens added to every row; "
                "raise it or pass add_special_tokens=False"
            )
        rows = []
        for encoding in encodings:
            if limit is not None and len(encoding.ids) > limit - added:
                # The text is cut, never the special tokens, as in transformers.
                encoding.truncate(limit - added)
            if processor is not None:
                encoding = self._tok.post_process(encoding, add_special_tokens=True)
            rows.append([*encoding.ids, *frame])
        return rows

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        """Text of ``ids``. Does not stop at eos: truncate generated ids first."""
        # int() accepts tensor / numpy scalars, so callers need not convert.
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def decode_batch(self, batch: Iterable[Iterable[int]], *, skip_special_tokens: bool = True) -> list[str]:
        """:meth:`decode` for many id sequences."""
        return [self.decode(ids, skip_special_tokens=skip_special_tokens) for ids in batch]

    # --- chat templates -----------------------------------------------------------------------------------
    @property
    def has_chat_template(self) -> bool:
        """Whether the tokenizer has a chat template of its own (else :meth:`apply_chat_template` uses
        :attr:`default_chat_template`)."""
        return self.chat_template is not None

    @property
    def chat_templates(self) -> dict[str, str]:
        """Every chat template by name: ``"default"`` (:attr:`chat_template`) and named ones such as
        ``"tool_use"`` (a config may hold several); empty when it has none."""
        default = {"default": self.chat_template} if self.chat_template is not None else {}
        return {**default, **self._other_templates}

    @property
    def default_chat_template(self) -> str:
        """zoo's template for a tokenizer without one (those zoo trains): each message as
        ``<role>: <content>`` closed by the eos token, after a bos at the start; ``add_generation_prompt``
        appends ``assistant:``. A model fine-tuned on it answers after ``assistant:`` and stops at eos.
        Only tokens the tokenizer has are written (without eos, a newline closes each message)."""
        tokens = self._template_tokens()
        has = {
            name: self._tok.token_to_id(tokens.get(f"{name}_token", "")) is not None
            for name in ("bos", "eos")
        }
        return default_template(bos=has["bos"], eos=has["eos"])

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str = False,
        tokenize: bool = True,
        chat_template: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> str | list[int]:
        """A conversation as the text (``tokenize=False``) or ids its chat model was trained on, equal to
        ``transformers.AutoTokenizer.apply_chat_template(..., return_dict=False)``.

        Args:
            messages: ``[{"role": "system" | "user" | "assistant" | ..., "content": str}, ...]``; a content
                may also be a list of parts (``{"type": "text", "text": ...}``, as OpenAI sends it), which is
                passed to the template as it is.
            add_generation_prompt: end with the header of an assistant turn, for the model to answer.
            continue_final_message: leave the last message open (no end-of-turn), for the model to continue
                it ("prefill"); a string names the field to continue (``"reasoning_content"``).
            tokenize: return ids (encoded without adding special tokens: the template writes them) rather
                than the text.
            chat_template: a template's Jinja source, or the name of one of :attr:`chat_templates`; default
                the tokenizer's own (the ``"tool_use"`` one when ``tools`` are given and it has one).
            tools, documents: JSON schemas of callable tools and retrieval documents, for templates that
                use them.
            **template_kwargs: more variables for the template (``date_string``, ``enable_thinking``); they
                override the special tokens (``bos_token``, ``eos_token``, ...) passed by default.

        Unlike transformers, which raises, a tokenizer without a template uses
        :attr:`default_chat_template`. Bad messages and template failures (including the template's own
        ``raise_exception``, such as "roles must alternate") raise one
        :class:`~zoo.io.tokenizer.chat.ChatTemplateError` (a ValueError) naming the template's file.
        """
        template, where = self._chosen_template(chat_template, tools)
        text = render_chat(
            template,
            messages,
            where=where,
            special_tokens=self._template_tokens(),
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tools=tools,
            documents=documents,
            template_kwargs=template_kwargs,
        )
        return self.encode_ids([text])[0] if tokenize else text

    def _chosen_template(self, chat_template: str | None, tools: object) -> tuple[str, str]:
        """(source, what to call it in errors) of the template :meth:`apply_chat_template` renders."""
        own = self._template_source or f"the chat template of {self.source}"
        templates = self.chat_templates
        if chat_template is not None:
            if chat_template in templates:
                return templates[chat_template], own
            return chat_template, "the chat_template argument"
        if tools is not None and "tool_use" in templates:
            return templates["tool_use"], own
        if self.chat_template is not None:
            return self.chat_template, own
        return self.default_chat_template, "zoo's default chat template"

    def _template_tokens(self) -> dict[str, str]:
        """The special-token variables of a chat template: those the config named, as transformers passes
        them; without a config, the special tokens found (``{"bos_token": "<s>", ...}``)."""
        if self._named_tokens is not None:
            return dict(self._named_tokens)
        return {
            f"{name}_token": token
            for name, token_id in self.special_ids().items()
            if token_id is not None and (token := self._tok.id_to_token(token_id)) is not None
        }

    # --- vocabulary ---------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of tokens, added (special) tokens included."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def chars_per_token(self) -> int:
        """An upper bound on the characters of plain text one token covers: twice the longest vocabulary
        entry (or WordPiece's ``max_input_chars_per_word``, a word it maps to one unknown token) plus one;
        `zoo.io.tokenizer.lengths` says why, and what it does not cover."""
        if self._chars_per_token is None:
            longest = max(map(len, self._tok.get_vocab(with_added_tokens=True)), default=1)
            # A file may set any word limit; past 1,024 a whole unknown word is not covered (see lengths).
            whole_word = min(getattr(self._tok.model, "max_input_chars_per_word", 0), 1024)
            self._chars_per_token = 2 * (max(longest, whole_word) + 1)
        return self._chars_per_token

    def token_to_id(self, token: str) -> int | None:
        """Id of ``token``, or None when it is not in the vocabulary."""
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """Token with id ``token_id``, or None when out of range."""
        return self._tok.id_to_token(token_id)

    def _special_id(self, name: str) -> int | None:
        named = self._names.get(name)
        if named is not None and self._tok.token_to_id(named) is not None:
            return self._tok.token_to_id(named)
        for token in SPECIAL_TOKEN_ALIASES[name]:
            token_id = self._tok.token_to_id(token)
            if token_id is not None:
                return token_id
        return None

    def special_ids(self) -> dict[str, int | None]:
        """``{"pad": id, "bos": id, "eos": id, "unk": id, "mask": id}``, None where absent."""
        return {name: self._special_id(name) for name in SPECIAL_TOKENS}

    @property
    def pad_id(self) -> int | None:
        """Id of the padding token, if any."""
        return self._special_id("pad")

    @property
    def bos_id(self) -> int | None:
        """Id of the beginning-of-sequence token (``[CLS]`` for BERT-style tokenizers), if any."""
        return self._special_id("bos")

    @property
    def eos_id(self) -> int | None:
        """Id of the end-of-sequence token (``[SEP]`` for BERT-style tokenizers), if any."""
        return self._special_id("eos")

    @property
    def unk_id(self) -> int | None:
        """Id of the unknown token, if any."""
        return self._special_id("unk")

    @property
    def mask_id(self) -> int | None:
        """Id of the mask token (masked language modelling), if any."""
        return self._special_id("mask")

    def __repr__(self) -> str:
        return f"Tokenizer({type(self._tok.model).__name__}, vocab_size={self.vocab_size})"
