"""One plain config object for every experiment.

A `Config` holds three sections, `model`, `data` and `train`, each a flat dataclass of
plain values. Every field is addressable by a dotted key (`model.decoder`,
`train.lr`), which is how the command line overrides it (`--set train.lr=0.1`), how
Optuna studies vary it, and how MLflow logs it as a param. Changing one field and
holding every other equal is the whole point of an ablation, so nothing about a run
lives outside this object.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, get_type_hints

# The swappable parts (decoders, position encodings, coverage kinds, search rules) are not
# listed here: each registers itself by name where it is defined (see hmer.registry), and
# validation reads those registries.
from .registry import COVERAGES, DECODERS, IMAGE_POSITIONS, SEARCH_RULES, TOKEN_POSITIONS

# Decoding directions, defined once (hmer.model.direction builds their targets, hmer.decoding
# their searches): l2r, r2l, or bi (one decoder trained on both, BTTR).
DIRECTIONS = ("l2r", "r2l", "bi")
ENCODER_TAILS = ("relu-norm-pos", "pos-norm")
CONV_ATTENTIONS = ("gehring", "scaled")  # ConvS2S's attention to the image (ModelConfig.conv_attention)
OPTIMIZERS = ("adadelta", "sgd", "adamw")
VAL_SPLITS = ("writer", "random")
SCHEDULES = ("plateau", "cosine")  # hmer.data.holdout holds the rules
LR_SCALINGS = ("none", "linear", "sqrt")  # TrainConfig.lr_scaling: hmer.training.optim.batch_scaled_lr
RENDER_STYLES = ("direct", "standard-like")  # hmer.data.render (RenderConfig.downscale)
VAL_ALT_STYLES = ("", *RENDER_STYLES)  # "" = no second validation
PRECISIONS = ("auto", "fp32", "bf16")
TEST_YEARS_SAY = ("comma-separated test split names, each a folder of the dataset (2014,2016,2019 for CROHME), "
                  "not train or val, none twice")
DEVICE_SAY = "auto, cpu, cuda, cuda:N or mps"


# ---- what each field allows ------------------------------------------------------------------------
# Every field is declared with `allowed(default, ...)`, which says once, beside the field, what values
# it takes; `Config.validate` (run by every build and override) checks them all, then the cross-field
# RULES below. A field declared without it fails tests/test_bad_input.py. One line per field:
#
#     epochs: int = allowed(300, ge=1)                      # numbers: ge / gt / le / lt bounds
#     dropout: float = allowed(0.3, ge=0, lt=1)
#     direction: str = allowed("bi", one_of=DIRECTIONS)     # a tuple, a Registry or a function of ()
#     compile: bool = allowed(False)                        # bools and numbers: the type is the rule
#     path: str = allowed("", text="a dataset folder...")   # free text, described
#     device: str = allowed("auto", check=fn, says="...", bad_example="gpu")  # anything else

ALLOWED = "hmer.allowed"  # the dataclass field metadata key


class ConfigError(ValueError):
    """A config value outside what its field allows: one line naming the key, the value and what is allowed."""


@dataclass(frozen=True)
class Allowed:
    """What one field takes; see `allowed`."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    one_of: Any = None  # a tuple of names, a Registry, or a function returning the names
    text: str = ""  # free text: what it is, in words
    check: Callable[[Any], bool] | None = None
    says: str = ""  # with `check`: what it accepts, in words
    bad_example: Any = None  # with `check`: a value it refuses (the tests try it)

    def choices(self) -> tuple[str, ...]:
        names = self.one_of() if callable(self.one_of) and not hasattr(self.one_of, "names") else self.one_of
        return tuple(names.names() if hasattr(names, "names") else names)

    def describe(self, typ: type) -> str:
        """What the field takes, in words: "an integer >= 1", "a number in [0, 1)", "one of a, b"."""
        if self.one_of is not None:
            return f"one of {', '.join(self.choices())}"
        if self.text:
            return f"text: {self.text}"
        if self.says:
            return self.says
        if typ is bool:
            return "true or false"
        kind = "an integer" if typ is int else "a number"
        low = f"[{self.ge:g}" if self.ge is not None else f"({self.gt:g}" if self.gt is not None else None
        high = f"{self.le:g}]" if self.le is not None else f"{self.lt:g})" if self.lt is not None else None
        if low and high:
            return f"{kind} in {low}, {high}"
        if low:
            return f"{kind} {'>=' if self.ge is not None else '>'} {low[1:]}"
        if high:
            return f"{kind} {'<=' if self.le is not None else '<'} {high[:-1]}"
        return kind

    def admits(self, value: Any, typ: type) -> bool:
        """Whether `value` (already of the field's type) is allowed."""
        if self.one_of is not None:
            return value in self.choices()
        if self.check is not None:
            return bool(self.check(value))
        if typ in (int, float):
            return (math.isfinite(value)
                    and (self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                    and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt))
        return True


