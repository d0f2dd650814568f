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
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

# The swappable parts (decoders, position encodings, coverage kinds, search rules) are not
# listed here: each registers itself by name where it is defined (see hmer.registry), and
# validation reads those registries.
from .registry import COVERAGES, DECODERS, IMAGE_POSITIONS, SEARCH_RULES, TOKEN_POSITIONS

# Decoding directions, defined once (hmer.model.direction builds their targets, hmer.decoding
# their searches): l2r, r2l, or bi (one decoder trained on both, BTTR).
DIRECTIONS = ("l2r", "r2l", "bi")
ENCODER_TAILS = ("relu-norm-pos", "pos-norm")
OPTIMIZERS = ("adadelta", "sgd", "adamw")
VAL_SPLITS = ("writer", "random")
SCHEDULES = ("plateau", "cosine")  # hmer.data.holdout holds the rules


@dataclass
class ModelConfig:
    """Architecture. Defaults are the BTTR paper's sizes (bidirectional transformer) with the
    project's own choices where it departs from the reference code (`mask_padding`, the `sin2d`
    image positions, no token-embedding norm): run records written before a field existed reload
    with its default, so a default never changes. The `bttr` and `comer-*` presets pin the
    references' functions (see hmer.model.factory)."""

    vocab_size: int = 113  # 110 CROHME symbols + pad, sos, eos
    d_model: int = 256
    # Encoder: DenseNet-B as in DenseWAP / BTTR.
    growth_rate: int = 24
    num_dense_layers: int = 16  # layers per dense block
    num_dense_blocks: int = 3
    compression: float = 0.5
    bottleneck: bool = True
    encoder_dropout: float = 0.2
    # Padded pixels zeroed before every 3x3 conv and pool, so a batched image gets the features it
    # has alone (batch invariance). BTTR and CoMER do not mask (False): padding leaks into the
    # features near the bottom/right border of the smaller images of a batch.
    mask_padding: bool = True
    # After the DenseNet: 1x1 conv, then `relu-norm-pos` (ReLU, LayerNorm, + image positions;
    # BTTR) or `pos-norm` (+ image positions, LayerNorm; CoMER).
    encoder_tail: str = "relu-norm-pos"
    # Positional encodings.
    # A name in hmer.registry.TOKEN_POSITIONS / IMAGE_POSITIONS (`hmer models` lists them).
    token_pos: str = "sin1d"  # e.g. sin1d, learned (ConvS2S)
    image_pos: str = "sin2d"  # e.g. sin2d (CoMER's), sin2d-bttr, cape (StyTr2), learned, none
    cape_grid: int = 8  # n of CAPE's n x n content-pooled grid, and of the `learned` image table
    max_len: int = 256  # longest target a learned token position table holds
    # Decoder family: a name in hmer.registry.DECODERS (`hmer models` lists them).
    decoder: str = "transformer"  # e.g. transformer, rnn, convs2s
    num_decoder_layers: int = 3
    nhead: int = 8
    dim_feedforward: int = 1024
    dropout: float = 0.3
    embed_norm: bool = False  # LayerNorm after the token embedding (BTTR, CoMER)
    embed_pos_norm: bool = True  # with embed_norm: a second LayerNorm after adding positions (CoMER; not BTTR)
    # CoMER Attention Refinement Module (decoders that support it: the transformer).
    coverage: str = "none"  # a name in hmer.registry.COVERAGES: none, self, cross, fusion
    coverage_channels: int = 32  # d_c
    coverage_kernel: int = 5
    # WAP / DenseWAP GRU decoder.
    rnn_hidden: int = 256
    rnn_attention: int = 512
    rnn_coverage_kernel: int = 11
    rnn_embedding: int = 256
    # ConvS2S decoder.
    conv_layers: int = 3
    conv_kernel: int = 3
    # Direction of decoding: l2r, r2l, or bi (one decoder trained on both).
    direction: str = "bi"

    def validate(self) -> None:
        decoder = DECODERS.get(self.decoder)
        coverage = COVERAGES.get(self.coverage)
        _check_choice("model.direction", self.direction, DIRECTIONS)
        TOKEN_POSITIONS.check(self.token_pos)
        IMAGE_POSITIONS.check(self.image_pos)
        _check_choice("model.encoder_tail", self.encoder_tail, ENCODER_TAILS)
        if coverage.refines and not getattr(decoder, "supports_coverage", False):
            able = [name for name in DECODERS.names() if getattr(DECODERS.get(name), "supports_coverage", False)]
            raise ValueError(
                f"model.coverage={self.coverage!r} needs a decoder with CoMER's attention refinement "
                f"(model.decoder={' or '.join(map(repr, able))}; the RNN decoder has its own WAP coverage), "
                f"got {self.decoder!r}"
            )
        if self.d_model % self.nhead:
            raise ValueError(f"model.d_model={self.d_model} is not divisible by model.nhead={self.nhead}")
        if self.d_model % 4:
            raise ValueError(f"model.d_model={self.d_model} must be divisible by 4 for the 2-D sinusoidal encoding")


