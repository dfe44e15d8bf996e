"""zoo's lm-eval adapter (`ZooLM`, model "zoo") scores as lm-eval's own ``hf`` model does on the same weights.

One tiny Llama-shaped model with a trained tokenizer that puts its bos first (as Llama's does), saved as a zoo
checkpoint and exported with `zoo.to_hf`; three local tasks written here (no download): multiple choice
(acc, acc_norm), rolling perplexity over texts longer than the model's 64 positions (several windows each),
and generate_until with a stop string. Both models run through ``lm_eval.simple_evaluate``, in float32.
"""

from __future__ import annotations

import importlib
import json
import math
import random
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import processors

import zoo
from zoo.io.tokenizer import Tokenizer, train_tokenizer

lm_eval = pytest.importorskip("lm_eval")
TaskManager = pytest.importorskip("lm_eval.tasks").TaskManager

WORDS = ["the", "cat", "dog", "sat", "on", "mat", "a", "big", "small", "red", "blue", "house", "tree", "ran"]
WORDS += ["jumped", "over", "under", "green", "seven"]
TASKS = ("zoo_mc", "zoo_ppl", "zoo_gen")
MAX_POSITIONS = 64
STOP = "e"


def _sentence(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def _offline(patch: pytest.MonkeyPatch, home: Path) -> None:
    """No downloads, caches under ``home``: the environment, and the constants of libraries already imported."""
    for name, value in {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(home),
        "HF_DATASETS_CACHE": str(home / "datasets"),
    }.items():
        patch.setenv(name, value)
    for module, names in {
        "huggingface_hub.constants": ("HF_HUB_OFFLINE",),
        "datasets.config": ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"),
    }.items():
        if module in sys.modules:
            for name in names:
                patch.setattr(sys.modules[module], name, True, raising=False)
    if "datasets.config" in sys.modules:
        patch.setattr(sys.modules["datasets.config"], "HF_DATASETS_CACHE", home / "datasets", raising=False)


def _task(name: str, data: Path, cache: Path, body: str) -> str:
    return (
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        f"  cache_dir: {cache}\ntest_split: test\n{body}"
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("lm-eval")
    with pytest.MonkeyPatch.context() as patch:
        _offline(patch, root / "hf-home")
        rng = random.Random(0)
        tok = train_tokenizer(iter([_sentence(rng, 4, 30) for _ in range(300)]), kind="bpe", vocab_size=200)
        bos = tok.bos_id
        tok.hf.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
        )
        ids = {f"{name}_token_id": tok.special_ids()[name] for name in ("pad", "bos", "eos")}
        torch.manual_seed(0)
        spec = zoo.preset("llama-tiny", vocab_size=tok.vocab_size, max_positions=MAX_POSITIONS, **ids)
        model = zoo.build(spec).eval()
        zoo.save(model, root / "zoo", tokenizer=tok)
        zoo.to_hf(model, root / "hf")
        tok.save_pretrained(root / "hf")

        data, tasks, cache = root / "data", root / "tasks", root / "datasets"
        data.mkdir()
        tasks.mkdir()
        mc = [
            {
                "question": _sentence(rng, 3, 12),
                "choices": [_sentence(rng, 1, 4) for _ in range(4)],
                "answer": i % 4,
            }
            for i in range(12)
        ]
        mc.append({"question": "the cat sat on the", "choices": ["mat", "dog", "red", "tree"], "answer": 0})
        texts = [{"text": _sentence(rng, 5, 200)} for _ in range(6)]
        gen = [{"prompt": _sentence(rng, 3, 12), "target": rng.choice(WORDS)} for _ in range(8)]
        for name, rows in (("mc", mc), ("ppl", texts), ("gen", gen)):
            (data / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        (tasks / "mc.yaml").write_text(
            _task("zoo_mc", data / "mc.jsonl", cache, "output_type: multiple_choice\n")
            + 'doc_to_text: "{{question}}"\ndoc_to_target: "{{answer}}"\ndoc_to_choice: "{{choices}}"\n'
            "metric_list:\n  - metric: acc\n  - metric: acc_norm\n"
        )
        (tasks / "ppl.yaml").write_text(
            _task("zoo_ppl", data / "ppl.jsonl", cache, "output_type: loglikelihood_rolling\n")
            + 'doc_to_text: ""\ndoc_to_target: "{{text}}"\nmetric_list:\n  - metric: word_perplexity\n'
            "  - metric: byte_perplexity\n  - metric: bits_per_byte\n"
        )
        (tasks / "gen.yaml").write_text(
            _task("zoo_gen", data / "gen.jsonl", cache, "output_type: generate_until\n")
            + 'doc_to_text: "{{prompt}}"\ndoc_to_target: "{{target}}"\n'
            f"generation_kwargs:\n  until: [{STOP!r}]\n  do_sample: false\n  max_gen_toks: 10\n"
            "metric_list:\n  - metric: exact_match\n"
        )
        (root / "remote").mkdir()
        (root / "remote" / "remote.yaml").write_text(
            "task: zoo_remote\ndataset_path: someone/a_dataset_never_downloaded\ntest_split: test\n"
            'output_type: multiple_choice\ndoc_to_text: "{{q}}"\ndoc_to_target: 0\ndoc_to_choice: ["a", "b"]\n'
        )

        importlib.import_module("zoo.evaluation.lm_eval")  # registers "zoo" with lm-eval

        def run(model: Any, model_args: str | None = None, tasks_: tuple[str, ...] = TASKS, **kw: Any) -> Any:
            manager = TaskManager(include_path=str(tasks), include_defaults=False)
            return lm_eval.simple_evaluate(
                model=model,
                model_args=model_args,
                tasks=list(tasks_),
                task_manager=manager,
                device="cpu",
                bootstrap_iters=0,
                **kw,
            )

        hf = run("hf", f"pretrained={root / 'hf'},dtype=float32", batch_size=4)
        ours = run("zoo", f"pretrained={root / 'zoo'}", batch_size=4)
        yield {"root": root, "tasks": tasks, "model": model, "tok": tok, "hf": hf, "zoo": ours, "run": run}


def _metrics(results: Any, task: str) -> dict[str, float]:
    return {k: float(v) for k, v in results["results"][task].items() if "," in k and "_stderr" not in k}


def test_multiple_choice_scores_equal_the_hf_models(world: Any) -> None:
    ours, theirs = _metrics(world["zoo"], "zoo_mc"), _metrics(world["hf"], "zoo_mc")
    assert ours == theirs and set(ours) == {"acc,none", "acc_norm,none"}
    pairs = zip(world["zoo"]["samples"]["zoo_mc"], world["hf"]["samples"]["zoo_mc"], strict=True)
    for a, b in pairs:
        assert a["arguments"] == b["arguments"]
        for (ll_a, greedy_a), (ll_b, greedy_b) in zip(
            [r[0] for r in a["resps"]], [r[0] for r in b["resps"]], strict=True
        ):
            assert ll_a == pytest.approx(ll_b, abs=1e-4) and greedy_a == greedy_b


def test_rolling_perplexity_equals_the_hf_models_over_several_windows(world: Any) -> None:
    longest = max(
        len(world["tok"].encode_ids([doc["doc"]["text"]])[0]) for doc in world["zoo"]["samples"]["zoo_ppl"]
    )
    assert longest > 2 * MAX_POSITIONS  # the texts need several windows
    ours, theirs = _metrics(world["zoo"], "zoo_ppl"), _metrics(world["hf"], "zoo_ppl")
    assert set(ours) == {"word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"}
    for key, value in theirs.items():
        assert ours[key] == pytest.approx(value, rel=1e-4)


def test_generation_equals_the_hf_models_and_stops_at_until(world: Any) -> None:
    ours = [s["resps"][0][0] for s in world["zoo"]["samples"]["zoo_gen"]]
    theirs = [s["resps"][0][0] for s in world["hf"]["samples"]["zoo_gen"]]
    assert ours == theirs
    assert any(ours) and not any(STOP in text for text in ours)
    assert _metrics(world["zoo"], "zoo_gen") == _metrics(world["hf"], "zoo_gen")


def test_simple_evaluate_takes_a_zoo_lm_instance(world: Any) -> None:
    from zoo.evaluation import ZooLM

    lm = ZooLM(world["model"], tokenizer=world["tok"], batch_size=3)  # another batch size, other batches
    results = world["run"](lm, tasks_=("zoo_mc",), log_samples=True)
    assert _metrics(results, "zoo_mc") == _metrics(world["hf"], "zoo_mc")


def test_loglikelihood_is_the_models_own_log_probabilities(world: Any) -> None:
    from lm_eval.api.instance import Instance

    from zoo.evaluation import ZooLM

    lm = ZooLM(world["model"], tokenizer=world["tok"], batch_size=8)
    pairs = [
        ("the cat sat", " on"),
        ("the cat sat", " under"),
        ("the cat sat", " on the mat"),
        ("", "the dog"),
    ]
    requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    got = lm.loglikelihood(requests)
    tok, model = world["tok"], world["model"]
    for (context, continuation), (logprob, greedy) in zip(pairs, got, strict=True):
        head = [tok.bos_id] + (tok.encode_ids([context])[0] if context else [])
        whole = [tok.bos_id, *tok.encode_ids([context + continuation])[0]]
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([whole[:-1]])).logits[0].float(), -1)
        targets = torch.tensor(whole[len(head) :])
        rows = logp[len(head) - 1 :]
        assert logprob == pytest.approx(float(rows.gather(1, targets[:, None]).sum()), abs=1e-4)
        assert greedy == bool((rows.argmax(-1) == targets).all())