def allowed(default: Any, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
            lt: float | None = None, one_of: Any = None, text: str = "", check: Callable[[Any], bool] | None = None,
            says: str = "", bad_example: Any = None) -> Any:
    """A config field with its default and what it allows (see the comment above `ALLOWED`)."""
    if check is not None and (not says or bad_example is None):
        raise TypeError("allowed(check=...) needs says= (what it accepts) and bad_example= (a value it refuses)")
    return field(default=default, metadata={ALLOWED: Allowed(ge=ge, gt=gt, le=le, lt=lt, one_of=one_of, text=text,
                                                              check=check, says=says, bad_example=bad_example)})


@dataclass(frozen=True)
class Rule:
    """A rule between fields: `holds(*values of keys)` must be true, else `says` (words, or a
    function of the values giving them) follows the keys and their values in the error."""

    keys: tuple[str, ...]
    holds: Callable[..., bool]
    says: str | Callable[..., str]

    def check(self, values: dict[str, Any]) -> None:
        args = [values[k] for k in self.keys]
        if not self.holds(*args):
            says = self.says(*args) if callable(self.says) else self.says
            named = ", ".join(f"{k}={v!r}" for k, v in zip(self.keys, args))
            raise ConfigError(f"{named}: {says}")


def _coverage_fits_decoder(coverage: str, decoder: str) -> bool:
    return not COVERAGES.get(coverage).refines or getattr(DECODERS.get(decoder), "supports_coverage", False)


def _coverage_decoders(coverage: str, decoder: str) -> str:
    able = [name for name in DECODERS.names() if getattr(DECODERS.get(name), "supports_coverage", False)]
    return (f"coverage {coverage!r} needs a decoder with CoMER's attention refinement "
            f"(model.decoder={' or '.join(map(repr, able))}; the RNN decoder has its own WAP coverage)")


# Cross-field rules, declared like the fields: the keys, what must hold, what the error says.
RULES: tuple[Rule, ...] = (
    Rule(("model.d_model", "model.nhead"), lambda d, h: d % h == 0, "model.d_model must be divisible by model.nhead"),
    Rule(("model.d_model",), lambda d: d % 4 == 0, "model.d_model must be divisible by 4 (the 2-D sinusoidal "
                                                  "encoding)"),
    Rule(("model.coverage", "model.decoder"), _coverage_fits_decoder, _coverage_decoders),
    Rule(("data.scale_aug_min", "data.scale_aug_max"), lambda lo, hi: hi == 0 or lo <= hi,
         "data.scale_aug_min must not exceed data.scale_aug_max (unless scale_aug_max=0: none)"),
    Rule(("data.scale_aug_min", "data.scale_aug_max"), lambda lo, hi: hi == 0 or lo > 0,
         "scale augmentation draws from [min, max]: give both > 0, or scale_aug_max=0 for none"),
    Rule(("data.aug_width_min", "data.aug_width_max"), lambda lo, hi: lo <= hi,
         "data.aug_width_min must not exceed data.aug_width_max"),
    Rule(("train.min_lr", "train.lr"), lambda low, lr: low <= lr,
         "train.min_lr must not exceed train.lr"),
    Rule(("train.warmup_steps", "train.warmup_epochs"), lambda steps, epochs: steps == 0 or epochs == 0,
         "give the warm-up in steps or in epochs, not both"),
)