@dataclass
class DataConfig:
    """Where the data is, how it is rendered, and how it is batched."""

    path: str = ""  # folder or zip in the <split>/caption.txt layout; "" = $HMER_DATA or the default
    # Renderer (InkML strokes -> 8-bit grey image, white ink on black).
    render_height: int = 0  # 0 = scale from the ink's own size (see hmer.data.render)
    stroke_width: float = 0.0  # 0 = renderer default
    # direct: drawn at render_height; standard-like: drawn at the ink's own scale and scaled to
    # render_height bilinearly, as the standard images reach a model (docs/data.md, issue 26)
    render_style: str = "direct"
    # Validation hold-out from train (never a test year). `writer`: whole writers held out and no
    # caption on both sides, so validation looks like a test year; `random`: the old random
    # expressions, which share captions with training (see hmer.data.holdout).
    val_split: str = "writer"  # writer | random
    val_fraction: float = 0.05
    val_seed: int = 7
    # writer rule: a validation caption is at least this many token edits from every training
    # caption (1: only no exact twins, the rule before this key existed)
    val_min_edits: int = 2
    # Subsets (for smoke presets and the memorization test); 0 = everything.
    train_limit: int = 0
    val_limit: int = 0
    test_limit: int = 0
    test_years: str = "2014,2016,2019"
    # Batching: bucket by image area under a pixel budget (BTTR: 320,000 px).
    batch_pixels: int = 320_000
    max_batch_size: int = 16
    eval_batch_pixels: int = 1_600_000
    eval_max_batch_size: int = 64
    max_image_pixels: int = 400_000  # an evaluation image above this is resized, and counted
    # Train-time scale augmentation (CoMER: x0.7 .. x1.4); 0 disables.
    scale_aug_min: float = 0.0
    scale_aug_max: float = 0.0
    # Renderer augmentation (hmer.data.augment; all off by default): this share of the training
    # images of each batch is drawn again from its strokes with a random pen and distortions.
    aug_share: float = 0.0  # 0 = off; 1 = every training image redrawn
    aug_width_min: float = 1.0  # pen width, as a multiple of stroke_width, drawn uniformly in [min, max]
    aug_width_max: float = 1.0
    aug_pressure: float = 0.0  # pen width varies along each stroke by +- this fraction
    aug_antialias: float = 0.0  # probability of grey (4x supersampled) edges
    aug_downscale: float = 0.0  # probability of drawing at the ink's own scale, then scaling bilinearly to render_height
    aug_blur: float = 0.0  # Gaussian blur, sigma uniform in [0, aug_blur] px
    aug_slant: float = 0.0  # shear, uniform in +- this many degrees
    aug_rotate: float = 0.0  # rotation, uniform in +- this many degrees
    aug_jitter: float = 0.0  # Gaussian noise on every pen point, this many px (standard deviation)
    aug_elastic: float = 0.0  # smooth random displacement of the ink, this many px amplitude
    # Validation drawn a second time in another render_style and decoded at the end of training as
    # `val-alt_final_*` ("" = off; `standard-like` for a run trained on `direct`; hmer.data.augment).
    val_alt: str = ""
    # Batches collated (and copied to the device) ahead of the step in a background thread;
    # -1 = 2 on a GPU, 0 on a CPU. See hmer.training.loader.
    prefetch: int = -1


RENDER_STYLES = ("direct", "standard-like")  # hmer.data.render (RenderConfig.downscale)
VAL_ALT_STYLES = ("", *RENDER_STYLES)  # "" = no second validation


def _check_augmentation(data: DataConfig) -> None:
    _check_choice("data.val_alt", data.val_alt, VAL_ALT_STYLES)
    _check_choice("data.render_style", data.render_style, RENDER_STYLES)
    for key in ("aug_share", "aug_pressure", "aug_antialias", "aug_downscale"):
        value = getattr(data, key)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"data.{key}={value} must be between 0 and 1")
    for key in ("aug_blur", "aug_slant", "aug_rotate", "aug_jitter", "aug_elastic"):
        if getattr(data, key) < 0:
            raise ValueError(f"data.{key}={getattr(data, key)} must be >= 0")
    if not 0 < data.aug_width_min <= data.aug_width_max:
        raise ValueError(f"data.aug_width_min={data.aug_width_min} and data.aug_width_max={data.aug_width_max}: "
                         f"need 0 < min <= max")
    if data.aug_slant >= 60 or data.aug_rotate >= 60:
        raise ValueError("data.aug_slant and data.aug_rotate are small angles in degrees (< 60)")


