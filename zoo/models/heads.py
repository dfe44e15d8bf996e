"""Output heads: LM head (tied or not), BERT's MLM head, pooler, sequence/token/image classifiers and their loss."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from zoo.blocks import ACTIVATIONS, build_norm
from zoo.losses import IGNORE_INDEX
from zoo.losses.chunked import ChunkedLoss, chunked_token_losses
from zoo.spec import LMHeadSpec, MLMHeadSpec, NormSpec, ReplacedTokenHeadSpec
from zoo.spec.model import ClassifierSpec, HeadTransformSpec, ImageClassifierSpec


class TiedOutput:
    """An output matrix of its own (``weight``, V x E) or the token embedding table it is tied to.

    The tied matrix is read from its owner at call time (a plain list, so it is not registered twice):
    one tensor on disk, and still right after `.to()`, `to_empty()` or an assigning state-dict load.
    """

    weight: nn.Parameter | None
    _tied_to: list[nn.Embedding]

    def _init_output(self, *, vocab_size: int, dim: int, tied_to: nn.Embedding | None) -> None:
        """Call from ``__init__`` where ``weight`` belongs in the parameter order (it is the state-dict order)."""
        self.weight = nn.Parameter(torch.empty(vocab_size, dim)) if tied_to is None else None
        self._tied_to = [tied_to] if tied_to is not None else []

    @property
    def output_weight(self) -> torch.Tensor:
        """The (V, E) output matrix, the embedding table when tied."""
        if self._tied_to:
            return self._tied_to[0].weight
        assert self.weight is not None  # an untied head owns its matrix (`_init_output`)
        return self.weight


class LMHead(TiedOutput, nn.Module):
    """hidden (B, T, E) -> logits (B, T, V). A tied head reuses the token embedding matrix.

    E is d_model, or ``input_dim`` where the model projects its last hidden state back to a narrower
    embedding width first (OPT's project_out). T5 v1.0 scales the hidden state by d_model**-0.5 before a tied
    head (its embeddings are unscaled and large); BART and Marian add a fixed ``final_logits_bias``; CTRL
    a learned ``bias``; Cohere scales the logits (``scale``); Gemma 2 soft-caps them (``softcap * tanh(logits /
    softcap)``).
    """

    def __init__(
        self, spec: LMHeadSpec, *, d_model: int, vocab_size: int, tied_to: nn.Embedding | None,
        input_dim: int | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        self._init_output(vocab_size=vocab_size, dim=input_dim or d_model, tied_to=tied_to)
        self.bias = nn.Parameter(torch.zeros(vocab_size)) if spec.bias else None
        self.rescale = d_model**-0.5 if spec.rescale_tied else 1.0
        self.softcap = spec.softcap
        self.scale = spec.scale
        if spec.logits_bias:
            self.register_buffer("final_logits_bias", torch.zeros(1, vocab_size))
        else:
            self.final_logits_bias = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.logits(hidden, self.output_weight, self.bias)

    def logits(self, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The head's function with its matrices given: hidden (..., E), weight (V, E), bias (V,) or None
        -> logits (..., V). The chunked loss differentiates it with respect to all three."""
        if self.rescale != 1.0:
            hidden = hidden * self.rescale
        logits = F.linear(hidden, weight, bias)  # (..., V)
        if self.final_logits_bias is not None:
            logits = logits + self.final_logits_bias
        if self.scale is not None:
            logits = logits * self.scale
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def token_losses(self, hidden: torch.Tensor, loss: ChunkedLoss) -> torch.Tensor:
        """hidden (N, E) -> (N,) float32: each token's cross-entropy against ``loss.targets``, through this
        head in chunks of tokens (`zoo.losses.chunked`): the (N, V) logits never exist at once."""
        return chunked_token_losses(
            self.logits,
            hidden,
            self.output_weight,
            self.bias,
            loss.targets,
            label_smoothing=loss.label_smoothing,
            chunk_tokens=loss.chunk_tokens,
        )


class MLMHead(TiedOutput, nn.Module):
    """BERT's masked-LM head: dense -> activation -> norm -> decoder (tied to the embeddings) + bias.

    With factorized embeddings (ALBERT) the dense layer maps C -> E so the tied (V, E) decoder fits.
    """

    def __init__(
        self, spec: MLMHeadSpec, *, norm: NormSpec, d_model: int, embed_dim: int, vocab_size: int,
        tied_to: nn.Embedding | None,
    ) -> None:  # fmt: skip
        super().__init__()
        self.dense = nn.Linear(d_model, embed_dim, bias=spec.dense_bias)
        self.act = ACTIVATIONS[spec.activation]
        self.norm = build_norm(norm, dim=embed_dim)
        self._init_output(vocab_size=vocab_size, dim=embed_dim, tied_to=tied_to)
        self.bias = nn.Parameter(torch.zeros(vocab_size)) if spec.bias else None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.act(self.dense(hidden)))  # (B, T, E)
        return F.linear(h, self.output_weight, self.bias)  # (B, T, V)


