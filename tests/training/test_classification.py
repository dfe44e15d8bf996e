"""Fine-tuning encoders for sequence and token classification: data, labels, the loop, --init-from."""

from __future__ import annotations

import json
import random
import runpy
from pathlib import Path
from typing import Any

import pytest
import torch

import zoo
from zoo.cli import main
from zoo.io.tokenizer import train_tokenizer
from zoo.training import TrainConfig, Trainer, train
from zoo.training.config import ConfigError
from zoo.training.data import DataError
from zoo.training.data.sources import Record
from zoo.training.tasks import get_task
from zoo.training.tasks.base import Tokenizers
from zoo.training.tasks.classification import ClassificationMetric

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# bert-tiny at a size that trains in a few seconds.
SMALL = {"preset": "bert-tiny", "overrides": {"d_model": 32, "attention.num_heads": 2, "ffn.d_ff": 64}}


def sentiment_config(tmp_path: Path, **overrides: Any) -> TrainConfig:
    """The example config (examples/classify.yaml), run from the repository root, into ``tmp_path``."""
    overrides = {"output_dir": str(tmp_path / "run"), "eval.every_steps": None, **overrides}
    config = TrainConfig.from_yaml(EXAMPLES / "classify.yaml", **overrides)
    root = EXAMPLES.parent
    data = {"train": str(root / str(config.data.train)), "valid": str(root / str(config.data.valid))}
    return config.override(data=data)


