"""Helpers for the quantisation tests."""

from __future__ import annotations

import torch

import zoo


def lively(model: zoo.ZooModel) -> zoo.ZooModel:
    """Weights of a trained model's scale (N(0, 0.05)), so that logits differ from token to token."""
    with torch.no_grad():
        for tensor in model.state_dict().values():
            if tensor.is_floating_point():
                tensor.normal_(0.0, 0.05)
    return model