def test_the_bos_is_put_first_as_the_tokenizer_frames_and_no_eos_is_appended(world: Any) -> None:
    from zoo.evaluation import ZooLM

    tok = world["tok"]
    plain = Tokenizer(tok.hf.__class__.from_str(tok.hf.to_str()))
    plain.hf.post_processor = None  # a zoo-trained tokenizer as trained
    ids = tok.encode_ids(["the cat"])[0]
    assert ZooLM(world["model"], tokenizer=tok).tok_encode("the cat") == [tok.bos_id, *ids]
    # zoo's causal_lm framed every document `bos text eos`: its own tokenizer gets the bos first
    assert ZooLM(world["model"], tokenizer=plain).tok_encode("the cat") == [tok.bos_id, *ids]
    assert ZooLM(world["model"], tokenizer=plain, add_bos_token=False).tok_encode("the cat") == ids
    assert ZooLM(world["model"], tokenizer=tok, add_bos_token=False).tok_encode("the cat") == ids
    assert ZooLM(world["model"], tokenizer=tok).tok_encode("<s>the cat") == tok.encode_ids(["<s>the cat"])[0]


def test_an_export_of_a_zoo_trained_tokenizer_scores_as_zoo_does_on_the_original(world: Any) -> None:
    """A tokenizer as zoo trains it (no post-processor) saved with the model, and the model exported with it by
    `zoo.to_hf`: lm-eval's ``hf`` model on the export frames every request as zoo's adapter does on the
    original (the bos first, no eos after the context), so every score and generation is the same."""
    root, tok = world["root"], world["tok"]
    plain = Tokenizer(tok.hf.__class__.from_str(tok.hf.to_str()))
    plain.hf.post_processor = None
    zoo.save(world["model"], root / "zoo-plain", tokenizer=plain)
    zoo.to_hf(world["model"], root / "hf-plain", tokenizer=plain)
    with pytest.MonkeyPatch.context() as patch:
        _offline(patch, root / "hf-home")
        ours = world["run"]("zoo", f"pretrained={root / 'zoo-plain'}", batch_size=4)
        theirs = world["run"]("hf", f"pretrained={root / 'hf-plain'},dtype=float32", batch_size=4)
    for a, b in zip(ours["samples"]["zoo_mc"], theirs["samples"]["zoo_mc"], strict=True):
        assert [r[0][0] for r in a["resps"]] == pytest.approx([r[0][0] for r in b["resps"]], abs=1e-4)
    assert _metrics(ours, "zoo_mc") == _metrics(theirs, "zoo_mc")
    for key, value in _metrics(theirs, "zoo_ppl").items():
        assert _metrics(ours, "zoo_ppl")[key] == pytest.approx(value, rel=1e-4)
    responses = [[s["resps"][0][0] for s in run["samples"]["zoo_gen"]] for run in (ours, theirs)]
    assert responses[0] == responses[1]