def _recipe_names() -> tuple[str, ...]:
    from .recipes import RECIPES  # the papers' recipes: plain values, importing nothing of the suite

    return (*RECIPES, "custom")


def _test_years(text: str) -> bool:
    years = [y.strip() for y in text.split(",") if y.strip()]
    return (all(re.fullmatch(r"[\w.-]+", y) and y not in ("train", "val") for y in years)
            and len(set(years)) == len(years))


def _device_name(name: str) -> bool:
    return re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", name) is not None


@dataclass
class ModelConfig:
    """Architecture. Defaults are the BTTR paper's sizes (bidirectional transformer) with the
    project's own choices where it departs from the reference code (`mask_padding`, the `sin2d`
    image positions, no token-embedding norm): run records written before a field existed reload
    with its default, so a default never changes. The `bttr` and `comer-*` presets pin the
    references' functions (see hmer.model.factory)."""

    vocab_size: int = allowed(113, ge=4)  # 110 CROHME symbols + pad, sos, eos
    d_model: int = allowed(256, ge=4)
    # Encoder: DenseNet-B as in DenseWAP / BTTR.
    growth_rate: int = allowed(24, ge=1)
    num_dense_layers: int = allowed(16, ge=1)  # layers per dense block
    num_dense_blocks: int = allowed(3, ge=1)
    compression: float = allowed(0.5, gt=0, le=1)
    bottleneck: bool = allowed(True)
    encoder_dropout: float = allowed(0.2, ge=0, lt=1)
    # Padded pixels zeroed before every 3x3 conv and pool, so a batched image gets the features it
    # has alone (batch invariance). BTTR and CoMER do not mask (False): padding leaks into the
    # features near the bottom/right border of the smaller images of a batch.
    mask_padding: bool = allowed(True)
    # After the DenseNet: 1x1 conv, then `relu-norm-pos` (ReLU, LayerNorm, + image positions;
    # BTTR) or `pos-norm` (+ image positions, LayerNorm; CoMER).
    encoder_tail: str = allowed("relu-norm-pos", one_of=ENCODER_TAILS)
    # Positional encodings.
    # A name in hmer.registry.TOKEN_POSITIONS / IMAGE_POSITIONS (`hmer models` lists them).
    token_pos: str = allowed("sin1d", one_of=TOKEN_POSITIONS)  # e.g. sin1d, learned (ConvS2S)
    image_pos: str = allowed("sin2d", one_of=IMAGE_POSITIONS)  # e.g. sin2d (CoMER's), sin2d-bttr, cape (StyTr2), learned, none
    cape_grid: int = allowed(8, ge=1)  # n of CAPE's n x n content-pooled grid, and of the `learned` image table
    max_len: int = allowed(256, ge=1)  # longest target a learned token position table holds
    # Decoder family: a name in hmer.registry.DECODERS (`hmer models` lists them).
    decoder: str = allowed("transformer", one_of=DECODERS)  # e.g. transformer, rnn, convs2s
    num_decoder_layers: int = allowed(3, ge=1)
    nhead: int = allowed(8, ge=1)
    dim_feedforward: int = allowed(1024, ge=1)
    dropout: float = allowed(0.3, ge=0, lt=1)
    embed_norm: bool = allowed(False)  # LayerNorm after the token embedding (BTTR, CoMER)
    embed_pos_norm: bool = allowed(True)  # with embed_norm: a second LayerNorm after adding positions (CoMER; not BTTR)
    # CoMER Attention Refinement Module (decoders that support it: the transformer).
    coverage: str = allowed("none", one_of=COVERAGES)  # a name in hmer.registry.COVERAGES: none, self, cross, fusion
    coverage_channels: int = allowed(32, ge=1)  # d_c
    coverage_kernel: int = allowed(5, ge=1)
    # WAP / DenseWAP GRU decoder.
    rnn_hidden: int = allowed(256, ge=1)
    rnn_attention: int = allowed(512, ge=1)
    rnn_coverage_kernel: int = allowed(11, ge=1)
    rnn_embedding: int = allowed(256, ge=1)
    # ConvS2S decoder.
    conv_layers: int = allowed(3, ge=1)
    conv_kernel: int = allowed(3, ge=1)
    # Its attention to the image: `gehring` (dot products unscaled, the context rescaled by m sqrt(1/m)
    # over the m positions, as Gehring et al.) or `scaled` (dot products over sqrt(d), the context a
    # weighted average). The paper's scores assume embeddings initialised near 0.1; on this project's
    # unit-variance features they saturate the softmax and the decoder learns to read little of the
    # image (docs/architecture.md, "ConvS2S's attention"). The `convs2s*` presets and studies take `scaled`.
    conv_attention: str = allowed("gehring", one_of=CONV_ATTENTIONS)
    # Direction of decoding: l2r, r2l, or bi (one decoder trained on both).
    direction: str = allowed("bi", one_of=DIRECTIONS)

    def validate(self) -> "ModelConfig":
        """Every model field and the model's cross-field rules (a ModelConfig is built alone by the factory)."""
        check_section(self, "model")
        return self


