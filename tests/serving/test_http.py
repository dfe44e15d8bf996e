"""The OpenAI-compatible server, through the real `openai` client against a server on a free localhost port:
every greedy answer equals `zoo.generation.stream_text` of its prompt alone (the same tokens as
`model.generate`, detokenised incrementally)."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import openai
import pytest
import requests
import torch

import zoo
from tests.serving.conftest import MODEL_NAME
from zoo.generation import stream_text
from zoo.serving import Engine
from zoo.serving.server import Server

ROOT = Path(__file__).resolve().parents[2]


def _client(server: Server, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key=key, max_retries=0, timeout=60)


def _expected(pretrained: zoo.Pretrained, prompt: str, new: int) -> str:
    tok = pretrained.tokenizer
    ids = torch.tensor([tok.encode(prompt, add_bos=True, add_eos=False)])
    return "".join(p[0] for p in stream_text(pretrained.model, tok, ids, max_new_tokens=new))


def test_models_lists_the_served_model(server: Server) -> None:
    assert [m.id for m in _client(server).models.list().data] == [MODEL_NAME]


def test_a_greedy_completion_and_its_usage(server: Server, pretrained: zoo.Pretrained) -> None:
    out = _client(server).completions.create(
        model=MODEL_NAME, prompt="the cat sat", max_tokens=12, temperature=0
    )
    [choice] = out.choices
    assert choice.text == _expected(pretrained, "the cat sat", 12) and choice.finish_reason == "length"
    prompt_tokens = len(pretrained.tokenizer.encode("the cat sat", add_bos=True, add_eos=False))
    assert out.usage is not None and (out.usage.prompt_tokens, out.usage.completion_tokens) == (
        prompt_tokens,
        12,
    )
    assert out.usage.total_tokens == prompt_tokens + 12


def test_streaming_sends_the_same_text_in_chunks_then_usage(server: Server) -> None:
    client = _client(server)
    whole = client.completions.create(model=MODEL_NAME, prompt="the dog", max_tokens=10, temperature=0)
    chunks = list(
        client.completions.create(
            model=MODEL_NAME,
            prompt="the dog",
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text and len([c for c in chunks if c.choices]) > 2
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_chat_renders_the_messages_and_streams(server: Server, pretrained: zoo.Pretrained) -> None:
    client = _client(server)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the cat"}]
    out = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=8, temperature=0)  # type: ignore[arg-type]
    tok = pretrained.tokenizer  # no template of its own: zoo's default one ("role: content</s>" turns)
    prompt = torch.tensor([tok.apply_chat_template(messages, add_generation_prompt=True)])
    ids = pretrained.model.generate(prompt, max_new_tokens=8)[0, prompt.shape[1] :].tolist()
    assert tok.eos_id is not None  # the default template ends a turn with it: the answer stops there
    answer = ids[: ids.index(tok.eos_id)] if tok.eos_id in ids else ids
    # A message of its own, decoded alone as transformers decodes new tokens: no space before its first word
    # (the prompt's "assistant:" is not the beginning of its text), the answer `zoo chat` prints
    content = out.choices[0].message.content
    assert content == tok.decode(answer) and not content.startswith(" ")
    assert out.choices[0].finish_reason == ("stop" if tok.eos_id in ids else "length")
    assert out.choices[0].message.role == "assistant" and out.object == "chat.completion"
    streamed = client.chat.completions.create(
        model=MODEL_NAME,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=8,
        temperature=0,
        stream=True,
    )
    deltas = [c.choices[0].delta for c in streamed]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == out.choices[0].message.content


def test_n_stop_and_seed(server: Server, pretrained: zoo.Pretrained) -> None:
    client = _client(server)
    greedy = client.completions.create(model=MODEL_NAME, prompt="the mat", max_tokens=10, temperature=0, n=2)
    assert [c.index for c in greedy.choices] == [0, 1] and greedy.choices[0].text == greedy.choices[1].text
    assert greedy.usage is not None and greedy.usage.completion_tokens == 20
    full = greedy.choices[0].text
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    cut = client.completions.create(
        model=MODEL_NAME, prompt="the mat", max_tokens=10, temperature=0, stop=stop
    )
    assert cut.choices[0].finish_reason == "stop" and cut.choices[0].text == full[: full.index(stop)]
    sampled = [
        client.completions.create(
            model=MODEL_NAME, prompt="the mat", max_tokens=10, temperature=1.0, seed=s, n=2
        )
        for s in (3, 3, 4)
    ]
    texts = [[c.text for c in out.choices] for out in sampled]
    assert texts[0] == texts[1] and texts[0] != texts[2] and texts[0][0] != texts[0][1]


def _error(call: object) -> tuple[int, dict]:
    with pytest.raises(openai.APIStatusError) as caught:
        call()  # type: ignore[operator]
    return caught.value.status_code, caught.value.body  # type: ignore[return-value]


def test_errors_are_openai_shaped_with_the_parameter_named(server: Server) -> None:
    client = _client(server)
    status, body = _error(lambda: client.completions.create(model=MODEL_NAME, prompt="x", top_p=1.5))
    assert status == 400 and body["param"] == "top_p" and "top_p" in body["message"]
    assert body["type"] == "invalid_request_error" and set(body) == {"message", "type", "param", "code"}
    status, body = _error(lambda: client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=0))
    assert status == 400 and body["param"] == "max_tokens"
    status, body = _error(
        lambda: client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "bot", "content": "x"}])  # type: ignore[list-item]
    )
    assert status == 400 and body["param"] == "messages[0].role"
    status, body = _error(lambda: client.completions.create(model=MODEL_NAME, prompt="the cat " * 100))
    assert status == 413 and body["code"] == "context_length_exceeded" and "at most 95" in body["message"]
    status, body = _error(lambda: client.completions.create(model="other", prompt="x"))
    assert status == 404 and body["param"] == "model"


@pytest.mark.parametrize(
    ("field", "param"),
    [
        ({"stream": 1}, "stream"),  # 1 == True in Python: it was read as true
        ({"stream": "true"}, "stream"),
        ({"stream": True, "stream_options": {"include_usage": 1}}, "include_usage"),
        ({"echo": 0}, "echo"),
        ({"suffix": " the end"}, "suffix"),  # was ignored
        ({"n": 100}, "n"),  # more than the 8 running and 64 waiting the server holds: never a 503 "busy"
    ],
)
def test_fields_zoo_cannot_act_on_as_given_are_400s_naming_them(
    server: Server, field: dict, param: str
) -> None:
    body = {"model": MODEL_NAME, "prompt": "the cat", "max_tokens": 2, "temperature": 0} | field
    response = requests.post(server.url + "/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert server.engine._in_flight == 0  # nothing was queued


def test_a_deeply_nested_body_and_a_lone_surrogate_are_400s_naming_the_field(server: Server) -> None:
    url, headers = server.url, {"Content-Type": "application/json"}
    deep = '{"prompt": "x", "user": ' + "[" * 5000 + "]" * 5000 + "}"
    response = requests.post(url + "/completions", data=deep, headers=headers, timeout=30)
    assert response.status_code == 400 and "nested too deeply" in response.json()["error"]["message"]
    for path, body, param in [
        ("/completions", '{"prompt": "the \\ud800 cat", "max_tokens": 2}', "prompt"),
        ("/completions", '{"prompt": "the cat", "max_tokens": 2, "stop": ["\\udfff"]}', "stop"),
        (
            "/chat/completions",
            '{"messages": [{"role": "user", "content": "a \\ud800"}]}',
            "messages[0].content",
        ),
    ]:
        response = requests.post(url + path, data=body, headers=headers, timeout=30)
        assert response.status_code == 400, (path, response.text)
        assert (
            response.json()["error"]["param"] == param and "surrogate" in response.json()["error"]["message"]
        )


def test_a_body_over_the_cap_is_a_413_before_it_is_read(server: Server) -> None:
    """A 10 MB prompt took 6 s of the event loop and 1.5 GB before its 413; the cap (here 1 MiB + 64 bytes
    for each of the 96 positions) refuses it by its length, and by its bytes when it comes chunked."""
    cap = (1 << 20) + 64 * 96
    body = json.dumps({"model": MODEL_NAME, "prompt": "the cat " * 1_300_000, "max_tokens": 2}).encode()
    response = requests.post(server.url + "/completions", data=body, timeout=30)
    error = response.json()["error"]
    assert response.status_code == 413 and error["code"] == "request_too_large"
    assert (
        error["message"]
        == f"the request body is {len(body):,} bytes; this server takes at most {cap:,} (--max-request-bytes)"
    )
    chunked = requests.post(
        server.url + "/completions", data=iter([body[:600_000], body[600_000:]]), timeout=30
    )
    assert chunked.status_code == 413 and f"over {cap:,}" in chunked.json()["error"]["message"]
    assert _client(server).models.list().data[0].id == MODEL_NAME  # and the server goes on


def test_a_client_that_closes_mid_body_is_one_log_line(server: Server) -> None:
    """It was Starlette's ClientDisconnect as an "Exception in ASGI application" traceback in the log."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    watched = [logging.getLogger(), logging.getLogger("uvicorn")]  # uvicorn's loggers do not propagate
    for logger in watched:
        logger.addHandler(handler)
    address = urlsplit(server.url)
    try:
        with socket.create_connection((address.hostname, address.port)) as client:
            client.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: zoo\r\nContent-Type: application/json\r\n"
                b'Content-Length: 1000\r\n\r\n{"prompt":'
            )
            threading.Event().wait(0.2)  # the server has the head and 10 bytes when the client leaves
        for _ in range(100):
            if records:
                break
            threading.Event().wait(0.05)
        threading.Event().wait(0.3)  # nothing more comes after the first line
    finally:
        for logger in watched:
            logger.removeHandler(handler)
    lines = [(r.name, r.getMessage(), r.exc_info) for r in records]
    assert len(records) == 1 and records[0].exc_info is None, lines
    message = records[0].getMessage()
    assert "\n" not in message and "closed the connection after 10 of 1,000 bytes" in message, message
    assert "POST /v1/completions" in message
    assert _client(server).models.list().data[0].id == MODEL_NAME  # and the server goes on