def test_example_config_learns_the_toy_sentiment_task_well_above_chance(tmp_path: Path) -> None:
    """A fast version of `zoo train examples/classify.yaml` (300 steps there, 100 here)."""
    result = train(sentiment_config(tmp_path, max_steps=100), progress=False)
    assert result.final["val_accuracy"] >= 0.8, result.final  # chance: 0.5 (102 vs 98 held-out lines)
    classifier = result.model.spec.heads.classifier
    assert classifier.labels == ("negative", "positive") and classifier.pooling == "pooler"
    assert result.model.spec.heads.mlm is None
    lines = [json.loads(line) for line in (result.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["val_accuracy"] == result.final["val_accuracy"] and "val_f1" not in lines[-1]
    reloaded = zoo.load(result.output_dir)
    assert reloaded.spec == result.model.spec


def test_a_trained_classifier_exported_to_transformers_frames_and_predicts_the_same(tmp_path: Path) -> None:
    """The run's tokenizer frames texts as training did ([CLS] text [SEP]), in zoo's batch call and in
    transformers' AutoTokenizer on the exported folder; the exported model gives the same logits."""
    transformers = pytest.importorskip("transformers")
    result = train(sentiment_config(tmp_path, max_steps=5), progress=False)
    model, tok = result.model, zoo.load_tokenizer(result.output_dir)
    texts = ["the plot was not very good", "honestly , the songs were superb but the ending was dull"]
    batch = tok(texts, padding=True, return_tensors="pt")
    assert batch["input_ids"][:, 0].eq(tok.bos_id).all()  # the sequence head reads [CLS]
    first = batch["input_ids"][0][batch["attention_mask"][0].bool()].tolist()  # without the padding
    assert first == tok.encode(texts[0], add_bos=True, add_eos=True)  # as training framed it
    zoo.to_hf(model, tmp_path / "hf", tokenizer=tok)
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    hf_model = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    hf_batch = hf_tok(texts, padding=True, return_tensors="pt")
    assert torch.equal(hf_batch["input_ids"], batch["input_ids"])
    with torch.no_grad():
        ours = model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        theirs = hf_model(input_ids=hf_batch["input_ids"], attention_mask=hf_batch["attention_mask"]).logits
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    assert hf_model.config.id2label == {0: "negative", 1: "positive"}


def test_bundled_sentiment_data_is_what_its_script_writes(tmp_path: Path) -> None:
    runpy.run_path(str(EXAMPLES / "sentiment_data.py"), run_name="not_main")["main"](tmp_path)
    for name in ("sentiment.train.tsv", "sentiment.valid.tsv"):
        assert (tmp_path / name).read_text() == (EXAMPLES / "data" / name).read_text()


# -- token classification -----------------------------------------------------------------------------------

NAMES, WORDS, CITIES = (
    ["ada", "bo", "cy", "dee"],
    ["met", "saw", "and", "then", "left"],
    ["rome", "oslo", "lima"],
)


def tagged_sentences(n: int, seed: int) -> list[tuple[list[str], list[str]]]:
    """Toy named-entity sentences: names are PER; a city after "in" is LOC; the rest O."""
    rng = random.Random(seed)
    sentences = []
    for _ in range(n):
        tokens, tags = [], []
        for _ in range(rng.randint(3, 7)):
            kind = rng.random()
            if kind < 0.3:
                tokens.append(rng.choice(NAMES)), tags.append("B-PER")
            elif kind < 0.5:
                tokens += ["in", rng.choice(CITIES)]
                tags += ["O", "B-LOC"]
            else:
                tokens.append(rng.choice(WORDS + CITIES)), tags.append("O")  # a bare city is not LOC
        sentences.append((tokens, tags))
    return sentences


def write_jsonl(path: Path, sentences: list[tuple[list[str], list[str]]]) -> Path:
    path.write_text("".join(json.dumps({"tokens": t, "tags": g}) + "\n" for t, g in sentences))
    return path


def write_conll(path: Path, sentences: list[tuple[list[str], list[str]]]) -> Path:
    blocks = ["\n".join(f"{token}\t{tag}" for token, tag in zip(t, g)) for t, g in sentences]
    path.write_text("-DOCSTART-\tO\n\n" + "\n\n".join(blocks) + "\n")
    return path


def test_token_classifier_trains_on_tagged_jsonl_and_reports_accuracy_and_f1(tmp_path: Path) -> None:
    train_file = write_jsonl(tmp_path / "train.jsonl", tagged_sentences(300, seed=0))
    valid_file = write_jsonl(tmp_path / "valid.jsonl", tagged_sentences(40, seed=1))
    config = TrainConfig.from_dict({
        "model": SMALL,
        "task": "token_classification",
        "data": {"train": str(train_file), "valid": str(valid_file)},
        "tokenizer": {"kind": "bpe", "vocab_size": 100},
        "schedule": {"kind": "linear", "lr": 3e-3, "warmup_steps": 10},
        "batch": {"max_tokens": 512},
        "max_steps": 150,
        "output_dir": str(tmp_path / "run"),
    })  # fmt: skip
    result = train(config, progress=False)
    spec = result.model.spec
    assert spec.heads.classifier.task == "token" and spec.heads.classifier.labels == ("B-LOC", "B-PER", "O")
    assert not spec.heads.pooler and spec.heads.mlm is None  # as transformers' *ForTokenClassification
    assert result.final["val_accuracy"] > 0.9 and result.final["val_f1"] > 0.85, result.final


def read(path: Path, task: str) -> list[Record]:
    """Every record of one split as ``task`` reads it."""
    return list(get_task(task).records(get_task(task).source(path)))


def test_conll_and_jsonl_files_read_the_same_sentences(tmp_path: Path) -> None:
    sentences = tagged_sentences(5, seed=3)
    task = "token_classification"
    from_json = read(write_jsonl(tmp_path / "a.jsonl", sentences), task)
    from_conll = read(write_conll(tmp_path / "a.conll", sentences), task)
    assert [r.fields["tokens"] for r in from_json] == [r.fields["tokens"] for r in from_conll]
    assert [r.fields["tags"] for r in from_json] == [r.fields["tags"] for r in from_conll]
    assert [(r.fields["tokens"], r.fields["tags"]) for r in from_conll] == sentences
    assert from_conll[0].origin == f"{tmp_path / 'a.conll'}:3"  # the first sentence's first line


def test_a_token_tag_goes_on_the_first_subword_only() -> None:
    tok = train_tokenizer(iter(["aa bb cc"] * 10), kind="wordpiece", vocab_size=40, min_frequency=1)
    encode = get_task("token_classification").encoder(Tokenizers(tok), cuts=None, labels=("X", "Y"))
    encoded = encode([Record(Path("x"), 1, {"tokens": ["aabb", "cc"], "tags": ["X", "Y"]})])
    ids, tags = encoded["text"][0], encoded["tags"][0]
    assert ids[-1] == tok.token_to_id("cc")  # raw ids: the framing comes when batches are collated
    pieces = len(ids) - 1  # the sub-words of "aabb"
    assert pieces > 1 and tags == [0, *[-100] * (pieces - 1), 1]


def test_token_f1_counts_the_labels_other_than_o() -> None:
    metric = ClassificationMetric(("B-PER", "O"), per_token=True)
    logits = torch.tensor([[2.0, 0.0], [2.0, 0.0], [0.0, 2.0], [0.0, 2.0], [0.0, 2.0]])  # PER PER O O O
    metric.update(logits, torch.tensor([0, 1, 0, 1, -100]))  # PER O PER O (ignored)
    scores = metric.compute()
    assert scores["val_accuracy"] == 0.5
    assert scores["val_f1"] == pytest.approx(2 * 1 / (2 + 2))  # 1 true PER; 2 predicted, 2 gold


# -- labels and data errors -------------------------------------------------------------------------------


def test_labels_outside_the_training_set_name_their_line(tmp_path: Path) -> None:
    (tmp_path / "train.tsv").write_text("good film\tpos\nbad film\tneg\n")
    (tmp_path / "valid.tsv").write_text("good film\tpos\nodd film\tmeh\n")
    config = sentiment_config(tmp_path, max_steps=1, model=SMALL)
    config = config.override(
        data={"train": str(tmp_path / "train.tsv"), "valid": str(tmp_path / "valid.tsv")}
    )
    with pytest.raises(
        DataError, match=r"valid\.tsv:2: label 'meh' is not one of the model's labels \('neg', 'pos'\)"
    ):
        Trainer(config, progress=False)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("a.tsv", "just text\n", r"a\.tsv:1: expected 2 tab-separated columns, found no tab"),
        ("a.jsonl", '{"text": "x"}\n', r"a\.jsonl:1: no key 'label'"),
        ("a.jsonl", '{"text": "x", "label": 0.5}\n', r"a\.jsonl:1: 'label' is a number"),
        ("a.jsonl", "[1]\n", r"a\.jsonl:1: expected a JSON object, found a list"),
    ],
)
def test_bad_classification_lines_name_file_and_line(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(DataError, match=message):
        read(tmp_path / name, "sequence_classification")


def test_mismatched_tags_name_the_line(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text('{"tokens": ["a", "b"], "tags": ["O"]}\n')
    with pytest.raises(DataError, match=r"t\.jsonl:1: 2 tokens but 1 tags"):
        read(tmp_path / "t.jsonl", "token_classification")


def test_classifier_overrides_apply_to_the_head_made_from_the_data(tmp_path: Path) -> None:
    overrides = {**SMALL["overrides"], "heads.classifier.pooling": "dense", "heads.classifier.dropout": 0.2}
    config = sentiment_config(tmp_path, max_steps=1, model={"preset": "bert-tiny", "overrides": overrides})
    trainer = Trainer(config, progress=False)
    try:
        classifier = trainer.spec.heads.classifier
        assert (classifier.pooling, classifier.dropout, classifier.num_labels) == ("dense", 0.2, 2)
    finally:
        trainer.close()


# -- fine-tuning a trained model ------------------------------------------------------------------------------


def pretrained_mlm(folder: Path, *, hf: bool) -> tuple[Path, zoo.ZooModel]:
    """A bert-tiny MLM (random weights) with its tokenizer, as a Hugging Face folder or zoo's own."""
    texts = [line.split("\t")[0] for line in (EXAMPLES / "data" / "sentiment.train.tsv").open()]
    tok = train_tokenizer(iter(texts), kind="bpe", vocab_size=200, lowercase=True)
    spec = zoo.preset("bert-tiny").override(vocab_size=tok.vocab_size, bos_token_id=1, eos_token_id=2)
    model = zoo.build(spec).eval()
    saved = zoo.to_hf(model, folder, tokenizer=tok) if hf else zoo.save(model, folder, tokenizer=tok)
    return saved, model


@pytest.fixture
def pretrained_hf(tmp_path: Path) -> tuple[Path, zoo.ZooModel]:
    return pretrained_mlm(tmp_path / "hf", hf=True)


@pytest.mark.parametrize("hf", [True, False], ids=["hugging-face-folder", "zoo-folder"])
def test_init_from_a_trained_model_starts_from_its_body_with_a_new_head(hf: bool, tmp_path: Path) -> None:
    folder, source = pretrained_mlm(tmp_path / "pretrained", hf=hf)
    config = sentiment_config(tmp_path, max_steps=2).starting_from(folder)
    trainer = Trainer(config, progress=False)
    try:
        theirs, ours = source.state_dict(), trainer.model.state_dict()
        body = [name for name in theirs if not name.startswith("mlm_head.")]
        assert all(torch.equal(ours[name], theirs[name]) for name in body)
        assert "classifier.out_proj.weight" in ours and "mlm_head.bias" not in ours
        assert trainer.tokenizers.target.vocab_size == source.spec.vocab_size
    finally:
        trainer.close()


def test_init_from_an_electra_discriminator_replaces_its_replaced_token_head(tmp_path: Path) -> None:
    texts = [line.split("\t")[0] for line in (EXAMPLES / "data" / "sentiment.train.tsv").open()]
    tok = train_tokenizer(iter(texts), kind="bpe", vocab_size=200, lowercase=True)
    spec = zoo.preset("bert-tiny").override(
        vocab_size=tok.vocab_size, bos_token_id=1, eos_token_id=2,
        **{"heads.mlm": None, "heads.replaced_token": {"activation": "gelu"}},
    )  # fmt: skip
    folder = zoo.save(zoo.build(spec).eval(), tmp_path / "discriminator", tokenizer=tok)
    trainer = Trainer(sentiment_config(tmp_path, max_steps=2).starting_from(folder), progress=False)
    try:
        names = set(trainer.model.state_dict())
        assert "classifier.out_proj.weight" in names
        assert not any(name.startswith("replaced_token_head.") for name in names)
        assert trainer.model.spec.heads.replaced_token is None
    finally:
        trainer.close()


def test_cli_fine_tunes_from_init_from_and_the_result_exports_to_transformers(
    pretrained_hf, tmp_path
) -> None:
    transformers = pytest.importorskip("transformers")
    folder, _ = pretrained_hf
    root = EXAMPLES.parent
    argv = ["train", str(EXAMPLES / "classify.yaml"), "--init-from", str(folder), "--max-steps", "3",
            "--output-dir", str(tmp_path / "run"), "--no-progress",
            "--set", f"data.train={root / 'examples/data/sentiment.train.tsv'}",
            "--set", f"data.valid={root / 'examples/data/sentiment.valid.tsv'}"]  # fmt: skip
    assert main(argv) == 0
    model = zoo.load(tmp_path / "run")
    zoo.to_hf(model, tmp_path / "out")
    hf, info = transformers.BertForSequenceClassification.from_pretrained(
        tmp_path / "out", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert hf.config.id2label == {0: "negative", 1: "positive"}
    ids = torch.tensor([[1, 10, 11, 12, 2]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, hf.eval()(input_ids=ids).logits, atol=1e-4, rtol=1e-4)


def test_init_from_a_folder_the_overrides_reshape_is_refused(pretrained_hf, tmp_path) -> None:
    folder, _ = pretrained_hf
    config = sentiment_config(tmp_path, max_steps=1).starting_from(folder)
    config = config.override(**{"model.overrides": {"ffn.d_ff": 32}})
    with pytest.raises(
        ConfigError, match=r"does not fit the model.*ffn\.up_proj\.weight \(128, 64\) in the folder"
    ):
        Trainer(config, progress=False)