@dataclass
class DataConfig:
    """Where the data is, how it is rendered, and how it is batched."""

    path: str = allowed("", text="a dataset folder or zip (empty: $HMER_DATA or the default)")  # folder or zip in the <split>/caption.txt layout; "" = $HMER_DATA or the default
    # Renderer (InkML strokes -> 8-bit grey image, white ink on black).
    render_height: int = allowed(0, ge=0)  # 0 = scale from the ink's own size (see hmer.data.render)
    stroke_width: float = allowed(0.0, ge=0)  # 0 = renderer default
    # direct: drawn at render_height; standard-like: drawn at the ink's own scale and scaled to
    # render_height bilinearly, as the standard images reach a model (docs/data.md, issue 26)
    render_style: str = allowed("direct", one_of=RENDER_STYLES)
    # Validation hold-out from train (never a test year). `writer`: whole writers held out and no
    # caption on both sides, so validation looks like a test year; `random`: the old random
    # expressions, which share captions with training (see hmer.data.holdout).
    val_split: str = allowed("writer", one_of=VAL_SPLITS)  # writer | random
    val_fraction: float = allowed(0.05, ge=0, lt=1)
    val_seed: int = allowed(7, ge=0)
    # writer rule: a validation caption is at least this many token edits from every training
    # caption (1: only no exact twins, the rule before this key existed)
    val_min_edits: int = allowed(2, ge=0)
    # Subsets (for smoke presets and the memorization test); 0 = everything.
    train_limit: int = allowed(0, ge=0)
    val_limit: int = allowed(0, ge=0)
    test_limit: int = allowed(0, ge=0)
    test_years: str = allowed("2014,2016,2019", check=_test_years, says=TEST_YEARS_SAY, bad_example="2014,train")
    # Batching: bucket by image area under a pixel budget (BTTR: 320,000 px).
    batch_pixels: int = allowed(320_000, ge=1)
    max_batch_size: int = allowed(16, ge=1)
    eval_batch_pixels: int = allowed(1_600_000, ge=1)
    eval_max_batch_size: int = allowed(64, ge=1)
    max_image_pixels: int = allowed(400_000, ge=1)  # an evaluation image above this is resized, and counted
    # Every batch's padded height and width rounded up to a multiple of this (1 = the batch's own
    # largest image): a few shapes instead of one a batch, which a GPU needs (hmer.data.batching).
    pad_multiple: int = allowed(1, ge=1)
    # Train-time scale augmentation (CoMER: x0.7 .. x1.4); 0 disables.
    scale_aug_min: float = allowed(0.0, ge=0)
    scale_aug_max: float = allowed(0.0, ge=0)
    # Renderer augmentation (hmer.data.augment; all off by default): this share of the training
    # images of each batch is drawn again from its strokes with a random pen and distortions.
    aug_share: float = allowed(0.0, ge=0, le=1)  # 0 = off; 1 = every training image redrawn
    aug_width_min: float = allowed(1.0, gt=0)  # pen width, as a multiple of stroke_width, drawn uniformly in [min, max]
    aug_width_max: float = allowed(1.0, gt=0)
    aug_pressure: float = allowed(0.0, ge=0, le=1)  # pen width varies along each stroke by +- this fraction
    aug_antialias: float = allowed(0.0, ge=0, le=1)  # probability of grey (4x supersampled) edges
    # probability of drawing at the ink's own scale, then scaling bilinearly to render_height
    aug_downscale: float = allowed(0.0, ge=0, le=1)
    aug_blur: float = allowed(0.0, ge=0)  # Gaussian blur, sigma uniform in [0, aug_blur] px
    aug_slant: float = allowed(0.0, ge=0, lt=60)  # shear, uniform in +- this many degrees (a small angle)
    aug_rotate: float = allowed(0.0, ge=0, lt=60)  # rotation, uniform in +- this many degrees (a small angle)
    aug_jitter: float = allowed(0.0, ge=0)  # Gaussian noise on every pen point, this many px (standard deviation)
    aug_elastic: float = allowed(0.0, ge=0)  # smooth random displacement of the ink, this many px amplitude
    # Validation drawn a second time in another render_style and decoded at the end of training as
    # `val-alt_final_*` ("" = off; `standard-like` for a run trained on `direct`; hmer.data.augment).
    val_alt: str = allowed("", one_of=VAL_ALT_STYLES)
    # Batches collated (and copied to the device) ahead of the step in a background thread;
    # -1 = 2 on a GPU, 0 on a CPU. See hmer.training.loader.
    prefetch: int = allowed(-1, ge=-1)

    # The fields that decide what `hmer.data.load_dataset` returns (which files, how they are
    # rendered, how validation is held out); the others act on batches. Two configs with the same
    # loading fields can share loaded data (a sweep over rendering heights cannot).
    LOADING_FIELDS = ("path", "render_height", "stroke_width", "render_style", "val_split",
                      "val_fraction", "val_seed", "val_min_edits", "train_limit", "val_limit", "test_limit",
                      "test_years")

    def loading_key(self) -> tuple:
        return tuple(getattr(self, name) for name in self.LOADING_FIELDS)