def test_sampling_follows_the_gen_kwargs_and_the_torch_seed(world: Any) -> None:
    from lm_eval.api.instance import Instance

    from zoo.evaluation import EvaluationError, ZooLM

    lm = ZooLM(world["model"], tokenizer=world["tok"], batch_size=4)
    kwargs = {"until": ["."], "do_sample": True, "temperature": 1.5, "top_p": 0.9, "max_gen_toks": 6}
    requests = [Instance("generate_until", {}, (f"the {w}", kwargs), i) for i, w in enumerate(WORDS[:5])]
    torch.manual_seed(3)
    first = lm.generate_until(requests)
    torch.manual_seed(3)
    assert lm.generate_until(requests) == first
    assert len(set(first)) > 1
    # do_sample with temperature 0 is greedy search, as everywhere in zoo (it sampled at temperature 1)
    zero = [
        Instance(
            "generate_until",
            {},
            (r.args[0], {"until": ["."], "do_sample": True, "temperature": 0, "max_gen_toks": 6}),
            r.idx,
        )
        for r in requests
    ]
    greedy = [
        Instance("generate_until", {}, (r.args[0], {"until": ["."], "max_gen_toks": 6}), r.idx)
        for r in requests
    ]
    torch.manual_seed(4)
    assert lm.generate_until(zero) == lm.generate_until(greedy)
    bad = [Instance("generate_until", {}, ("the", {"until": ["."], "beams": 4}), 0)]
    with pytest.raises(EvaluationError, match="beams not understood"):
        lm.generate_until(bad)