class Pooler(nn.Module):
    """BERT's pooler: tanh(dense(hidden of the first token))."""

    def __init__(self, *, d_model: int) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))  # (B, C)


class ReplacedTokenHead(nn.Module):
    """ELECTRA's discriminator: hidden (B, T, C) or rows (N, C) -> dense -> activation -> dense_prediction
    -> one logit per token, (B, T) or (N,): "this token was replaced"."""

    def __init__(self, spec: ReplacedTokenHeadSpec, *, d_model: int) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.act = ACTIVATIONS[spec.activation]
        self.out_proj = nn.Linear(d_model, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.act(self.dense(hidden))).squeeze(-1)  # (B, T) or (N,)


def replaced_token_loss(
    logits: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor | None
) -> torch.Tensor:
    """ELECTRA's loss: binary cross-entropy of logits (B, T) (or (N,) selected rows) against 0/1 labels of
    the same shape, over the real tokens of the padding mask (transformers' ElectraForPreTraining) and not
    where labels are -100."""
    keep = labels != IGNORE_INDEX
    if attention_mask is not None:
        keep = keep & (attention_mask == 1)
    return F.binary_cross_entropy_with_logits(logits.float()[keep], labels[keep].float())


CLASSIFIER_ACTIVATIONS = {"tanh": nn.Tanh(), "gelu": nn.GELU(), "relu": nn.ReLU()}


class HeadTransform(nn.Module):
    """dense -> activation -> norm, (..., C) -> (..., C): ModernBERT's prediction head under a classifier."""

    def __init__(self, spec: HeadTransformSpec, *, norm: NormSpec, d_model: int) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model, bias=spec.bias)
        self.act = ACTIVATIONS[spec.activation]
        self.norm = build_norm(norm, dim=d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(x)))


class ClassificationHead(nn.Module):
    """Sequence or token classification, as transformers' ``*ForSequenceClassification`` and
    ``*ForTokenClassification`` heads compute it (``L`` = num_labels, ``act`` the spec's activation):

        sequence, pooler          pooler output (B, C) -> dropout -> out_proj             BERT, ALBERT
        sequence, dense           hidden[:, 0] -> dropout -> dense -> act -> dropout      RoBERTa (tanh),
                                    -> out_proj                                          ELECTRA (gelu)
        sequence, pre_classifier  hidden[:, 0] -> dense -> act -> dropout -> out_proj     DistilBERT (relu)
        sequence, first_token     hidden[:, 0] -> [transform] -> dropout -> out_proj      ModernBERT (cls)
        sequence, mean            mean of the real tokens -> [transform] -> dropout       ModernBERT (mean)
                                    -> out_proj
        token                     hidden (B, T, C) or the selected rows (N, C) -> [transform] -> dropout
                                    -> out_proj
    """

    def __init__(
        self, spec: ClassifierSpec, *, d_model: int, dropout: float, norm: NormSpec | None = None
    ) -> None:
        """``norm``: the model's norm, for a ``transform`` (required with one)."""
        super().__init__()
        self.per_token = spec.task == "token"
        self.pooling = getattr(spec, "pooling", None)  # sequence heads only
        self.dropout = nn.Dropout(spec.dropout if spec.dropout is not None else dropout)
        own_dense = self.pooling in ("dense", "pre_classifier")
        self.dense = nn.Linear(d_model, d_model) if own_dense else None
        self.act = CLASSIFIER_ACTIVATIONS[getattr(spec, "activation", "tanh")]
        self.transform = None
        if spec.transform is not None:
            assert norm is not None, "a classifier transform needs the model's norm"
            self.transform = HeadTransform(spec.transform, norm=norm, d_model=d_model)
        self.out_proj = nn.Linear(d_model, spec.num_labels)

    def forward(
        self, hidden: torch.Tensor, pooled: torch.Tensor | None = None, padding: torch.Tensor | None = None
    ) -> torch.Tensor:
        """hidden (B, T, C) (or (N, C) rows for a token head); pooled (B, C), the pooler's output; padding
        (B, T), 1 = token, for mean pooling (None: every position is real).
        -> logits (B, L) for a sequence head, (B, T, L) / (N, L) for a token head."""
        if self.per_token:
            x = hidden
        elif self.pooling == "pooler":
            assert pooled is not None  # the spec refuses pooling: pooler without heads.pooler
            x = pooled  # (B, C)
        elif self.pooling == "mean":
            x = mean_over_tokens(hidden, padding)  # (B, C)
        else:
            x = hidden[:, 0]  # (B, C): [CLS] / <s>
        if self.transform is not None:
            x = self.transform(x)
        if self.pooling != "pre_classifier":  # DistilBERT's head drops out only after its dense layer
            x = self.dropout(x)
        if self.dense is not None:
            x = self.dropout(self.act(self.dense(x)))
        return self.out_proj(x)