def test_a_wrong_or_missing_api_key_is_401(pretrained: zoo.Pretrained) -> None:
    engine = Engine(pretrained.model, pretrained.tokenizer, max_batch=1, max_length=32)
    with Server(engine, pretrained.tokenizer, model_name=MODEL_NAME, api_key="sesame") as server:
        status, body = _error(lambda: _client(server, "wrong").models.list())
        assert status == 401 and body["code"] == "invalid_api_key"
        assert requests.get(server.url + "/models", timeout=30).status_code == 401
        assert _client(server, "sesame").models.list().data[0].id == MODEL_NAME


def test_a_full_queue_is_503(pretrained: zoo.Pretrained) -> None:
    engine = Engine(pretrained.model, pretrained.tokenizer, max_batch=1, max_queue=0, max_length=400)
    with Server(engine, pretrained.tokenizer, model_name=MODEL_NAME) as server:
        client = _client(server)
        running = client.completions.create(model=MODEL_NAME, prompt="the", max_tokens=300, stream=True)
        next(iter(running))  # it holds the only slot
        status, body = _error(lambda: client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=2))
        assert status == 503 and body["code"] == "overloaded"
        running.close()


def test_32_concurrent_clients_get_their_greedy_text(server: Server, pretrained: zoo.Pretrained) -> None:
    client = _client(server)
    jobs = [(f"the cat number {i} sat" + " on the mat" * (i % 4), 3 + (i * 7) % 20) for i in range(32)]

    def ask(job: tuple[str, int]) -> str:
        prompt, new = job
        if new % 2:
            return (
                client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=new, temperature=0)
                .choices[0]
                .text
            )
        chunks = client.completions.create(
            model=MODEL_NAME, prompt=prompt, max_tokens=new, temperature=0, stream=True
        )
        return "".join(c.choices[0].text for c in chunks)

    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(ask, jobs))
    assert answers == [_expected(pretrained, prompt, new) for prompt, new in jobs]