@dataclass
class TrainConfig:
    """Optimisation, schedule, limits, decoding at evaluation, and bookkeeping."""

    recipe: str = "bttr"  # bttr | comer | custom: fills optimizer fields by name (see hmer.training.recipes)
    optimizer: str = "adadelta"  # adadelta | sgd | adamw
    lr: float = 1.0
    momentum: float = 0.9
    rho: float = 0.9
    eps: float = 1e-6
    weight_decay: float = 1e-4
    warmup_steps: int = 0
    # After the warm-up: plateau (reduce when validation ExpRate stalls; BTTR, CoMER) or cosine
    # (decay to min_lr over train.epochs; for fixed short budgets, see docs/cpu_protocol.md).
    schedule: str = "plateau"  # plateau | cosine
    # Reduce-on-plateau on validation ExpRate.
    plateau_factor: float = 0.25
    plateau_patience: int = 20
    min_lr: float = 1e-6
    grad_clip: float = 1.0
    epochs: int = 300
    time_budget_s: float = 0.0  # 0 = no wall-clock limit
    val_every: int = 1  # epochs between validation passes
    stop_at_val_exprate: float = 0.0  # stop early once validation ExpRate reaches this (0 = never)
    seed: int = 7
    precision: str = "auto"  # auto (bf16 autocast on GPU, fp32 on CPU) | fp32 | bf16
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    compile: bool = False
    channels_last: bool = False  # NHWC encoder weights and images; measure with `hmer bench` first
    # Decoding.
    beam_size: int = 10
    max_decode_len: int = 200
    length_penalty: float = 1.0
    # Beam search rule, a name in hmer.registry.SEARCH_RULES: `hmer` (batched; pad and start tokens never
    # extend a hypothesis; length normalised by n), `bttr` or `comer` (the references' searches,
    # reproduced to their scores; slower, one image at a time). Greedy decoding ignores it.
    search_rule: str = "hmer"
    # Validation decoding: greedy by default, which is cheap; BTTR and CoMER validate with the
    # full beam (the `paper` study preset does too). For `bi` models greedy reads l2r only and can
    # rank checkpoints differently from the joint search of the test (see tests/test_memorize.py).
    val_beam_size: int = 1
    # Artifacts.
    attention_maps: int = 4  # validation images whose attention maps are logged as PNG


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    name: str = ""  # preset name this config came from, for tags

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
        """Return a copy with dotted keys set; strings are parsed to the field's type."""
        new = copy_config(self)
        for key, raw in values.items():
            if key == "name":
                new.name = str(raw)
                continue
            section, _, attr = key.partition(".")
            if section not in ("model", "data", "train") or not attr:
                raise KeyError(f"unknown config key {key!r}: use model.X, data.X or train.X")
            target = getattr(new, section)
            hints = get_type_hints(type(target))
            if attr not in hints:
                known = ", ".join(f"{section}.{f.name}" for f in fields(target))
                raise KeyError(f"unknown config key {key!r}; known {section} keys: {known}")
            setattr(target, attr, _coerce(key, raw, hints[attr]))
        return new

    def validate(self) -> "Config":
        self.model.validate()
        _check_choice("train.optimizer", self.train.optimizer, OPTIMIZERS)
        _check_choice("data.val_split", self.data.val_split, VAL_SPLITS)
        _check_augmentation(self.data)
        _check_choice("train.schedule", self.train.schedule, SCHEDULES)
        SEARCH_RULES.check(self.train.search_rule)
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


def _check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{key}={value!r} is not one of {', '.join(choices)}")


def _coerce(key: str, raw: Any, typ: Any) -> Any:
    if not isinstance(raw, str):
        if typ is float and isinstance(raw, int) and not isinstance(raw, bool):
            return float(raw)
        return raw
    try:
        if typ is bool:
            low = raw.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if typ is int:
            return int(float(raw)) if "e" in raw.lower() else int(raw)
        if typ is float:
            return float(raw)
        return raw
    except ValueError:
        raise ValueError(f"{key}={raw!r} is not a valid {getattr(typ, '__name__', typ)}") from None