class ImageClassificationHead(nn.Module):
    """One label per image, as ViTForImageClassification (``L`` = num_labels):

    class_token   hidden[:, 0] (B, C) -> dropout -> out_proj (B, L)                      ViT
    mean          hidden[:, first patch:].mean (B, C) -> dropout -> out_proj (B, L)
    """

    def __init__(self, spec: ImageClassifierSpec, *, d_model: int, dropout: float, class_token: bool) -> None:
        super().__init__()
        self.pooling = spec.pooling
        self.first_patch = int(class_token)  # mean pooling leaves the class token out
        self.dropout = nn.Dropout(spec.dropout if spec.dropout is not None else dropout)
        self.out_proj = nn.Linear(d_model, spec.num_labels)

    def forward(
        self, hidden: torch.Tensor, pooled: torch.Tensor | None = None, padding: torch.Tensor | None = None
    ) -> torch.Tensor:
        """hidden (B, N, C), the stack's output over the class token and the patches -> logits (B, L);
        ``pooled`` and ``padding`` are not read (the interface of `ClassificationHead`)."""
        if self.pooling == "class_token":
            x = hidden[:, 0]  # (B, C)
        else:
            x = hidden[:, self.first_patch :].mean(dim=1)  # (B, C)
        return self.out_proj(self.dropout(x))


def mean_over_tokens(hidden: torch.Tensor, padding: torch.Tensor | None) -> torch.Tensor:
    """(B, T, C) -> (B, C): the mean over each row's real tokens (``padding`` (B, T), 1 = token)."""
    if padding is None:
        return hidden.mean(dim=1)
    weights = padding.to(hidden.dtype)[:, :, None]  # (B, T, 1)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1)


def resolve_problem_type(problem_type: str | None, *, num_labels: int, labels: torch.Tensor) -> str:
    """``problem_type``, or transformers' choice when it is None: regression for one label, single-label
    classification for integer labels, else multi-label (the labels' dtype is metadata: no device sync)."""
    if problem_type is not None:
        return problem_type
    if num_labels == 1:
        return "regression"
    integer = not (labels.dtype.is_floating_point or labels.dtype.is_complex)
    return "single_label_classification" if integer else "multi_label_classification"


def classification_loss(
    logits: torch.Tensor, labels: torch.Tensor, *, problem_type: str | None
) -> torch.Tensor:
    """The loss of a sequence classifier's logits (B, L), as transformers computes it.

    ``problem_type`` None is decided as transformers decides it (`resolve_problem_type`).
    single_label_classification: cross-entropy over labels (B,) (-100 ignored); multi_label_classification: binary cross-entropy with float targets (B, L); regression: mean
    squared error against float labels (B,) for one output, else (B, L).
    """
    num_labels = logits.shape[-1]
    problem_type = resolve_problem_type(problem_type, num_labels=num_labels, labels=labels)
    logits = logits.float()
    if problem_type == "single_label_classification":
        return F.cross_entropy(logits.reshape(-1, num_labels), labels.reshape(-1), ignore_index=IGNORE_INDEX)
    if problem_type == "multi_label_classification":
        return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))
    if num_labels == 1:
        return F.mse_loss(logits.squeeze(), labels.to(logits.dtype).squeeze())
    return F.mse_loss(logits, labels.to(logits.dtype))


def select_positions(hidden: torch.Tensor, logits_mask: torch.Tensor | None) -> torch.Tensor:
    """hidden (B, T, C) -> (N, C): the rows where ``logits_mask`` (B, T) is True, in row-major order.

    A head run on these rows alone skips the positions no loss reads (BERT labels ~15% of them; padding).
    The mask may live on the CPU while ``hidden`` is on a GPU: the indices are found on the CPU and no
    device sync is needed. `zoo.models.inputs.check_logits_mask` validates the mask first.
    """
    if logits_mask is None:
        return hidden
    rows = logits_mask.reshape(-1).nonzero().squeeze(1).to(hidden.device, non_blocking=True)  # (N,)
    return hidden.reshape(-1, hidden.shape[-1]).index_select(0, rows)  # (N, C)
