"""Shared building blocks. Each is built from its own sub-spec and knows nothing of the model family."""

from zoo.blocks.attention import Attention, KVSlot
from zoo.blocks.audio import AudioEmbedding
from zoo.blocks.embedding import TokenEmbedding
from zoo.blocks.ffn import ACTIVATIONS, FeedForward
from zoo.blocks.mla import LatentAttention, build_attention
from zoo.blocks.moe import MoEFeedForward, RouterOutput, build_ffn, layer_ffn
from zoo.blocks.norm import RMSNorm, build_norm
from zoo.blocks.patches import PatchEmbedding
from zoo.blocks.position import build_positions, sinusoidal_table

__all__ = [
    "ACTIVATIONS",
    "Attention",
    "AudioEmbedding",
    "FeedForward",
    "KVSlot",
    "LatentAttention",
    "MoEFeedForward",
    "PatchEmbedding",
    "RMSNorm",
    "RouterOutput",
    "TokenEmbedding",
    "build_attention",
    "build_ffn",
    "build_norm",
    "build_positions",
    "layer_ffn",
    "sinusoidal_table",
]
