"""Folders for the image-text tests: a tiny random CLIP or SigLIP saved by transformers, with a small WordPiece
tokenizer (tests/embed_support.py's) and the image processor's ``preprocessor_config.json``, and images of
odd sizes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from embed_support import SPECIALS, WORDS, wordpiece, write_json

IMAGE_SIZE, PATCH = 30, 6
TEXT = dict(vocab_size=len(SPECIALS) + len(WORDS), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=16, pad_token_id=0, bos_token_id=2, eos_token_id=3)  # fmt: skip
VISION = dict(hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              image_size=IMAGE_SIZE, patch_size=PATCH)  # fmt: skip


def make_folder(folder: Path, family: str) -> tuple[Path, torch.nn.Module, object]:
    """A random ``family`` ("clip" or "siglip") model saved with its tokenizer and image processor:
    (folder, the transformers model, the transformers image processor)."""
    import transformers

    if family == "clip":
        config = transformers.CLIPConfig(text_config=TEXT, vision_config=VISION, projection_dim=24)
        model = transformers.CLIPModel(config)
        processor = transformers.CLIPImageProcessorPil(
            size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
        )
    else:
        text = {**TEXT, "projection_size": VISION["hidden_size"]}  # SigLIP scores the towers in one width
        model = transformers.SiglipModel(transformers.SiglipConfig(text_config=text, vision_config=VISION))
        processor = transformers.SiglipImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    torch.manual_seed(3)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    model.eval().save_pretrained(folder, safe_serialization=True)
    processor.save_pretrained(folder)
    wordpiece().save(str(folder / "tokenizer.json"))
    write_json(folder / "tokenizer_config.json", {"model_max_length": 16, "pad_token": "[PAD]"})
    return folder, model, processor


def images(seed: int = 0) -> list:
    """Random RGB images of odd sizes, wider and taller than the model's, and one smaller (upscaled)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    sizes = [(47, 33), (31, 64), (17, 19), (101, 57)]
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in sizes]
