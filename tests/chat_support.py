"""Tiny chat models for the `zoo chat` and `ChatSession` tests: a ChatML tokenizer, a model trained for a
few dozen steps to answer every message with one fixed sentence, and one that never stops talking."""

from __future__ import annotations

from pathlib import Path

import torch

import zoo
from zoo.io.tokenizer import Tokenizer, train_tokenizer

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = [
    "the cat sat on the mat",
    "the dog sat on the log",
    "a cat and a dog met on the mat",
    "the bird sang on the log",
    "hello there",
    "who are you",
    "tell me a story",
    "what did the dog do",
]
ANSWER = "the cat sat on the mat"  # what the trained model says to anything
QUESTIONS = CORPUS[3:]


def chat_tokenizer(template: str | None = CHATML) -> Tokenizer:
    """A BPE tokenizer of `CORPUS` with ChatML's two special tokens added, and ``template``."""
    tokenizer = train_tokenizer(iter(CORPUS * 3), kind="bpe", vocab_size=80, min_frequency=1)
    tokenizer.hf.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    tokenizer.chat_template = template
    return tokenizer


def save_chat_model(model: zoo.ZooModel, tokenizer: Tokenizer, directory: Path) -> Path:
    """``model`` and ``tokenizer`` saved as a zoo checkpoint (its tokenizer_config.json holds the template)."""
    zoo.save(model, directory, tokenizer=tokenizer)
    return directory


def _spec(tokenizer: Tokenizer, **overrides: object) -> zoo.ModelSpec:
    return zoo.preset("llama-tiny").override(vocab_size=tokenizer.vocab_size, **overrides)


def trained_model(tokenizer: Tokenizer) -> zoo.ZooModel:
    """llama-tiny trained (full-sequence LM loss, ~80 Adam steps, a second on a CPU) on one- and two-turn
    ChatML conversations whose answers are all `ANSWER`."""
    conversations = []
    for i, question in enumerate(QUESTIONS):
        turn = [{"role": "user", "content": question}, {"role": "assistant", "content": ANSWER}]
        other = QUESTIONS[(i + 1) % len(QUESTIONS)]
        conversations.append(turn)
        conversations.append(
            [*turn, {"role": "user", "content": other}, {"role": "assistant", "content": ANSWER}]
        )
        conversations.append([{"role": "system", "content": "be brief"}, *turn])
    rows = [tokenizer.apply_chat_template(c, tokenize=True) for c in conversations]
    width = max(map(len, rows))
    ids = torch.tensor([row + [0] * (width - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    labels = ids.masked_fill(mask == 0, -100)
    torch.manual_seed(0)
    model = zoo.build(_spec(tokenizer, num_layers=1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(80):
        loss = model(ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def endless_model(tokenizer: Tokenizer) -> zoo.ZooModel:
    """A random llama-tiny with room for long answers that never picks a stop token: the output rows of
    eos and <|im_end|> are zero, so their logits are 0 while some other token's logit is always larger."""
    torch.manual_seed(0)
    model = zoo.build(_spec(tokenizer, max_positions=4096)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 0.3 if "embed" in name else 2.0 / param.shape[-1] ** 0.5)
        head = dict(model.named_parameters())["lm_head.weight"]
        for token in ("</s>", "<|im_end|>"):
            head[tokenizer.token_to_id(token)] = 0.0
    return model