@dataclass
class TrainConfig:
    """Optimisation, schedule, limits, decoding at evaluation, and bookkeeping."""

    recipe: str = allowed("bttr", one_of=_recipe_names)  # bttr | comer | custom: fills optimizer fields by name (see hmer.training.optim)
    optimizer: str = allowed("adadelta", one_of=OPTIMIZERS)  # adadelta | sgd | adamw
    lr: float = allowed(1.0, gt=0)
    momentum: float = allowed(0.9, ge=0, lt=1)
    rho: float = allowed(0.9, ge=0, le=1)
    eps: float = allowed(1e-6, gt=0)
    weight_decay: float = allowed(1e-4, ge=0)
    warmup_steps: int = allowed(0, ge=0)
    # Large batches: the learning rate scaled with the batch, `linear` (lr x k: Goyal et al. 2017,
    # "Accurate, Large Minibatch SGD", arXiv:1706.02677, for SGD with momentum, the CoMER recipe)
    # or `sqrt` (lr x sqrt(k): Krizhevsky 2014, arXiv:1404.5997; Malladi et al. 2022, arXiv:2205.10287,
    # for adaptive optimisers, Adadelta and AdamW), where k is how many times fewer optimiser steps
    # an epoch takes than at the reference batch, the one the recipe's lr was set at (by default
    # the data section's default batch, which BTTR's and CoMER's recipes train at here). `none`:
    # train.lr as given. See hmer.training.optim and docs/benchmarks.md section 4.
    lr_scaling: str = allowed("none", one_of=LR_SCALINGS)
    lr_reference_batch_pixels: int = allowed(320_000, ge=1)
    lr_reference_max_batch_size: int = allowed(16, ge=1)
    # A linear warm-up given in epochs of this batch's steps (the same images at any batch size,
    # Goyal et al.'s "gradual warm-up"); train.warmup_steps gives it in steps instead.
    warmup_epochs: float = allowed(0.0, ge=0)
    # After the warm-up: plateau (reduce when validation ExpRate stalls; BTTR, CoMER) or cosine
    # (decay to min_lr over train.epochs; for fixed short budgets, see docs/cpu_protocol.md).
    schedule: str = allowed("plateau", one_of=SCHEDULES)  # plateau | cosine
    # Reduce-on-plateau on validation ExpRate.
    plateau_factor: float = allowed(0.25, gt=0, lt=1)
    plateau_patience: int = allowed(20, ge=0)
    min_lr: float = allowed(1e-6, ge=0)
    grad_clip: float = allowed(1.0, ge=0)
    # Share of each target token's probability spread over the vocabulary in the loss; 0 = plain
    # cross-entropy, as BTTR and CoMER train.
    label_smoothing: float = allowed(0.0, ge=0, lt=1)
    epochs: int = allowed(300, ge=1)
    time_budget_s: float = allowed(0.0, ge=0)  # 0 = no wall-clock limit
    val_every: int = allowed(1, ge=1)  # epochs between validation passes
    stop_at_val_exprate: float = allowed(0.0, ge=0, le=100)  # stop early once validation ExpRate reaches this (0 = never)
    seed: int = allowed(7, ge=0)
    precision: str = allowed("auto", one_of=PRECISIONS)  # auto (bf16 autocast on GPU, fp32 on CPU) | fp32 | bf16
    device: str = allowed("auto", check=_device_name, says=DEVICE_SAY, bad_example="gpu")  # auto | cpu | cuda | cuda:N
    compile: bool = allowed(False)
    # NHWC encoder weights and images: 1.11x the training images/s of NCHW for `small` on one CPU
    # thread (docs/benchmarks.md); the layout cuDNN's tensor-core convolutions prefer on a GPU.
    channels_last: bool = allowed(True)
    # Decoding.
    beam_size: int = allowed(10, ge=1)
    max_decode_len: int = allowed(200, ge=1)
    length_penalty: float = allowed(1.0, ge=0)
    # Beam search rule, a name in hmer.registry.SEARCH_RULES: `hmer` (batched; pad and start tokens never
    # extend a hypothesis; length normalised by n), `bttr` or `comer` (the references' searches,
    # reproduced to their scores; slower, one image at a time). Greedy decoding ignores it.
    search_rule: str = allowed("hmer", one_of=SEARCH_RULES)
    # Validation decoding: greedy by default, which is cheap; BTTR and CoMER validate with the
    # full beam (the `paper` study preset does too). For `bi` models greedy reads l2r only and can
    # rank checkpoints differently from the joint search of the test (see tests/test_memorize.py).
    val_beam_size: int = allowed(1, ge=1)
    # Artifacts.
    attention_maps: int = allowed(4, ge=0)  # validation images whose attention maps are logged as PNG


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    name: str = allowed("", text="a label (the preset this config came from)")  # preset name this config came from, for tags

    # ---- dotted-key access -------------------------------------------------------------
    def to_flat_dict(self) -> dict[str, Any]:
        """{"model.decoder": "transformer", ...}: the form MLflow params and Optuna use."""
        flat: dict[str, Any] = {"name": self.name}
        for section in ("model", "data", "train"):
            for f in fields(getattr(self, section)):
                flat[f"{section}.{f.name}"] = getattr(getattr(self, section), f.name)
        return flat

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def override(self, values: dict[str, Any]) -> "Config":
        """A copy with dotted keys set (text parsed to the field's type), checked whole (`validate`)."""
        new = copy_config(self)
        for key, raw in values.items():
            if key == "name":
                new.name = _coerce(key, raw, str, allowed_of(Config, "name"))
                continue
            section, _, attr = key.partition(".")
            if section not in ("model", "data", "train") or not attr:
                raise KeyError(f"unknown config key {key!r}: use model.X, data.X or train.X")
            target = getattr(new, section)
            hints = get_type_hints(type(target))
            if attr not in hints:
                known = ", ".join(f"{section}.{f.name}" for f in fields(target))
                raise KeyError(f"unknown config key {key!r}; known {section} keys: {known}")
            setattr(target, attr, _coerce(key, raw, hints[attr], allowed_of(type(target), attr)))
        return new.validate()

    def validate(self) -> "Config":
        """Check every field against what it allows, then the cross-field RULES; ConfigError (one line
        naming the key, the value and what is allowed) at the first value that is not. Returns self."""
        for section in ("model", "data", "train"):
            check_section(getattr(self, section), section)
        check_section(self, "", only=("name",))
        flat = self.to_flat_dict()
        for rule in RULES:
            rule.check(flat)
        return self

    # ---- files ------------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, stored: bool = False) -> "Config":
        """From nested sections. `stored`: `d` was written by an earlier run (a checkpoint, a
        study), so a key it lacks takes the value it had then (`VALUES_BEFORE_KEY_EXISTED`)."""
        cfg = cls()
        flat = {"name": d.get("name", "")}
        for section in ("model", "data", "train"):
            known = {f.name for f in fields(getattr(cfg, section))}
            for k, v in (d.get(section) or {}).items():
                if k in known:  # tolerate fields of older versions
                    flat[f"{section}.{k}"] = v
        return cls.from_flat_dict(flat, stored=stored)

    @classmethod
    def load(cls, path: str | Path) -> "Config":
        path = Path(path)
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not a JSON config ({e})") from None
        except ConfigError as e:  # a value it holds is not allowed: name the file too
            raise ConfigError(f"{path}: {e}") from None

    @classmethod
    def from_flat_dict(cls, flat: dict[str, Any], *, stored: bool = False) -> "Config":
        """From "section.key" keys; `stored` as in `from_dict`."""
        if stored:
            flat = {**{k: v for k, v in VALUES_BEFORE_KEY_EXISTED.items() if k not in flat}, **flat}
        return cls().override(flat)