def test_the_server_keeps_answering_after_a_client_disconnects_mid_stream(
    server: Server, pretrained: zoo.Pretrained
) -> None:
    body = {"model": MODEL_NAME, "prompt": "the cat", "max_tokens": 80, "stream": True, "temperature": 0}
    with requests.post(server.url + "/completions", json=body, stream=True, timeout=30) as response:
        lines = response.iter_lines(decode_unicode=True)
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["choices"][0]["finish_reason"] is None
    # the slot is freed at the engine's next step: nothing stays in flight
    done = threading.Event()
    for _ in range(200):
        if server.engine._in_flight == 0:
            done.set()
            break
        threading.Event().wait(0.05)
    assert done.is_set(), server.engine._in_flight
    out = _client(server).completions.create(model=MODEL_NAME, prompt="the dog", max_tokens=5, temperature=0)
    assert out.choices[0].text == _expected(pretrained, "the dog", 5)


def test_a_non_streaming_client_that_leaves_frees_its_slots(pretrained: zoo.Pretrained) -> None:
    """It kept generating its 300 tokens, holding a slot (and making new requests 503) until done."""
    engine = Engine(pretrained.model, pretrained.tokenizer, max_batch=1, max_queue=0, max_length=400)
    step, steps = engine._decode, []

    def slow_step() -> None:  # 300 steps: 15 s, far longer than noticing the client left
        steps.append(1)
        threading.Event().wait(0.05)
        step()

    engine._decode = slow_step  # type: ignore[method-assign]
    with Server(engine, pretrained.tokenizer, model_name=MODEL_NAME) as server:
        body = {"model": MODEL_NAME, "prompt": "the cat", "max_tokens": 300, "temperature": 0}
        with pytest.raises(requests.exceptions.ReadTimeout):
            requests.post(server.url + "/completions", json=body, timeout=0.5)
        for _ in range(60):  # the slot is free again well before the 300 tokens would have been done
            if engine._in_flight == 0:
                break
            threading.Event().wait(0.05)
        assert engine._in_flight == 0 and 0 < len(steps) < 150, len(steps)
        out = _client(server).completions.create(
            model=MODEL_NAME, prompt="the dog", max_tokens=3, temperature=0
        )
        assert out.choices[0].text == _expected(pretrained, "the dog", 3)


