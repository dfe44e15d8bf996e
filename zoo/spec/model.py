"""The model spec: one pydantic model per family, discriminated by ``family``.

    ModelSpec = EncoderSpec | DecoderSpec | EncoderDecoderSpec

Model-level ``attention``/``ffn``/``norm``/``position`` apply to every stack unless the stack overrides
them, so a small spec stays small and a full spec can still say everything. Validation names the dotted
field and the rule, e.g. ``d_model (512) must be divisible by attention.num_heads (6)``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Strict,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from zoo.spec.blocks import (
    Activation,
    AttentionSpec,
    EmbeddingSpec,
    FeedForwardSpec,
    FFNSpec,
    InputEmbeddingSpec,
    NormSpec,
    PatchEmbeddingSpec,
    PositionSpec,
    Probability,
    RotaryPositions,
    SinusoidalPositions,
    Spec,
    _embedding_kind,
)
from zoo.spec.dual import DualEncoderHeadsSpec
from zoo.spec.errors import SpecValidationError, plain_tags
from zoo.spec.limits import check_limits
from zoo.spec.patterns import BlockSparsePattern, CausalPattern, FullPattern
from zoo.spec.stacks import ResolvedStack, StackSpec


class InitSpec(Spec):
    """Parameter initialisation. ``normal``: N(0, std) for matrices and embeddings, zero biases, unit norms."""

    scheme: Literal["normal", "xavier", "t5"] = Field(
        "normal",
        description="normal: N(0, std); xavier: Glorot-uniform matrices (the Annotated Transformer); "
        "t5: Mesh-TensorFlow's fan-in scaled normals.",
    )
    std: float = Field(0.02, gt=0, le=1.0, description="Standard deviation of the normal init, in (0, 1].")
    scaled_residual: bool = Field(
        False, description="GPT-2: projections into the residual stream get std / sqrt(2 * num_layers)."
    )


class LMHeadSpec(Spec):
    """Projection from the last hidden state to vocabulary logits."""

    tied: bool = Field(True, description="Reuse the token embedding matrix as the output projection.")
    logits_bias: bool = Field(
        False, description="A fixed final_logits_bias buffer added to logits (BART, Marian)."
    )
    rescale_tied: bool = Field(
        False, description="T5 v1.0: scale hidden states by d_model**-0.5 before a tied head."
    )
    bias: bool = Field(
        False,
        description="A learned output bias added to logits, tied or untied (CTRL's lm_head.bias); "
        "unlike logits_bias, a trained parameter.",
    )
    softcap: PositiveFloat | None = Field(
        None,
        description="Soft-cap the logits to (-softcap, softcap) as softcap * tanh(logits / softcap) (Gemma 2's "
        "final_logit_softcapping).",
    )
    scale: PositiveFloat | None = Field(
        None,
        description="Multiply the logits by this, before any soft-cap (Cohere's logit_scale); default: none.",
    )


class MLMHeadSpec(Spec):
    """BERT-style masked-LM head: dense -> activation -> norm -> tied decoder + bias."""

    activation: Activation = "gelu"
    tied: bool = True
    dense_bias: bool = Field(True, description="A bias on the dense layer (ModernBERT: classifier_bias).")
    bias: bool = Field(True, description="An output bias over the vocabulary (ModernBERT: decoder_bias).")


class HeadTransformSpec(Spec):
    """dense (C -> C) -> activation -> norm (the model's norm kind), before a classifier's dropout and
    projection: BERT's "prediction head transform", ModernBERT's ModernBertPredictionHead."""

    activation: Activation = "gelu"
    bias: bool = Field(True, description="A bias on the dense layer (ModernBERT: classifier_bias).")


class ReplacedTokenHeadSpec(Spec):
    """ELECTRA's discriminator (replaced-token detection): dense (C -> C) -> activation -> dense (C -> 1),
    one logit per token: was this token replaced by the generator?"""

    activation: Activation = Field("gelu", description="Between the two dense layers (ELECTRA: hidden_act).")


class _ClassifierBase(Spec):
    num_labels: PositiveInt = Field(description="Number of classes: the width of the logits.")
    labels: Annotated[tuple[str, ...], Strict(False)] | None = Field(  # a YAML/JSON list is a tuple here
        None,
        description="Class names, index = class id (Hugging Face's id2label); null: unnamed (LABEL_0, ...).",
    )
    dropout: Probability | None = Field(
        None, description="Dropout before the projection (classifier_dropout); null: the model's dropout."
    )
    transform: HeadTransformSpec | None = Field(
        None,
        description="dense -> activation -> norm on the pooled state (sequence) or every token (token), "
        "before dropout and the projection (ModernBERT's head); null: none.",
    )


class SequenceClassifierSpec(_ClassifierBase):
    """One label per sequence, read from the first token ([CLS] / <s>) or the mean of the real tokens.

    pooling: ``pooler`` -> dropout -> out_proj (BERT, ALBERT: the pooler is ``heads.pooler``);
    ``dense``: dropout -> dense -> activation -> dropout -> out_proj (RoBERTa's head, no pooler);
    ``first_token``: dropout -> out_proj on the first token's hidden state; ``mean``: the same on the
    mean over the real (unpadded) tokens; ``pre_classifier``: dense -> activation -> dropout -> out_proj
    over the first token (DistilBERT's pre_classifier, with ReLU). ``activation`` is the dense layer's, in
    ``dense`` and ``pre_classifier`` (tanh in RoBERTa, gelu in ELECTRA). A ``transform`` runs on the pooled
    state before the dropout (ModernBERT).
    """

    task: Literal["sequence"] = "sequence"
    pooling: Literal["pooler", "dense", "first_token", "mean", "pre_classifier"] = Field(
        "pooler",
        description="pooler: heads.pooler's output (BERT, ALBERT); dense: dropout, the head's own dense + "
        "activation, dropout over the first token (RoBERTa, ELECTRA); first_token: the first token's hidden "
        "state as it is; mean: the mean of the real tokens' hidden states (ModernBERT's classifier_pooling: "
        "mean); pre_classifier: dense + activation, then dropout (DistilBERT).",
    )
    activation: Literal["tanh", "gelu", "relu"] = Field(
        "tanh",
        description="The head's dense activation with pooling dense or pre_classifier: tanh (RoBERTa), gelu "
        "(ELECTRA), relu (DistilBERT).",
    )
    problem_type: (
        Literal["single_label_classification", "multi_label_classification", "regression"] | None
    ) = Field(
        None,
        description="The loss, as Hugging Face names it: cross-entropy, binary cross-entropy per label, or "
        "mean squared error; null: regression for 1 label, else by the labels' dtype (integers: "
        "single-label).",
    )

    @model_validator(mode="after")
    def _activation_needs_dense(self) -> SequenceClassifierSpec:
        if self.activation != "tanh" and self.pooling not in ("dense", "pre_classifier"):
            raise ValueError(
                f"activation {self.activation!r} needs pooling 'dense' or 'pre_classifier' (the head's own "
                f"dense layer), got pooling {self.pooling!r}"
            )
        return self


class ImageClassifierSpec(_ClassifierBase):
    """One label per image (ViT's ViTForImageClassification), over an image front-end (`PatchEmbeddingSpec`):

        class_token   hidden[:, 0], the class token's final state -> dropout -> out_proj   ViT
        mean          the mean over the patch tokens (the class token left out) -> dropout -> out_proj

    The norm before it is the stack's final norm (ViT's ``layernorm``), as for every encoder.
    """

    task: Literal["image"] = "image"
    pooling: Literal["class_token", "mean"] = Field(
        "class_token",
        description="class_token: the class token's final state (ViT); mean: the mean of the patch tokens' "
        "final states (no class token counted).",
    )
    problem_type: (
        Literal["single_label_classification", "multi_label_classification", "regression"] | None
    ) = Field(
        None,
        description="The loss, as Hugging Face names it (as for a sequence classifier); null: regression for "
        "1 label, else by the labels' dtype (integers: single-label).",
    )

    @model_validator(mode="after")
    def _no_transform(self) -> ImageClassifierSpec:
        if self.transform is not None:
            raise ValueError(
                "transform is for text classifiers; an image classifier projects the pooled state"
            )
        return self


class TokenClassifierSpec(_ClassifierBase):
    """One label per token: dropout -> out_proj on every position (BERT, RoBERTa, ALBERT alike)."""

    task: Literal["token"] = "token"


ClassifierSpec = Annotated[
    SequenceClassifierSpec | TokenClassifierSpec | ImageClassifierSpec, Field(discriminator="task")
]


class EncoderHeadsSpec(Spec):
    """Optional heads on an encoder: a pooler, and one output head (masked LM, a classifier, or ELECTRA's
    replaced-token detector).

    ``num_labels: N`` is accepted as shorthand for ``classifier: {task: sequence, num_labels: N}`` (reading
    the pooler when there is one, else the first token), and ``heads.num_labels`` reads the classifier's.
    """

    pooler: bool = Field(False, description="BERT pooler: tanh(dense(hidden[:, 0])).")
    mlm: MLMHeadSpec | None = None
    classifier: ClassifierSpec | None = Field(
        None,
        description="A sequence- (task: sequence), token- (task: token) or image-classification (task: image) head.",
    )
    replaced_token: ReplacedTokenHeadSpec | None = Field(
        None, description="ELECTRA's discriminator: one logit per token, 'replaced or original'."
    )

    @property
    def num_labels(self) -> int | None:
        """The classifier's number of labels (None without one)."""
        return self.classifier.num_labels if self.classifier is not None else None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        data = dict(data)
        num_labels = data.pop("num_labels", None)
        classifier = data.get("classifier")
        if isinstance(classifier, _ClassifierBase):
            classifier = classifier.model_dump()
        if num_labels is not None:
            if classifier is None:
                pooling = "pooler" if data.get("pooler") else "first_token"
                classifier = {"task": "sequence", "pooling": pooling}
            if isinstance(classifier, Mapping):
                classifier = {**classifier, "num_labels": num_labels}
        if isinstance(classifier, Mapping) and "task" not in classifier:
            classifier = {"task": "sequence", **classifier}
        if classifier is not None:
            data["classifier"] = classifier
        return data


class _ModelSpecBase(Spec):
    name: str | None = Field(None, description="A label, e.g. the preset's name. Never changes the math.")
    source: str | None = Field(None, description="Where the numbers come from: paper, reference config.")
    vocab_size: PositiveInt
    d_model: PositiveInt = 512
    num_layers: PositiveInt = 6
    max_positions: PositiveInt = Field(512, description="Longest sequence the model accepts (sizes tables).")
    attention: AttentionSpec = AttentionSpec()
    ffn: FeedForwardSpec = FFNSpec()
    norm: NormSpec = NormSpec()
    position: PositionSpec = SinusoidalPositions()
    embedding: InputEmbeddingSpec = EmbeddingSpec()
    dropout: Probability = Field(0.1, description="Dropout on embeddings and on every residual branch.")
    init: InitSpec = InitSpec()
    pad_token_id: NonNegativeInt | None = 0
    bos_token_id: NonNegativeInt | None = None
    eos_token_id: NonNegativeInt | None = None

    # -- derived views -------------------------------------------------------------------------------

    def stacks(self) -> dict[str, ResolvedStack]:
        """Every stack of this model with model-level defaults filled in, by name."""
        raise NotImplementedError

    def _resolve(self, name: str, stack: StackSpec, *, causal: bool, cross: bool) -> ResolvedStack:
        def pick(field: str) -> tuple[Any, str]:
            own = getattr(stack, field)
            return (own, f"{name}.{field}") if own is not None else (getattr(self, field), field)

        attention, attention_src = pick("attention")
        cross_attention, cross_src = (stack.cross_attention, f"{name}.cross_attention")
        if cross and cross_attention is None:
            cross_attention, cross_src = attention, attention_src
        values = {f: pick(f) for f in ("num_layers", "ffn", "norm", "position")}
        return ResolvedStack(
            name=name,
            num_layers=values["num_layers"][0],
            attention=attention,
            ffn=values["ffn"][0],
            norm=values["norm"][0],
            position=values["position"][0],
            cross_attention=cross_attention if cross else None,
            share_layers=stack.share_layers,
            causal=causal,
            pattern=stack.pattern or (CausalPattern() if causal else FullPattern()),
            layer_patterns=stack.layer_patterns,
            embedding=stack.embedding,
            sources={"attention": attention_src, "cross_attention": cross_src, "pattern": f"{name}.pattern"}
            | {f: src for f, (_, src) in values.items()},
        )

    @property
    def embedding_dim(self) -> int:
        """Width of the token embeddings and of a tied output head (factorized_dim or projection_dim, else
        d_model)."""
        return self.embedding.token_dim(self.d_model)

    def override(self, **changes: Any) -> ModelSpec:
        """A validated copy with ``changes`` deep-merged in; dotted keys reach into sub-specs. A mapping with
        another ``kind`` than the sub-spec it lands on replaces it whole (``ffn={"kind": "moe", ...}``).

        >>> zoo.preset("gpt2").override(num_layers=4, **{"attention.num_heads": 4})
        """
        data = self.model_dump()
        for key, value in changes.items():
            _set_dotted(data, key, value)
        return parse_spec(data)

    def to_json(self, **kwargs: Any) -> str:
        """The whole spec as JSON, every field explicit (what `zoo.save` writes to spec.json)."""
        return json.dumps(self.model_dump(mode="json"), **kwargs)

    # -- validation ------------------------------------------------------------------------------------

    @model_validator(mode="after")
    def _check(self) -> _ModelSpecBase:
        check_limits(self)  # first: the checks below, and any build, may then trust the sizes
        _check_embedding(self.embedding, family=getattr(self, "family", ""))
        for stack in self.stacks().values():
            self._check_stack(stack)
        for field in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
            value = getattr(self, field, None)
            if value is not None and value >= self.vocab_size:
                raise ValueError(f"{field} ({value}) must be smaller than vocab_size ({self.vocab_size})")
        return self

    def _check_stack(self, stack: ResolvedStack) -> None:
        for field in ("attention", "cross_attention"):
            spec = getattr(stack, field)
            if spec is None:
                continue
            path = stack.sources[field]
            if field == "cross_attention" and spec.latent is not None:
                raise ValueError(f"{path}.latent: latent attention is self-attention only")
            if spec.head_dim is None and self.d_model % spec.num_heads:
                raise ValueError(
                    f"d_model ({self.d_model}) must be divisible by {path}.num_heads ({spec.num_heads}); "
                    f"or set {path}.head_dim"
                )
            if spec.num_heads % spec.kv_heads:
                raise ValueError(
                    f"{path}.num_heads ({spec.num_heads}) must be divisible by {path}.num_kv_heads ({spec.kv_heads})"
                )
        position, position_path = stack.position, stack.sources["position"]
        head_dim = stack.attention.rotary_head_dim(self.d_model)
        if position.kind == "rotary" and head_dim % 2:
            raise ValueError(
                f"{position_path}: rotary positions need an even head_dim, got {head_dim} "
                f"({stack.sources['attention']}.head_dim)"
            )
        if stack.attention.latent is not None and position.kind not in ("rotary", "none"):
            raise ValueError(
                f"{stack.sources['attention']}.latent: latent attention takes rotary positions (or none), "
                f"not {position.kind!r}"
            )
        if position.kind == "rotary":
            _check_rotary(position, head_dim=head_dim, path=position_path)
            outside = sorted({i for i in position.nope_layers if i >= stack.num_layers})
            if outside or len(set(position.nope_layers)) != len(position.nope_layers):
                raise ValueError(
                    f"{position_path}.nope_layers {position.nope_layers}: each a distinct layer of {stack.name}, "
                    f"which has {stack.num_layers} (0 .. {stack.num_layers - 1})"
                )
        width = self.embedding.stack_dim(self.d_model)  # where positions are added
        if position.kind == "sinusoidal" and width % 2:
            raise ValueError(
                f"{position_path}: sinusoidal positions need an even embedding width, got {width}"
            )
        _check_patterns(stack, cross=stack.cross_attention is not None)
        if not stack.norm.first_attention_norm and stack.share_layers:
            raise ValueError(
                f"{stack.sources['norm']}.first_attention_norm: false cannot go with {stack.name}.share_layers: "
                "the shared layer would skip its attention norm everywhere"
            )
        _check_moe(stack)


def _check_moe(stack: ResolvedStack) -> None:
    """A Mixture-of-Experts FFN's per-layer choices must fit the stack they are used in."""
    ffn, path = stack.ffn, stack.sources["ffn"]
    if ffn.kind != "moe":
        return
    outside = [i for i in ffn.dense_layers if i >= stack.num_layers]
    if outside:
        raise ValueError(
            f"{path}.dense_layers {outside}: {stack.name} has {stack.num_layers} layers (0 .. {stack.num_layers - 1})"
        )
    dense = [i for i in range(stack.num_layers) if not ffn.is_sparse(i)]
    if dense and ffn.dense_d_ff is None:
        raise ValueError(
            f"{path}.dense_d_ff is needed: {stack.name} layers {dense} are dense (sparse_step "
            f"{ffn.sparse_step}, dense_layers {ffn.dense_layers})"
        )
    if dense and stack.share_layers:
        raise ValueError(
            f"{path}: {stack.name}.share_layers runs one layer everywhere, so no layer can be dense"
        )


class EncoderSpec(_ModelSpecBase):
    """Encoder-only (BERT, RoBERTa, ALBERT, MiniLM): bidirectional self-attention over a padding mask."""

    family: Literal["encoder"] = "encoder"
    encoder: StackSpec = StackSpec()
    heads: EncoderHeadsSpec = EncoderHeadsSpec()

    def stacks(self) -> dict[str, ResolvedStack]:
        if self.encoder.cross_attention is not None:
            raise ValueError("encoder.cross_attention: an encoder stack has no cross-attention")
        _no_front_end(self.encoder, "encoder", "an encoder-only model")
        return {"encoder": self._resolve("encoder", self.encoder, causal=False, cross=False)}

    @model_validator(mode="before")
    @classmethod
    def _no_vocabulary(cls, data: Any) -> Any:
        """An image front-end reads no tokens: vocab_size defaults to 1 and pad_token_id to null there."""
        if not isinstance(data, Mapping):
            return data
        embedding = data.get("embedding")
        if _embedding_kind(embedding) != "patches":
            return data
        return {"vocab_size": 1, "pad_token_id": None, **data}

    @model_validator(mode="after")
    def _check_images(self) -> EncoderSpec:
        _check_image_front_end(self)
        return self

    @model_validator(mode="after")
    def _check_heads(self) -> EncoderSpec:
        heads, classifier = self.heads, self.heads.classifier
        outputs = [
            name for name in ("mlm", "classifier", "replaced_token") if getattr(heads, name) is not None
        ]
        if len(outputs) > 1:
            raise ValueError(
                f"heads.{outputs[0]} and heads.{outputs[1]} exclude each other: a model has one output head"
            )
        if classifier is None:
            return self
        if classifier.transform is not None and getattr(classifier, "pooling", None) in ("pooler", "dense"):
            raise ValueError(
                f"heads.classifier.transform needs pooling first_token or mean (got "
                f"{getattr(classifier, 'pooling', None)!r}): the pooler and the dense head are transforms already"
            )
        if (
            isinstance(classifier, SequenceClassifierSpec)
            and classifier.pooling == "pooler"
            and not heads.pooler
        ):
            raise ValueError(
                "heads.classifier.pooling is 'pooler' but heads.pooler is false: set heads.pooler: true, "
                "or heads.classifier.pooling: dense, first_token or pre_classifier"
            )
        if (
            isinstance(classifier, SequenceClassifierSpec)
            and classifier.problem_type == "single_label_classification"
            and classifier.num_labels < 2
        ):
            raise ValueError(
                "heads.classifier.problem_type single_label_classification needs num_labels >= 2 "
                "(one output is regression)"
            )
        if classifier.labels is None:
            return self
        names = classifier.labels
        if len(names) != classifier.num_labels:
            raise ValueError(
                f"heads.classifier.labels has {len(names)} name(s) but heads.classifier.num_labels is "
                f"{classifier.num_labels}"
            )
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(
                f"heads.classifier.labels must be distinct; repeated: {', '.join(map(repr, repeated[:5]))}"
            )
        return self


class DecoderSpec(_ModelSpecBase):
    """Decoder-only (GPT-2, Llama): causal self-attention, an LM head (``lm_head: null`` for a bare body)."""

    family: Literal["decoder"] = "decoder"
    decoder: StackSpec = StackSpec()
    lm_head: LMHeadSpec | None = LMHeadSpec()

    def stacks(self) -> dict[str, ResolvedStack]:
        if self.decoder.cross_attention is not None:
            raise ValueError("decoder.cross_attention: a decoder-only model has no cross-attention")
        _no_front_end(self.decoder, "decoder", "a decoder-only model")
        return {"decoder": self._resolve("decoder", self.decoder, causal=True, cross=False)}

    @model_validator(mode="after")
    def _check_head(self) -> DecoderSpec:
        _check_lm_head(self.lm_head)
        return self


class EncoderDecoderSpec(_ModelSpecBase):
    """Encoder-decoder (the 2017 Transformer, T5, BART, Marian): the decoder cross-attends to the encoder."""

    family: Literal["encoder-decoder"] = "encoder-decoder"
    encoder: StackSpec = StackSpec()
    decoder: StackSpec = StackSpec()
    lm_head: LMHeadSpec = LMHeadSpec()
    source_vocab_size: PositiveInt | None = Field(
        None,
        description="A separate source vocabulary (own encoder embedding); default: shared with the target.",
    )
    decoder_start_token_id: NonNegativeInt | None = Field(
        None, description="First decoder input in generation; default: bos_token_id, else pad_token_id."
    )

    def stacks(self) -> dict[str, ResolvedStack]:
        if self.encoder.cross_attention is not None:
            raise ValueError("encoder.cross_attention: only the decoder stack cross-attends")
        _no_front_end(self.decoder, "decoder", "the decoder, which generates tokens")
        if self.encoder.embedding is not None and self.source_vocab_size is not None:
            raise ValueError(
                f"source_vocab_size ({self.source_vocab_size}) cannot go with encoder.embedding (kind "
                f"{self.encoder.embedding.kind!r}): the encoder reads no tokens"
            )
        return {
            "encoder": self._resolve("encoder", self.encoder, causal=False, cross=False),
            "decoder": self._resolve("decoder", self.decoder, causal=True, cross=True),
        }

    @property
    def start_token_id(self) -> int:
        """The decoder start token generation begins from."""
        for candidate in (self.decoder_start_token_id, self.bos_token_id, self.pad_token_id):
            if candidate is not None:
                return candidate
        return 0

    @model_validator(mode="after")
    def _check_head(self) -> EncoderDecoderSpec:
        _check_lm_head(self.lm_head)
        return self


class DualEncoderSpec(_ModelSpecBase):
    """An image tower and a text tower scored against each other (CLIP, SigLIP; `zoo.spec.dual`).

    The model-level fields describe the text tower (its vocabulary, width, blocks; ``text`` its stack,
    ``text.pattern: {kind: causal}`` for CLIP's causal text encoder); ``vision`` is a whole image encoder
    spec (``embedding: {kind: patches}``, no heads of its own); ``heads`` pool, project and score them.
    """

    family: Literal["dual-encoder"] = "dual-encoder"
    text: StackSpec = StackSpec()
    vision: EncoderSpec
    heads: DualEncoderHeadsSpec = DualEncoderHeadsSpec()

    def stacks(self) -> dict[str, ResolvedStack]:
        if self.text.cross_attention is not None:
            raise ValueError("text.cross_attention: a dual encoder's towers do not cross-attend")
        causal = self.text.pattern is not None and self.text.pattern.kind == "causal"
        return {"text": self._resolve("text", self.text, causal=causal, cross=False)}

    @property
    def text_dim(self) -> int:
        """Width of the pooled text vector before any projection (SigLIP's text head, else d_model)."""
        return self.heads.text_head_dim or self.d_model

    @property
    def embed_dim(self) -> int:
        """Width of ``image_embeds`` and ``text_embeds``: the projection's, else the towers' own."""
        return self.heads.projection.dim if self.heads.projection is not None else self.vision.d_model

    @model_validator(mode="after")
    def _check_towers(self) -> DualEncoderSpec:
        heads, vision = self.heads, self.vision.heads
        if not isinstance(self.vision.embedding, PatchEmbeddingSpec):
            raise ValueError(
                "vision.embedding.kind must be 'patches': the image tower reads pixel_values (an image front-end)"
            )
        if vision.pooler or vision.mlm or vision.classifier or vision.replaced_token:
            raise ValueError(
                "vision.heads: the image tower of a dual encoder has no heads of its own (see heads)"
            )
        if heads.projection is None and self.text_dim != self.vision.d_model:
            raise ValueError(
                f"heads.projection is null, so the pooled text width ({self.text_dim}: heads.text_head_dim or "
                f"d_model) must equal vision.d_model ({self.vision.d_model})"
            )
        pooling = heads.image_pooling
        if pooling.kind == "attention" and self.vision.d_model % (
            pooling.num_heads or self.vision.attention.num_heads
        ):
            raise ValueError(
                f"vision.d_model ({self.vision.d_model}) must be divisible by heads.image_pooling.num_heads "
                f"({pooling.num_heads or self.vision.attention.num_heads})"
            )
        if heads.text_pooling.kind == "eos_token" and self.eos_token_id is None:
            raise ValueError("heads.text_pooling 'eos_token' needs eos_token_id")
        if heads.loss == "sigmoid" and heads.logit_bias_init is None:
            raise ValueError("heads.loss 'sigmoid' needs heads.logit_bias_init (SigLIP's learned bias)")
        return self


def _check_image_front_end(spec: EncoderSpec) -> None:
    """An image front-end (`PatchEmbeddingSpec`) and the heads and token fields that go with it, or not."""
    embedding, heads, classifier = spec.embedding, spec.heads, spec.heads.classifier
    if not isinstance(embedding, PatchEmbeddingSpec):
        if isinstance(classifier, ImageClassifierSpec):
            raise ValueError(
                "heads.classifier.task 'image' needs an image front-end (embedding.kind: patches); this model "
                "reads tokens (task: sequence classifies a token sequence)"
            )
        return
    if spec.vocab_size != 1 or spec.pad_token_id is not None:
        raise ValueError(
            f"vocab_size ({spec.vocab_size}) and pad_token_id ({spec.pad_token_id}) are for token embeddings; an "
            "image front-end (embedding.kind: patches) has no vocabulary: leave them out"
        )
    for name in ("mlm", "replaced_token"):
        if getattr(heads, name) is not None:
            raise ValueError(
                f"heads.{name} scores tokens; an image front-end (embedding.kind: patches) has none"
            )
    if classifier is not None and not isinstance(classifier, ImageClassifierSpec):
        raise ValueError(
            f"heads.classifier.task {classifier.task!r} reads token sequences; with an image front-end "
            "(embedding.kind: patches) use task: image"
        )
    pooling = getattr(classifier, "pooling", None)
    if isinstance(classifier, ImageClassifierSpec) and pooling == "class_token" and not embedding.class_token:
        raise ValueError(
            "heads.classifier.pooling 'class_token' needs embedding.class_token: true; or use pooling: mean"
        )
    if heads.pooler and not embedding.class_token:
        raise ValueError("heads.pooler reads the class token; embedding.class_token is false")


def _no_front_end(stack: StackSpec, name: str, what: str) -> None:
    """A front-end (``<stack>.embedding``) is for the encoder of an encoder-decoder only, for now."""
    if stack.embedding is not None:
        raise ValueError(
            f"{name}.embedding (kind {stack.embedding.kind!r}) is not for {what}: only the encoder of an "
            "encoder-decoder takes a front-end"
        )


def _check_embedding(embedding: InputEmbeddingSpec, *, family: str) -> None:
    if isinstance(embedding, PatchEmbeddingSpec) and family != "encoder":
        raise ValueError(
            f"embedding.kind 'patches' (an image front-end) is for encoder models (ViT), not a {family} model"
        )
    if embedding.projection_dim is None:
        return
    if embedding.factorized_dim is not None:
        raise ValueError(
            f"embedding.factorized_dim ({embedding.factorized_dim}) and embedding.projection_dim "
            f"({embedding.projection_dim}) exclude each other: ALBERT's factorization projects after positions "
            "and the embedding norm, OPT's projection right after the token lookup"
        )
    if family != "decoder":
        raise ValueError(
            f"embedding.projection_dim ({embedding.projection_dim}) is for decoder-only models "
            f"(OPT's word_embed_proj_dim), not a {family} model"
        )


def _check_patterns(stack: ResolvedStack, *, cross: bool) -> None:
    """Each pattern must fit its stack: causal ones in causal stacks, bidirectional ones elsewhere."""
    if stack.layer_patterns is not None and len(stack.layer_patterns) != stack.num_layers:
        raise ValueError(
            f"{stack.name}.layer_patterns needs one pattern per layer, {stack.num_layers} "
            f"({stack.sources['num_layers']}), got {len(stack.layer_patterns)}"
        )
    checked = (
        [(stack.pattern, stack.pattern_path())]
        if stack.layer_patterns is None
        else [(p, stack.pattern_path(i)) for i, p in enumerate(stack.layer_patterns)]
    )
    for pattern, path in checked:
        kind = pattern.kind
        if stack.causal and kind in ("full", "block_sparse"):
            raise ValueError(
                f"{path}: {kind} attention lets a position see the tokens after it, which a causal stack "
                f"({stack.name}) must not; use causal, sliding_window, chunked or prefix_lm"
            )
        if not stack.causal and kind in ("causal", "prefix_lm", "chunked"):
            raise ValueError(
                f"{path}: {kind} is a pattern for decoder stacks; a bidirectional stack ({stack.name}) takes "
                "full, sliding_window or block_sparse"
            )
        if kind == "prefix_lm" and cross:
            raise ValueError(
                f"{path}: prefix_lm needs prefix lengths at forward time, which only a decoder-only model "
                "takes; an encoder-decoder's source is already its bidirectional prefix"
            )
        if isinstance(pattern, BlockSparsePattern) and pattern.window_blocks % 2 == 0:
            raise ValueError(
                f"{path}.window_blocks ({pattern.window_blocks}) must be odd: the query's own block and "
                "as many blocks on each side"
            )


def _check_rotary(position: RotaryPositions, *, head_dim: int, path: str) -> None:
    """Partial rotary needs an even, non-empty number of dims; LongRoPE one factor per frequency."""
    dims = position.rotary_dims(head_dim)
    if dims < 2 or dims % 2:
        raise ValueError(
            f"{path}.fraction ({position.fraction}) rotates int({head_dim} * {position.fraction}) = {dims} "
            "dims of each head; rotary pairs need an even number, at least 2"
        )
    scaling = position.scaling
    if scaling is not None and scaling.type == "longrope" and len(scaling.short_factor) != dims // 2:
        raise ValueError(
            f"{path}.scaling: longrope needs one factor per rotary frequency ({dims // 2} = rotary dims / 2), "
            f"got {len(scaling.short_factor)}"
        )
    if scaling is not None and scaling.type == "dynamic" and dims < 4:
        raise ValueError(
            f"{path}.scaling: dynamic NTK raises its base to the power R / (R - 2), R = {dims} rotary dims: "
            "at least 4 are needed"
        )


def _check_lm_head(head: LMHeadSpec | None) -> None:
    if head is not None and head.rescale_tied and not head.tied:
        raise ValueError("lm_head.rescale_tied needs lm_head.tied: the rescale belongs to a tied output")


ModelSpec = Annotated[
    EncoderSpec | DecoderSpec | EncoderDecoderSpec | DualEncoderSpec, Field(discriminator="family")
]
_ADAPTER: TypeAdapter[ModelSpec] = TypeAdapter(ModelSpec, config=ConfigDict(title="ModelSpec"))
# Where a spec holds union tags (see `plain_tags`).
_TAGS = [("family",)] + [(*stack, "position", "kind") for stack in ((), ("encoder",), ("decoder",))]
_TAGS.append(("heads", "classifier", "task"))
_TAGS += [(stack, "pattern", "kind") for stack in ("encoder", "decoder", "text")]
_TAGS += [("vision", "family"), ("text", "position", "kind"), ("heads", "image_pooling", "kind")]
_TAGS += [("heads", "text_pooling", "kind")]
_TAGS += [(*stack, "position", "scaling", "type") for stack in ((), ("encoder",), ("decoder",))]
_TAGS += [(*stack, "ffn", "kind") for stack in ((), ("encoder",), ("decoder",))]
_TAGS += [(stack, "embedding", "kind") for stack in ("encoder", "decoder")]


def parse_spec(data: Mapping[str, Any] | ModelSpec) -> ModelSpec:
    """Validate a mapping (e.g. parsed YAML) into the right family's spec.

    Raises `zoo.spec.errors.SpecValidationError`: a pydantic ValidationError (and a `SpecError`) whose
    text lists ``dotted.field: problem`` lines, without pydantic's input reprs and links.
    """
    if isinstance(data, _ModelSpecBase):
        return data
    try:
        return _ADAPTER.validate_python(_plain_layer_pattern_tags(plain_tags(data, _TAGS)))
    except ValidationError as error:
        raise SpecValidationError.from_error(error) from None


def _plain_layer_pattern_tags(data: Any) -> Any:
    """`plain_tags` for the tags inside ``<stack>.layer_patterns`` lists (which `plain_tags` cannot reach)."""
    if not isinstance(data, Mapping):
        return data
    for name in ("encoder", "decoder"):
        stack = data.get(name)
        if isinstance(stack, Mapping) and isinstance(stack.get("layer_patterns"), list):
            items = [plain_tags(item, [("kind",)]) for item in stack["layer_patterns"]]
            data = {**data, name: {**stack, "layer_patterns": items}}
    return data


def json_schema() -> dict[str, Any]:
    """The JSON Schema of `ModelSpec`, for editors and `zoo schema`."""
    return {"title": "ModelSpec", **_ADAPTER.json_schema()}


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    node = data
    for part in parents:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ValueError(f"cannot override {key!r}: {part!r} is not a sub-spec")
        node = child
    current = node.get(leaf)
    # A mapping naming another union member (``ffn: {kind: moe, ...}`` over a dense FFN) replaces the
    # sub-spec whole: the other member's fields would not fit it.
    if (
        isinstance(value, Mapping)
        and isinstance(current, dict)
        and value.get("kind", current.get("kind")) != current.get("kind")
    ):
        node[leaf] = dict(value)
    elif isinstance(value, Mapping) and isinstance(current, dict):
        merged = dict(node[leaf])
        for sub_key, sub_value in value.items():
            _set_dotted(merged, sub_key, sub_value)
        node[leaf] = merged
    else:
        node[leaf] = dict(value) if isinstance(value, Mapping) else value