# Keys added after configs were first stored (checkpoints, studies, MLflow params), with the value
# that reproduces what a config stored before the key existed did. A resumed run or study keeps
# behaving as it began, whatever today's default is.
VALUES_BEFORE_KEY_EXISTED: dict[str, Any] = {
    "data.val_min_edits": 1,  # only exact caption twins were kept out of validation
}

# Where the process that runs a config finds its data, and how far ahead it loads batches: they
# belong to the machine, not to what is trained. A config stored by an earlier process and taken
# up again (a resumed study's base config, the checkpoint a killed trial continues from) takes
# these from the process running now and keeps every other value it was stored with.
MACHINE_KEYS = ("data.path", "data.prefetch")


def stored_config(stored: dict[str, Any], here: Config) -> Config:
    """The config `stored` (flat "section.key" values written by an earlier process) as this
    process runs it: the stored values (a key it lacks takes `VALUES_BEFORE_KEY_EXISTED`), with
    `here`'s MACHINE_KEYS. Defaults changed in the code since it was stored change nothing."""
    mine = here.to_flat_dict()
    return Config.from_flat_dict({**stored, **{key: mine[key] for key in MACHINE_KEYS}}, stored=True)


def copy_config(cfg: Config) -> Config:
    return Config(
        model=dataclasses.replace(cfg.model),
        data=dataclasses.replace(cfg.data),
        train=dataclasses.replace(cfg.train),
        name=cfg.name,
    )


