"""Text generation: a preallocated KV cache, greedy search, sampling, beam search and streaming.

ids = model.generate(prompt, max_new_tokens=20)                     # greedy
ids = model.generate(prompt, do_sample=True, top_p=0.9, seed=0)     # nucleus sampling, reproducible
ids = model.generate(source, num_beams=4, length_penalty=1.0)        # beam search
ids = model.generate(source, num_beams=4, num_return_sequences=4)    # the 4 best per source (4B, L)
ids = model.generate(source, decoder_input_ids=prefix)               # continue a decoder prefix
ids = generate(model, prompt, config=GenerationConfig(num_beams=4), max_new_tokens=20)  # config + overrides
for tokens in zoo.generation.stream(model, prompt): ...            # (B,) new tokens per step
for pieces in zoo.generation.stream_text(model, tokenizer, prompt): ...  # B strings of new text per step
for piece in ChatSession(model, tokenizer, system="...").reply("Hi"): ...  # a chat, through the template

Models take part through `GenerativeModel` (zoo.generation.protocol): ``prepare_generation`` once per run,
``next_token_logits`` once per step.
"""

from zoo.generation.cache import KVCache
from zoo.generation.chat import ChatSession
from zoo.generation.config import GenerationConfig
from zoo.generation.generate import GenerationOutput, generate, stream
from zoo.generation.protocol import GenerationState, GenerativeModel
from zoo.generation.text import TextStream, stream_text

__all__ = [
    "ChatSession",
    "GenerationConfig",
    "GenerationOutput",
    "GenerationState",
    "GenerativeModel",
    "KVCache",
    "TextStream",
    "generate",
    "stream",
    "stream_text",
]