def test_zoo_eval_runs_end_to_end_and_writes_the_json(
    world: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from zoo.cli import main

    out = tmp_path / "results.json"
    argv = [
        "eval", str(world["root"] / "zoo"), "--tasks", "zoo_mc,zoo_gen", "--include-path", str(world["tasks"]),
        "--batch-size", "4", "--device", "cpu", "--bootstrap-iters", "0", "--output", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "zoo_mc" in table and "acc_norm" in table and "exact_match" in table
    written = json.loads(out.read_text())
    for task in ("zoo_mc", "zoo_gen"):
        assert {
            k: float(v) for k, v in written["results"][task].items() if "," in k and "_stderr" not in k
        } == (_metrics(world["hf"], task))
    assert main(argv) == 2
    assert "already exists" in capsys.readouterr().err


def test_a_task_that_needs_a_download_offline_is_one_error_naming_it(world: Any) -> None:
    from zoo.evaluation import EvaluationError, evaluate

    with pytest.raises(EvaluationError, match=r"task 'zoo_remote': its data could not be loaded"):
        evaluate(
            world["model"], tokenizer=world["tok"], tasks="zoo_remote", include_path=world["root"] / "remote"
        )


@pytest.mark.slow  # reads lm-eval's index of its ~15,000 built-in task files (6 s or more)
def test_an_unknown_task_is_one_error_naming_it(world: Any) -> None:
    from zoo.evaluation import EvaluationError, evaluate

    with pytest.raises(EvaluationError, match=r"unknown task 'nope'"):
        evaluate(world["root"] / "zoo", tasks=["zoo_mc", "nope"], include_path=world["tasks"])


@pytest.mark.slow  # reads lm-eval's index of its ~15,000 built-in task files (6 s or more)
def test_a_task_file_that_is_not_yaml_is_named_with_its_error(world: Any, tmp_path: Path) -> None:
    """lm-eval skips a file it cannot parse (a log line): the task was only "unknown"."""
    from zoo.evaluation import EvaluationError, evaluate

    (tmp_path / "broken.yaml").write_text("task: my_broken\ndataset_path: json\n  bad: [indent\n")
    with pytest.raises(
        EvaluationError,
        match=r"unknown task 'my_broken'.*not valid YAML, so not read: .*broken\.yaml: line 3",
    ):
        evaluate(world["root"] / "zoo", tasks=["my_broken"], include_path=tmp_path)


def test_a_file_as_include_path_is_refused_naming_it(world: Any) -> None:
    from zoo.evaluation import EvaluationError, evaluate

    task_file = next(Path(world["tasks"]).glob("*.yaml"))
    with pytest.raises(
        EvaluationError, match=r"--include-path .*\.yaml: a file; give the folder that holds it"
    ):
        evaluate(world["root"] / "zoo", tasks=["zoo_mc"], include_path=task_file)


def test_without_lm_eval_the_error_names_the_extra(
    world: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from zoo.cli import main
    from zoo.evaluation import LmEvalMissingError, evaluate

    for name in [m for m in sys.modules if m == "lm_eval" or m.startswith("lm_eval.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # `import lm_eval` now fails as if not installed
    with pytest.raises(LmEvalMissingError, match=r"pip install -e '\.\[eval\]' in zoo's clone"):
        evaluate(world["root"] / "zoo", tasks="zoo_mc")
    assert main(["eval", str(world["root"] / "zoo"), "--tasks", "zoo_mc"]) == 2
    assert "pip install -e '.[eval]' in zoo's clone (or: pip install lm-eval)" in capsys.readouterr().err


def test_result_rows_list_every_metric_with_its_stderr() -> None:
    from zoo.evaluation import result_rows

    results = {
        "results": {
            "t": {
                "alias": "t",
                "acc,none": 0.5,
                "acc_stderr,none": 0.1,
                "ppl,none": 3.0,
                "ppl_stderr,none": "N/A",
            },
            "g": {"alias": " - g", "exact_match,strict": 1.0, "exact_match_stderr,strict": math.nan},
        }
    }
    assert result_rows(results) == [
        ("t", "acc", 0.5, 0.1),
        ("t", "ppl", 3.0, None),
        ("- g", "exact_match,strict", 1.0, None),
    ]


CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def test_with_a_chat_template_the_prompts_and_scores_equal_the_hf_models(world: Any) -> None:
    """lm-eval's --apply_chat_template, --fewshot_as_multiturn and --system_instruction: zoo renders every
    request as transformers does for HFLM, and scores and generates the same."""
    root, tok = world["root"], world["tok"]
    templated = Tokenizer(tok.hf.__class__.from_str(tok.hf.to_str()))
    templated.chat_template = CHAT_TEMPLATE
    zoo.save(world["model"], root / "zoo-chat", tokenizer=templated)
    zoo.to_hf(world["model"], root / "hf-chat")
    templated.save_pretrained(root / "hf-chat")
    chat = {"apply_chat_template": True, "fewshot_as_multiturn": True, "system_instruction": "Answer."}
    with pytest.MonkeyPatch.context() as patch:
        _offline(patch, root / "hf-home")
        tasks = ("zoo_mc", "zoo_gen")
        kw = {"num_fewshot": 1, "log_samples": True, **chat}
        hf = world["run"]("hf", f"pretrained={root / 'hf-chat'},dtype=float32", tasks, batch_size=4, **kw)
        ours = world["run"]("zoo", f"pretrained={root / 'zoo-chat'}", tasks, batch_size=4, **kw)
    prompts = [s["arguments"][0][0] for s in ours["samples"]["zoo_gen"]]
    assert all(p.startswith("<s>system: Answer.\nuser: ") and p.endswith("assistant:") for p in prompts), (
        prompts[0]
    )
    assert prompts == [s["arguments"][0][0] for s in hf["samples"]["zoo_gen"]]
    assert [s["resps"][0][0] for s in ours["samples"]["zoo_gen"]] == [
        s["resps"][0][0] for s in hf["samples"]["zoo_gen"]
    ]
    for a, b in zip(ours["samples"]["zoo_mc"], hf["samples"]["zoo_mc"], strict=True):
        assert [r[0][0] for r in a["resps"]] == pytest.approx([r[0][0] for r in b["resps"]], abs=1e-4)
    assert _metrics(ours, "zoo_mc") == _metrics(hf, "zoo_mc")
    from zoo.evaluation import ZooLM

    lm = ZooLM(world["model"], tokenizer=templated)
    assert lm.chat_template(True) == CHAT_TEMPLATE and lm.chat_template(False) is None
    plain = ZooLM(world["model"], tokenizer=tok)  # no template of its own: zoo's default one
    assert plain.chat_template(True) == tok.default_chat_template


def test_fewshot_as_multiturn_needs_the_chat_template(world: Any) -> None:
    from zoo.evaluation import EvaluationError, evaluate

    with pytest.raises(EvaluationError, match="fewshot_as_multiturn needs apply_chat_template"):
        evaluate(world["model"], ["zoo_mc"], tokenizer=world["tok"], fewshot_as_multiturn=True)


@pytest.mark.slow  # 52 HTTP requests through lm-eval's API model (about 5 s)
def test_lm_evals_local_completions_over_zoo_serve_scores_as_zoo_eval_does(world: Any) -> None:
    """lm-eval's ``local-completions`` model (``echo``, ``logprobs: 1``, ``max_tokens: 1`` on token ids)
    pointed at `zoo serve` on the zoo checkpoint: every log-likelihood and greedy flag, and acc, as `zoo
    eval`'s in-process adapter has them."""
    pytest.importorskip("fastapi")
    from zoo.serving import Engine
    from zoo.serving.server import Server

    pretrained = zoo.load_pretrained(world["root"] / "zoo")
    engine = Engine(pretrained.model, pretrained.tokenizer, max_batch=4)
    with Server(engine, pretrained.tokenizer, model_name="zoo-tiny") as server:
        args = (
            f"model=zoo-tiny,base_url={server.url}/completions,tokenizer_backend=huggingface,"
            f"tokenizer={world['root'] / 'hf'},add_bos_token=True,max_length={MAX_POSITIONS}"
        )
        served = world["run"]("local-completions", args, tasks_=("zoo_mc",), log_samples=True)
    assert _metrics(served, "zoo_mc") == _metrics(world["zoo"], "zoo_mc")
    pairs = zip(served["samples"]["zoo_mc"], world["zoo"]["samples"]["zoo_mc"], strict=True)
    for a, b in pairs:
        for (ll_a, greedy_a), (ll_b, greedy_b) in zip(
            [r[0] for r in a["resps"]], [r[0] for r in b["resps"]], strict=True
        ):
            assert ll_a == pytest.approx(ll_b, abs=1e-4) and greedy_a == greedy_b