def parse_overrides(items: list[str] | None) -> dict[str, str]:
    """["train.lr=0.1", "model.decoder=rnn"] -> {"train.lr": "0.1", ...}"""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"override {item!r} is not of the form section.key=value")
        out[key.strip()] = value.strip()
    return out


def allowed_of(cls: type, name: str) -> Allowed:
    """The `Allowed` declared for field `name` of dataclass `cls`."""
    found = next(f for f in fields(cls) if f.name == name)
    try:
        return found.metadata[ALLOWED]
    except KeyError:
        raise TypeError(f"config field {cls.__name__}.{name} is declared without allowed(...): say what it takes") \
            from None


def check_section(section: Any, prefix: str, only: tuple[str, ...] | None = None) -> None:
    """Each field of `section` (a dataclass) is of its type and allowed; then, for a section, the RULES
    among its own keys. ConfigError at the first that is not."""
    hints = get_type_hints(type(section))
    for f in fields(section):
        if only is not None and f.name not in only:
            continue
        key = f"{prefix}.{f.name}" if prefix else f.name
        _check_value(key, getattr(section, f.name), hints[f.name], allowed_of(type(section), f.name))
    if prefix:
        flat = {f"{prefix}.{f.name}": getattr(section, f.name) for f in fields(section)}
        for rule in RULES:
            if all(k in flat for k in rule.keys):
                rule.check(flat)


