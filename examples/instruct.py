"""Instruction tuning end to end, on generated data (nothing is downloaded):

    python examples/instruct.py                 # a few minutes on a CPU: runs/instruct/{pretrain,sft,dpo,grpo}
    python examples/instruct.py --quick         # a few steps of each stage (what the test runs)

1. **Pretrain** a small decoder (`task: causal_lm`) on arithmetic facts written as plain text, "3 plus 4 is 7.",
   every sum and difference of two numbers below 20. It learns the facts, not how to answer a question.
2. **Supervised fine-tuning** (`task: chat`) on conversations, "What is 3 plus 4?" answered either "It is 7."
   or "The answer to your question is 7." (half each), for 80% of the facts; the loss is on the answers only.
   The other 20% of the questions are held out: the model has seen those facts only as text, in pretraining.
3. **DPO** (`task: {kind: dpo, beta: 0.1, nll_coef: 1.0}`) on the training questions, the short answer chosen
   over the long one, with RPO's NLL term (``nll_coef``) so that the numbers both answers share are not
   unlearnt.
4. **GRPO** (`task: {kind: grpo, ...}`) on the training questions, online: 8 answers to each question sampled
   from the model as it trains, rewarded by `examples/rewards.py` for the right number (``correct``) and, less,
   for the short form (``short``); each answer is pushed up or down by how its reward compares with its group's.

After each stage the model answers the held-out questions greedily, in the tokenizer's chat template; the
script prints how many it gets right and how many of its answers are the short form. The figures the README
quotes come from a full run of this script.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import zoo
from zoo.io.tokenizer import Tokenizer, train_tokenizer
from zoo.training import TrainConfig

LIMIT = 20  # operands are 0 .. 19
HELD_OUT = 0.2  # of the questions, never asked in fine-tuning


@dataclass(frozen=True)
class Fact:
    a: int
    op: str  # "plus" or "minus"
    b: int

    @property
    def value(self) -> int:
        return self.a + self.b if self.op == "plus" else self.a - self.b

    def sentence(self) -> str:
        return f"{self.a} {self.op} {self.b} is {self.value}."

    def question(self) -> str:
        return f"What is {self.a} {self.op} {self.b}?"

    def short(self) -> str:
        return f"It is {self.value}."

    def long(self) -> str:
        return f"The answer to your question is {self.value}."


def facts() -> list[Fact]:
    """Every sum, and every difference that is not negative, of two numbers below `LIMIT`."""
    return [
        Fact(a, op, b)
        for a in range(LIMIT)
        for b in range(LIMIT)
        for op in ("plus", "minus")
        if op == "plus" or a >= b
    ]


def split(all_facts: list[Fact], seed: int) -> tuple[list[Fact], list[Fact]]:
    """(fine-tuning questions, held-out questions)."""
    shuffled = list(all_facts)
    random.Random(seed).shuffle(shuffled)
    cut = int(len(shuffled) * HELD_OUT)
    return shuffled[cut:], shuffled[:cut]


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_data(folder: Path, seed: int) -> dict[str, Any]:
    """Every file the three stages read, written into ``folder``; returns their paths and the held-out facts."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    all_facts = facts()
    tune, held_out = split(all_facts, seed)
    # Pretraining text: each fact a line, in several shuffled copies (a plain-text file, one example a line).
    lines = [fact.sentence() for fact in all_facts for _ in range(4)]
    rng.shuffle(lines)
    pretrain = folder / "pretrain.txt"
    pretrain.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def conversation(fact: Fact) -> dict[str, Any]:
        answer = fact.short() if rng.random() < 0.5 else fact.long()
        return {
            "messages": [
                {"role": "user", "content": fact.question()},
                {"role": "assistant", "content": answer},
            ]
        }

    sft_train = write_jsonl(folder / "sft.train.jsonl", [conversation(f) for f in tune])
    sft_valid = write_jsonl(folder / "sft.valid.jsonl", [conversation(f) for f in held_out])
    return {"pretrain": pretrain, "sft": (sft_train, sft_valid), "tune": tune, "held_out": held_out}


def write_prompts(path: Path, questions: Sequence[Fact]) -> Path:
    """GRPO's prompts: each question as one user turn (the task renders the chat template), with the ``answer``
    column the ``correct`` reward reads."""
    rows = [{"prompt": [{"role": "user", "content": f.question()}], "answer": f.value} for f in questions]
    return write_jsonl(path, rows)