def test_zoo_serve_prints_its_url_and_exits_cleanly_on_sigterm(saved: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ZOO_API_KEY": "k"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "zoo",
            "serve",
            str(saved),
            "--port",
            "0",
            "--max-batch",
            "2",
            "--model-name",
            "t",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("zoo serve: t at http://127.0.0.1:"), line + (
            process.stderr.read() if process.stderr else ""
        )
        url = line.split(" at ")[1].strip()
        client = openai.OpenAI(base_url=url, api_key="k", max_retries=0)
        assert client.completions.create(model="t", prompt="the", max_tokens=3).usage.completion_tokens == 3  # type: ignore[union-attr]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()


def test_zoo_serve_without_the_serve_extra_is_one_line(
    saved: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from zoo.cli import main

    monkeypatch.setitem(sys.modules, "fastapi", None)  # `import fastapi` now fails, as without the extra
    assert main(["serve", str(saved)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "error: zoo serve needs FastAPI and uvicorn: pip install -e '.[serve]' in zoo's clone "
        "(or: pip install fastapi uvicorn)"
    ), err


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--api-key", ""], {}, "error: --api-key is empty: that would serve without a key"),
        ([], {"ZOO_API_KEY": ""}, "error: $ZOO_API_KEY is empty: that would serve without a key"),
        (["--api-key", "clé"], {}, "error: --api-key must be printable ASCII"),
    ],
)
def test_a_key_that_leaves_the_server_open_or_can_never_match_is_refused_at_start(
    saved: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    env: dict[str, str],
    message: str,
) -> None:
    import zoo
    from zoo.cli import main

    monkeypatch.delenv("ZOO_API_KEY", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(zoo, "load_pretrained", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main(["serve", str(saved), "--port", "0", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(message) and len(err.splitlines()) == 1, err


def test_a_port_out_of_range_is_a_usage_error(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from zoo.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(["serve", str(saved), "--port", "70000"])
    assert stopped.value.code == 2 and "invalid port 70000 (expected 0 to 65535)" in capsys.readouterr().err


def test_zoo_serve_on_a_port_in_use_is_one_line_before_the_model_loads(
    saved: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was uvicorn's ``[Errno 98]`` log line, after loading the model, and exit status 3."""
    import socket

    import zoo
    from zoo.cli import main

    def unexpected(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded")

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setattr(zoo, "load_pretrained", unexpected)
        assert main(["serve", str(saved), "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: zoo serve: port {port} on 127.0.0.1 is already in use (choose another with --port)"


@pytest.mark.parametrize(
    ("host", "message"),
    [
        ("nonexistent.invalid", "error: zoo serve: cannot listen on nonexistent.invalid:0 ("),
        ("999.1.1.1", "error: zoo serve: cannot listen on 999.1.1.1:0 ("),
        ("", "error: zoo serve: the host is empty"),
    ],
)
def test_zoo_serve_on_a_host_it_cannot_listen_on_is_one_line_before_the_model_loads(
    saved: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    host: str,
    message: str,
) -> None:
    """A host that does not resolve was uvicorn's ``[Errno -2]`` log line after loading the model, then a
    second line and exit status 2; an empty one listened on every address."""
    from zoo.cli import main

    monkeypatch.setattr(zoo, "load_pretrained", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main(["serve", str(saved), "--host", host, "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(message) and len(err.splitlines()) == 1, err


def test_a_whole_response_relays_only_the_first_text_piece_of_a_choice_to_the_event_loop() -> None:
    """Not streamed, the body is the `Done`'s: per-token wake-ups of the event loop would only compete with
    the engine's thread (the first piece still crosses: it times the first token). Streamed, every one."""
    import asyncio

    from zoo.serving.api import Relay
    from zoo.serving.requests import Delta, Done

    events = [Delta(f"t{i}", (i,), ()) for i in range(5)] + [Done("t0t1t2t3t4", (0, 1, 2, 3, 4), "length", 3)]

    async def relayed(stream: bool) -> list[type]:
        relay = Relay(object(), stream=stream)
        emit = relay.emit(0)
        worker = threading.Thread(target=lambda: [emit(event) for event in events])  # the engine's thread
        worker.start()
        await asyncio.to_thread(worker.join)
        await asyncio.sleep(0)  # the scheduled puts run
        got = []
        while not relay._events.empty():
            got.append(type(relay._events.get_nowait()[1]))
        return got

    assert asyncio.run(relayed(stream=False)) == [Delta, Done]
    assert asyncio.run(relayed(stream=True)) == [Delta] * 5 + [Done]