def check_value(key: str, value: Any, option: str = "") -> Any:
    """`value` read for the dotted `key` (a string as on the command line, or a typed value), checked
    against what the field allows; the value, of the field's type. For options that stand for a field
    (`hmer evaluate --beam` is train.beam_size): `option` names it in the error."""
    section, _, attr = key.partition(".")
    cls = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}[section]
    try:
        return _coerce(key, value, get_type_hints(cls)[attr], allowed_of(cls, attr))
    except ConfigError as exc:
        raise ConfigError(f"{option} {value}: {exc}" if option else str(exc)) from None


def _refuse(key: str, value: Any, typ: type, rule: Allowed) -> ConfigError:
    if rule.one_of is not None:
        return ConfigError(f"{key}={value!r} is not one of {', '.join(rule.choices())}")
    return ConfigError(f"{key}={value!r} is not allowed: {key} takes {rule.describe(typ)}")


def _check_value(key: str, value: Any, typ: type, rule: Allowed) -> None:
    if not _of_type(value, typ) or not rule.admits(value, typ):
        raise _refuse(key, value, typ, rule)


def _of_type(value: Any, typ: type) -> bool:
    if typ is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if typ is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, typ)


def _coerce(key: str, raw: Any, typ: Any, rule: Allowed) -> Any:
    """`raw` (text from the command line or MLflow params, or a value from JSON or Optuna) as the
    field's type, checked; ConfigError naming the key, the value and what is allowed."""
    value = _as_type(raw, typ)
    if value is None:
        raise _refuse(key, raw, typ, rule)
    _check_value(key, value, typ, rule)
    return value


def _as_type(raw: Any, typ: Any) -> Any:
    """`raw` as `typ`, or None when it is not one."""
    if isinstance(raw, str) and typ is not str:
        text = raw.strip().lower()
        if typ is bool:
            return True if text in ("1", "true", "yes", "on") else False if text in ("0", "false", "no", "off") \
                else None
        try:
            number = float(text) if typ is float or "e" in text or "." in text else int(text)
        except ValueError:
            return None
        raw = number
    if typ is float and isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return float(raw)
    if typ is int and isinstance(raw, float) and raw.is_integer():
        return int(raw)
    return raw if _of_type(raw, typ) else None