def write_preferences(path: Path, questions: Sequence[Fact], tokenizer: Tokenizer) -> Path:
    """DPO pairs: the question as the chat template renders it up to the answer (without the leading bos, which
    the dpo task adds), the short answer chosen over the long one. Each answer starts with the space the template
    puts after "assistant:", so its tokens are those fine-tuning trained."""
    bos = tokenizer.id_to_token(tokenizer.bos_id) if tokenizer.bos_id is not None else ""
    rows = []
    for fact in questions:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": fact.question()}], add_generation_prompt=True, tokenize=False
        )
        assert isinstance(prompt, str)
        rows.append(
            {
                "prompt": prompt.removeprefix(bos or ""),
                "chosen": f" {fact.short()}",
                "rejected": f" {fact.long()}",
            }
        )
    return write_jsonl(path, rows)


@dataclass(frozen=True)
class Scores:
    correct: float  # share of held-out questions answered with the right number
    short: float  # share answered in the short form, "It is N."
    words: float  # mean words per answer

    def __str__(self) -> str:
        return f"correct {self.correct:6.1%}   short answers {self.short:6.1%}   words per answer {self.words:4.1f}"


@torch.no_grad()
def answer(
    model: Any, tokenizer: Tokenizer, questions: Sequence[str], *, max_new_tokens: int = 16
) -> list[str]:
    """Greedy answers to ``questions``, each asked as one user turn in the tokenizer's chat template."""
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        for q in questions
    ]
    # left-padded (every prompt ends where generation starts); the template already wrote the bos
    batch = tokenizer(
        prompts, padding=True, padding_side="left", add_special_tokens=False, return_tensors="pt"
    )
    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
    width = input_ids.shape[1]
    out = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens)
    eos = tokenizer.eos_id
    answers = []
    for row in out[:, width:].tolist():
        row = row[: row.index(eos)] if eos in row else row
        answers.append(tokenizer.decode(row).strip())
    return answers


def score(model: Any, tokenizer: Tokenizer, held_out: Sequence[Fact]) -> Scores:
    answers = answer(model, tokenizer, [fact.question() for fact in held_out])
    right = short = words = 0
    for fact, text in zip(held_out, answers):
        numbers = re.findall(r"\d+", text)
        right += bool(numbers) and int(numbers[-1]) == fact.value
        short += re.fullmatch(r"It is \d+\.", text) is not None
        words += len(text.split())
    n = len(held_out)
    return Scores(right / n, short / n, words / n)


