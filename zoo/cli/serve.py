"""``zoo serve``: an OpenAI-compatible server (continuous batching) for a zoo checkpoint or a Hugging Face folder.

    zoo serve runs/gpt/ --port 8000 --max-batch 16
    zoo serve hf/llama/ --api-key "$KEY" --model-name llama     # or ZOO_API_KEY in the environment
    zoo serve all-MiniLM-L6-v2/                                 # an embedding model: /v1/embeddings

A sentence-transformers folder (``modules.json``), or a model that cannot generate (an encoder, a decoder
without an LM head), is served as an embedding model, as ``zoo embed`` reads it (`zoo.serving.embeddings`).

Prints one line with the URL once it listens; SIGTERM / Ctrl-C lets the requests in flight finish (up to
30 s), then exits 0 (`zoo.serving.server`). Localhost only unless ``--host`` says otherwise.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from zoo.cli.options import (
    add_device_option,
    add_dtype_option,
    byte_size,
    non_negative_int,
    port,
    positive_int,
    torch_dtype,
)
from zoo.cli.search import speculative_options, speculative_settings

API_KEY_ENV = "ZOO_API_KEY"


def register(subparsers: argparse._SubParsersAction) -> None:
    serve = subparsers.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API (continuous batching)",
        description="Serve a zoo checkpoint or a Hugging Face folder (with its tokenizer.json) at "
        "/v1/models, /v1/completions and /v1/chat/completions; an embedding model (a sentence-transformers "
        "folder, or an encoder) at /v1/embeddings; /health and /metrics for both.",
    )
    serve.add_argument(
        "model", metavar="MODEL", help="a zoo checkpoint or Hugging Face folder with tokenizer.json"
    )
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this host only)"
    )
    serve.add_argument("--port", type=port, default=8000, help="port (default: 8000; 0: any free port)")
    serve.add_argument(
        "--max-batch",
        type=positive_int,
        default=None,
        help="sequences decoded together (default: 8); for an embedding model, texts per forward pass "
        "(default: 32)",
    )
    serve.add_argument(
        "--max-queue",
        type=non_negative_int,
        default=64,
        help="requests waiting for a slot before 503 (default: 64)",
    )
    serve.add_argument(
        "--max-length",
        type=positive_int,
        default=None,
        help="prompt + new tokens per sequence (default: the model's max_positions); for an embedding "
        "model, tokens kept per text (default: the folder's max_seq_length)",
    )
    serve.add_argument(
        "--api-key",
        default=None,
        help=f"require this bearer token (default: ${API_KEY_ENV} when set, else none)",
    )
    serve.add_argument(
        "--model-name", default=None, help="the model id clients name (default: the folder's name)"
    )
    serve.add_argument(
        "--max-request-bytes",
        type=positive_int,
        default=None,
        help="larger request bodies are refused (413) unread (default: 1 MiB + 64 bytes per position)",
    )
    serve.add_argument(
        "--prefix-cache-bytes",
        type=byte_size,
        default=None,
        metavar="SIZE",
        help="the most the prefix cache holds: keys/values of prompt blocks reused by later prompts that "
        "begin with them (bytes, or 512M, 1G; default: 1G; 0: off)",
    )
    serve.add_argument("--compile", action="store_true", help="torch.compile the decode step")
    drafting = serve.add_argument_group("speculative decoding (zoo.serving.speculative)")
    speculative_options(drafting)
    drafting.add_argument(
        "--draft-tokens",
        type=positive_int,
        default=4,
        metavar="K",
        help="tokens the --draft model drafts per slot and step (default: 4)",
    )
    add_device_option(serve)
    add_dtype_option(serve, default=None, help="cast the weights (default: as saved)")
    serve.set_defaults(run=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    import zoo
    from zoo.cli import console
    from zoo.cli.generate import check_finite
    from zoo.embeddings import Embedder
    from zoo.serving import Engine
    from zoo.serving.api import check_api_key, import_fastapi
    from zoo.serving.embeddings import EmbeddingEngine, generative, is_embedding_folder
    from zoo.serving.server import PortInUseError, check_port, serve

    import_fastapi()  # the missing extra is one line, before the model is read
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV)
    check_api_key(api_key, where="--api-key" if args.api_key is not None else f"${API_KEY_ENV}")
    try:
        check_port(args.host, args.port)  # and a port in use, too
    except PortInUseError as error:
        raise PortInUseError(f"{error} (choose another with --port)") from None
    engine: Engine | EmbeddingEngine
    dtype = torch_dtype(args.dtype)
    if is_embedding_folder(args.model):
        embedder = Embedder.load(args.model, device=args.device, max_length=args.max_length)
        if dtype is not None:
            embedder.model.to(dtype)
        tokenizer = embedder.tokenizer
    else:
        loaded = zoo.load_pretrained(args.model, device=args.device, dtype=dtype)
        tokenizer, embedder = loaded.tokenizer, None
        if (
            getattr(loaded.model, "check_source", None) is not None
        ):  # its source is not text (Whisper's audio)
            raise ValueError(
                f"{args.model}: an audio model (it reads input_features); zoo serve has no "
                "/v1/audio/transcriptions yet: use zoo transcribe MODEL audio.wav"
            )
        if not generative(loaded.model):
            embedder = Embedder.load(loaded.model, tokenizer=loaded.tokenizer, max_length=args.max_length)
    if embedder is not None:
        check_finite(embedder.model, where=args.model)
        if args.compile:
            raise ValueError(
                "--compile compiles the decode step of a generative model; this is an embedding model"
            )
        if args.prefix_cache_bytes is not None:
            raise ValueError(
                "--prefix-cache-bytes keeps a generative model's prompt keys/values; this is an embedding model"
            )
        if args.draft is not None or args.prompt_lookup is not None:
            raise ValueError(
                "--draft / --prompt-lookup decode a generative model; this is an embedding model"
            )
        engine = EmbeddingEngine(embedder, batch_size=args.max_batch or 32, max_queue=args.max_queue)
    else:
        check_finite(loaded.model, where=args.model)
        engine = Engine(
            loaded.model,
            tokenizer,
            max_batch=args.max_batch or 8,
            max_queue=args.max_queue,
            max_length=args.max_length,
            compile=args.compile,
            speculative=_speculation(args, loaded.model),
            **({} if args.prefix_cache_bytes is None else {"prefix_cache_bytes": args.prefix_cache_bytes}),
        )
    name = args.model_name or Path(args.model).resolve().name

    def ready(url: str) -> None:
        console.print(f"zoo serve: {name} at {url}", highlight=False, soft_wrap=True)

    serve(
        engine,
        tokenizer,
        model_name=name,
        host=args.host,
        port=args.port,
        api_key=api_key,
        on_ready=ready,
        max_request_bytes=args.max_request_bytes,
    )
    return 0


def _speculation(args: argparse.Namespace, model: Any) -> Any:
    """The engine's `Speculation` for --draft DIR (--draft-tokens K) or --prompt-lookup N; None without."""
    from zoo.serving import Speculation

    if args.draft is not None and args.prompt_lookup is not None:
        raise ValueError("zoo serve: give --draft or --prompt-lookup, not both")
    if args.prompt_lookup is not None:
        if args.prompt_lookup < 1:
            raise ValueError(f"zoo serve: --prompt-lookup must be >= 1, got {args.prompt_lookup}")
        return Speculation(lookup=True, tokens=args.prompt_lookup)
    if args.draft is None:
        return None
    return Speculation(draft=speculative_settings(args, model)["assistant_model"], tokens=args.draft_tokens)