def stage_config(
    *,
    task: str | dict[str, Any],
    train: Path,
    valid: Path,
    out: Path,
    tokenizer: Path,
    steps: int,
    lr: float,
    init_from: Path | None,
    extra: dict[str, Any] | None = None,
) -> TrainConfig:
    # A stage started from the previous one takes its model folder's tokenizer, with the chat template the SFT
    # stage wrote into it, so the final model exports with that template (`zoo convert --to-hf`).
    model: dict[str, Any] = (
        {"init_from": str(init_from)}
        if init_from is not None
        else {
            "preset": "gpt2-tiny",
            "overrides": {"d_model": 128, "num_layers": 4, "ffn.d_ff": 512, "dropout": 0.0},
        }
    )
    config: dict[str, Any] = {
        "model": model,
        "task": task,
        "data": {"train": str(train), "valid": str(valid)},
        **({"tokenizer": {"path": str(tokenizer)}} if init_from is None else {}),
        "optim": {"name": "adamw", "betas": [0.9, 0.95], "weight_decay": 0.0},
        "schedule": {"kind": "cosine", "lr": lr, "warmup_steps": max(1, steps // 10), "min_lr_ratio": 0.1},
        "batch": {"max_tokens": 2048},
        "max_steps": steps,
        "eval": {"every_steps": steps},
        "log_every": max(1, steps // 5),
        "output_dir": str(out),
        "seed": 0,
        "num_threads": 1,
        **(extra or {}),
    }
    return TrainConfig.model_validate(config)


REWARDS = Path(__file__).with_name("rewards.py")  # the reward functions GRPO names
GRPO: dict[str, Any] = {
    "kind": "grpo",
    "rewards": [f"{REWARDS}:correct", f"{REWARDS}:short"],
    "reward_weights": [1.0, 0.2],
    "group_size": 8,
    "max_new_tokens": 12,
    "beta": 0.04,
}
GRPO_LR = 3e-5  # 1e-4 drifts (held-out 45.9%); 3e-5 for 100 steps: 54.9%
GRPO_BATCH = {"batch": {"max_tokens": 4096, "max_sentences": 8}}  # 8 questions x 8 answers a step


def say(text: str) -> None:
    """One line per stage, as it starts: a long run is never silent for minutes."""
    print(f"... {text}", flush=True)


def main(argv: Sequence[str] | None = None) -> dict[str, Scores]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/instruct"))
    parser.add_argument("--quick", action="store_true", help="a few steps per stage (a smoke test)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    steps = (
        {"pretrain": 500, "sft": 300, "dpo": 60, "grpo": 100}
        if not args.quick
        else {"pretrain": 4, "sft": 4, "dpo": 4, "grpo": 2}
    )
    say(f"writing the generated facts and conversations to {args.out / 'data'}")
    data = write_data(args.out / "data", args.seed)
    # One tokenizer for every stage, trained on all the text the stages read (chat framing included).
    texts = data["pretrain"].read_text(encoding="utf-8").splitlines()
    texts += [message["content"] for row in _read_jsonl(data["sft"][0]) for message in row["messages"]]
    texts += ["user: assistant:"]
    say("training a 300-token BPE tokenizer on them")
    tokenizer = train_tokenizer(iter(texts), kind="bpe", vocab_size=300)
    tokenizer_file = args.out / "tokenizer.json"
    tokenizer.save(tokenizer_file)

    held_out = data["held_out"]
    results: dict[str, Scores] = {}
    pretrain = args.out / "pretrain"
    say(f"1/4 pretraining on the facts as text, {steps['pretrain']} steps -> {pretrain}")
    zoo.train(
        stage_config(task="causal_lm", train=data["pretrain"], valid=data["pretrain"], out=pretrain,
                     tokenizer=tokenizer_file, steps=steps["pretrain"], lr=3e-3, init_from=None),
        overwrite=True,
    )  # fmt: skip
    say(f"answering the {len(held_out)} held-out questions")
    results["pretrained"] = score(zoo.load(pretrain), tokenizer, held_out)
    print(f"pretrained          {results['pretrained']}")

    sft = args.out / "sft"
    say(f"2/4 supervised fine-tuning on the conversations, {steps['sft']} steps -> {sft}")
    zoo.train(
        stage_config(task="chat", train=data["sft"][0], valid=data["sft"][1], out=sft, tokenizer=tokenizer_file,
                     steps=steps["sft"], lr=1e-3, init_from=pretrain),
        overwrite=True,
    )  # fmt: skip
    say(f"answering the {len(held_out)} held-out questions")
    results["sft"] = score(zoo.load(sft), tokenizer, held_out)
    print(f"after SFT           {results['sft']}")

    dpo = args.out / "dpo"
    say("writing the preference pairs (short answer chosen over long)")
    dpo_train = write_preferences(args.out / "data" / "dpo.train.jsonl", data["tune"], tokenizer)
    dpo_valid = write_preferences(args.out / "data" / "dpo.valid.jsonl", held_out, tokenizer)
    say(f"3/4 DPO on the preference pairs, {steps['dpo']} steps -> {dpo}")
    zoo.train(
        stage_config(task={"kind": "dpo", "beta": 0.1, "nll_coef": 1.0}, train=dpo_train, valid=dpo_valid,
                     out=dpo, tokenizer=tokenizer_file, steps=steps["dpo"], lr=1e-4, init_from=sft),
        overwrite=True,
    )  # fmt: skip
    say(f"answering the {len(held_out)} held-out questions")
    results["dpo"] = score(zoo.load(dpo), tokenizer, held_out)
    print(f"after DPO           {results['dpo']}")

    grpo = args.out / "grpo"
    say("writing the GRPO prompts (the training questions, with their answers for the reward)")
    grpo_train = write_prompts(args.out / "data" / "grpo.train.jsonl", data["tune"])
    # validation's reward on a few held-out questions (sampled, 8 answers each: it costs a training step)
    grpo_valid = write_prompts(args.out / "data" / "grpo.valid.jsonl", held_out[:16])
    say(f"4/4 GRPO, {GRPO['group_size']} sampled answers per question, {steps['grpo']} steps -> {grpo}")
    zoo.train(
        stage_config(task=GRPO, train=grpo_train, valid=grpo_valid, out=grpo, tokenizer=tokenizer_file,
                     steps=steps["grpo"], lr=GRPO_LR, init_from=dpo, extra=GRPO_BATCH),
        overwrite=True,
    )  # fmt: skip
    say(f"answering the {len(held_out)} held-out questions")
    results["grpo"] = score(zoo.load(grpo), tokenizer, held_out)
    print(f"after GRPO          {results['grpo']}")
    return results


if __name__ == "__main__":
    main()
