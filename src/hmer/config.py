"""One plain config object for every experiment.

A `Config` holds three sections, `model`, `data` and `train`, each a flat dataclass of plain values,
every field addressable by a dotted key (`train.lr`): how `--set` overrides it, how Optuna studies vary
it, how MLflow logs it. Changing one field and holding every other equal is the whole point of an
ablation, so nothing about a run lives outside this object.

This module is the schema: the fields, what each allows (declared with `hmer.allowed`) and the rules
between them. How a run's config is resolved in layers (`hmer.model_presets`, `hmer.studies.resolution`)
and how a stored config reloads: docs/training.md, "What a run trains with" and "Stored configs".
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

from .allowed import ConfigError, Rule, allowed, allowed_of, check_section, coerce, of_type
from .recipes import recipe_labels  # the labels `train.recipe` takes (plain values, importing nothing)

# The swappable parts register themselves by name where they are defined (hmer.registry).
from .registry import COVERAGES, DECODERS, IMAGE_POSITIONS, SEARCH_RULES, TOKEN_POSITIONS

# Decoding directions, defined once (hmer.model.decoder_base builds their targets, hmer.decoding
# their searches): l2r, r2l, or bi (one decoder trained on both, BTTR).
DIRECTIONS = ("l2r", "r2l", "bi")
ENCODER_TAILS = ("relu-norm-pos", "pos-norm")
CONV_ATTENTIONS = ("gehring", "scaled")  # ConvS2S's attention to the image (ModelConfig.conv_attention)
OPTIMIZERS = ("adadelta", "sgd", "adamw")
VAL_SPLITS = ("writer", "random")
SCHEDULES = ("plateau", "cosine", "wsd")  # hmer.training.optim.LRSchedule
LR_SCALINGS = ("none", "linear", "sqrt")  # TrainConfig.lr_scaling: hmer.training.optim.batch_scaled_lr
RENDER_STYLES = ("direct", "standard-like")  # hmer.data.render (RenderConfig.downscale)
VAL_ALT_STYLES = ("", *RENDER_STYLES)  # "" = no second validation
PRECISIONS = ("auto", "fp32", "bf16")
TEST_YEARS_SAY = ("comma-separated test split names, each a folder of the dataset (2014,2016,2019 for CROHME), "
                  "not train or val, none twice")
DEVICE_SAY = "auto, cpu, cuda, cuda:N or mps"


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
    Rule(("data.render_scale", "data.render_height"), lambda scale, height: scale == 0 or height == 0,
         "data.render_scale sizes images by the ink's own scale and needs data.render_height=0 (a fixed "
         "height sizes them instead): give one of the two"),
    Rule(("data.aug_width_min", "data.aug_width_max"), lambda lo, hi: lo <= hi,
         "data.aug_width_min must not exceed data.aug_width_max"),
    Rule(("train.min_lr", "train.lr"), lambda low, lr: low <= lr,
         "train.min_lr must not exceed train.lr"),
    Rule(("train.plan_shapes", "data.pad_multiple", "data.pad_growth"), lambda on, m, g: not on or m > 1 or g > 1,
         "planning the batch shapes needs the pad ladder (data.pad_multiple > 1 or data.pad_growth > 1): "
         "without it every batch has its own shape"),
    Rule(("train.cuda_graphs", "data.pad_multiple", "data.pad_growth"), lambda on, m, g: not on or m > 1 or g > 1,
         "a CUDA graph per batch shape needs the pad ladder (data.pad_multiple > 1 or data.pad_growth > 1): "
         "without it every batch has its own shape"),
    Rule(("train.cuda_graphs", "train.compile"), lambda graphs, compiled: not (graphs and compiled),
         "train.cuda_graphs captures the eager step; torch.compile is another way to cut the launches: one of them"),
    Rule(("train.schedule", "train.decay_epochs", "train.epochs"),
         lambda schedule, decay, epochs: 0 < decay < epochs if schedule == "wsd" else decay == 0,
         "train.decay_epochs is the wsd schedule's decay: with train.schedule=wsd give 0 < decay_epochs < "
         "epochs, with another schedule leave it 0"),
    Rule(("train.warmup_steps", "train.warmup_epochs"), lambda steps, epochs: steps == 0 or epochs == 0,
         "give the warm-up in steps or in epochs, not both"),
)


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
    image positions, no token-embedding norm). The `bttr` and `comer-*` presets pin the
    references' functions (see hmer.model_presets)."""

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
    # e.g. sin2d (CoMER's), sin2d-bttr, cape (StyTr2), learned, none
    image_pos: str = allowed("sin2d", one_of=IMAGE_POSITIONS)
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
    # Its attention to the image: `gehring` (the paper's) or `scaled` (over sqrt(d), as a transformer's),
    # which `model.decoder=convs2s` brings with it (docs/architecture.md, "ConvS2S's attention").
    conv_attention: str = allowed("gehring", one_of=CONV_ATTENTIONS)
    # Direction of decoding: l2r, r2l, or bi (one decoder trained on both).
    direction: str = allowed("bi", one_of=DIRECTIONS)
    # CAN's symbol counting (hmer.model.counting): a multi-scale module counts each symbol class in the
    # image, and the decoder's classifier reads the counts at every step; any decoder family.
    counting: bool = allowed(False)
    counting_channels: int = allowed(32, ge=1)  # the width of its two branches (CAN's: 512)

    def validate(self) -> "ModelConfig":
        """Every model field and the model's cross-field rules (a ModelConfig is built alone by the factory)."""
        check_section(self, "model", RULES)
        return self


@dataclass
class DataConfig:
    """Where the data is, how it is rendered, and how it is batched."""

    # a folder or zip in the <split>/caption.txt layout; "" = $HMER_DATA or the default
    path: str = allowed("", text="a dataset folder or zip (empty: $HMER_DATA or the default)")
    # Renderer (InkML strokes -> 8-bit grey image, white ink on black).
    render_height: int = allowed(0, ge=0)  # 0 = scale from the ink's own size (see hmer.data.render)
    # With render_height 0: every image at this multiple of the standard images' scale (theirs is
    # the ink's own, tall strokes 28.5 px high: 1.0), so that a symbol keeps one size whatever the
    # expression; the standard 2014 images reach the model scaled by it too. 0 = not set: the size
    # is render_height's (docs/data.md, "Input scale").
    render_scale: float = allowed(0.0, ge=0, le=4)
    stroke_width: float = allowed(0.0, ge=0)  # 0 = renderer default
    # direct: drawn at render_height; standard-like: drawn at the ink's own scale and scaled to
    # render_height bilinearly, as the standard images reach a model (docs/data.md, issue 26)
    render_style: str = allowed("direct", one_of=RENDER_STYLES)
    # Validation hold-out from train (never a test year). `writer`: whole writers held out and no
    # caption on both sides, so validation looks like a test year; `random`: the old random
    # expressions, which share captions with training (see hmer.data.splits).
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
    # Every batch's padded height and width rounded up to a rung of a ladder, after the scale
    # augmentation: a few shapes instead of one a batch, which a GPU needs (hmer.data.batching). The
    # rungs are multiples of pad_multiple, each at least pad_growth times the one below (1 and 1:
    # no ladder, the batch's own largest image; pad_growth 1: every multiple of pad_multiple).
    pad_multiple: int = allowed(1, ge=1)
    pad_growth: float = allowed(1.0, ge=1, le=4)
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
    LOADING_FIELDS = ("path", "render_height", "render_scale", "stroke_width", "render_style", "val_split",
                      "val_fraction", "val_seed", "val_min_edits", "train_limit", "val_limit", "test_limit",
                      "test_years")

    def loading_key(self) -> tuple:
        return tuple(getattr(self, name) for name in self.LOADING_FIELDS)


@dataclass
class TrainConfig:
    """Optimisation, schedule, limits, decoding at evaluation, and bookkeeping."""

    # The recipe this config was made with (hmer.recipes: bttr, comer; custom for any other): a label,
    # which trains nothing itself; the recipe's own keys below do.
    recipe: str = allowed("bttr", one_of=recipe_labels)
    optimizer: str = allowed("adadelta", one_of=OPTIMIZERS)  # adadelta | sgd | adamw
    lr: float = allowed(1.0, gt=0)
    momentum: float = allowed(0.9, ge=0, lt=1)
    rho: float = allowed(0.9, ge=0, le=1)
    eps: float = allowed(1e-6, gt=0)
    weight_decay: float = allowed(1e-4, ge=0)
    warmup_steps: int = allowed(0, ge=0)
    # Large batches: lr x k (`linear`, Goyal et al. 2017, arXiv:1706.02677, for SGD) or x sqrt(k)
    # (`sqrt`, Malladi et al. 2022, arXiv:2205.10287, for Adadelta and AdamW), k = how many times fewer
    # steps an epoch takes than at the reference batch the recipe's lr was set at; `none`: lr as given.
    # See hmer.training.optim and docs/benchmarks.md section 4.
    lr_scaling: str = allowed("none", one_of=LR_SCALINGS)
    lr_reference_batch_pixels: int = allowed(320_000, ge=1)
    lr_reference_max_batch_size: int = allowed(16, ge=1)
    # A linear warm-up given in epochs of this batch's steps (the same images at any batch size,
    # Goyal et al.'s "gradual warm-up"); train.warmup_steps gives it in steps instead.
    warmup_epochs: float = allowed(0.0, ge=0)
    # After the warm-up: plateau (BTTR, CoMER), cosine (to min_lr over train.epochs; docs/cpu_protocol.md)
    # or wsd (held, then 1 - sqrt decay to min_lr over the last decay_epochs; Hägele et al. 2024,
    # arXiv:2405.18392), whose runs of several lengths share all but the decay (docs/training.md).
    schedule: str = allowed("plateau", one_of=SCHEDULES)  # plateau | cosine | wsd
    decay_epochs: int = allowed(0, ge=0)  # wsd: the last epochs, where the rate decays; 0 otherwise
    # Reduce-on-plateau on validation ExpRate.
    plateau_factor: float = allowed(0.25, gt=0, lt=1)
    plateau_patience: int = allowed(20, ge=0)
    min_lr: float = allowed(1e-6, ge=0)
    grad_clip: float = allowed(1.0, ge=0)
    # With model.counting: the weight of the counting loss beside the decoder's (CAN's: 1).
    counting_weight: float = allowed(1.0, ge=0)
    # An exponential moving average of the weights, updated after every step with this decay (0 = off;
    # hmer.training.ema): validation reads the average, and the best weights kept are the average's.
    ema_decay: float = allowed(0.0, ge=0, lt=1)
    # Share of each target token's probability spread over the vocabulary in the loss; 0 = plain
    # cross-entropy, as BTTR and CoMER train.
    label_smoothing: float = allowed(0.0, ge=0, lt=1)
    epochs: int = allowed(300, ge=1)
    time_budget_s: float = allowed(0.0, ge=0)  # 0 = no wall-clock limit
    val_every: int = allowed(1, ge=1)  # epochs between validation passes
    # stop early once validation ExpRate reaches this (0 = never)
    stop_at_val_exprate: float = allowed(0.0, ge=0, le=100)
    seed: int = allowed(7, ge=0)
    precision: str = allowed("auto", one_of=PRECISIONS)  # auto (bf16 autocast on GPU, fp32 on CPU) | fp32 | bf16
    device: str = allowed("auto", check=_device_name, says=DEVICE_SAY, bad_example="gpu")  # auto | cpu | cuda | cuda:N
    compile: bool = allowed(False)
    # NHWC encoder weights and images: 1.11x the training images/s of NCHW for `small` on one CPU
    # thread (docs/benchmarks.md); the layout cuDNN's tensor-core convolutions prefer on a GPU.
    channels_last: bool = allowed(True)
    # The 1x1 convolutions (DenseNet-B bottlenecks and transitions, the projection to d_model, the
    # ARM's projection) as matrix products: no cuDNN plan per input shape on a GPU; the same
    # parameters, other float rounding (hmer.model.accelerations).
    conv1x1_as_matmul: bool = allowed(False)
    # Before the first step, one forward and backward pass of the encoder at every batch shape the
    # pad ladder can give the training split (scale augmentation included), so that a GPU plans
    # them all up front instead of at the first batch of each shape (hmer.training.planning).
    plan_shapes: bool = allowed(False)
    # The training step's forward and backward captured as a CUDA graph per batch shape and
    # replayed (hmer.training.graphs): the host launches one graph instead of every kernel. Needs
    # the pad ladder (a few static image shapes); caption lengths are padded to a ladder too.
    cuda_graphs: bool = allowed(False)
    # Decoding.
    beam_size: int = allowed(10, ge=1)
    max_decode_len: int = allowed(200, ge=1)
    length_penalty: float = allowed(1.0, ge=0)
    # Beam search rule, a name in hmer.registry.SEARCH_RULES: `hmer` (batched; pad and start tokens never
    # extend a hypothesis; length normalised by n), `bttr` or `comer` (the references' searches,
    # reproduced to their scores; slower, one image at a time). Greedy decoding ignores it.
    search_rule: str = allowed("hmer", one_of=SEARCH_RULES)
    # Validation decoding: greedy by default, which is cheap; BTTR and CoMER validate with the
    # full beam (the `paper` budget does too). For `bi` models greedy reads l2r only and can
    # rank checkpoints differently from the joint search of the test (see tests/test_memorize.py).
    val_beam_size: int = allowed(1, ge=1)
    # Artifacts.
    attention_maps: int = allowed(4, ge=0)  # validation images whose attention maps are logged as PNG


# The sections of a Config, by the name that starts their dotted keys.
SECTIONS: dict[str, type] = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    name: str = allowed("", text="a label (the preset this config came from)")  # the preset's name, for tags

    # ---- dotted-key access -------------------------------------------------------------
    def to_flat_dict(self) -> dict[str, Any]:
        """{"model.decoder": "transformer", ...}: the form MLflow params and Optuna use."""
        return {"name": self.name, **{f"{section}.{f.name}": getattr(getattr(self, section), f.name)
                                      for section, cls in SECTIONS.items() for f in fields(cls)}}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def override(self, values: dict[str, Any]) -> "Config":
        """A copy with dotted keys set (text parsed to the field's type), checked whole (`validate`)."""
        new = Config(model=dataclasses.replace(self.model), data=dataclasses.replace(self.data),
                     train=dataclasses.replace(self.train), name=self.name)
        for key, raw in values.items():
            if key == "name":
                new.name = coerce(key, raw, str, allowed_of(Config, "name"))
            else:
                section, _, attr = key.partition(".")
                setattr(getattr(new, section), attr, check_value(key, raw))
        return new.validate()

    def validate(self) -> "Config":
        """Check every field against what it allows, then the cross-field RULES; ConfigError (one line
        naming the key, the value and what is allowed) at the first value that is not. Returns self."""
        for section in ("model", "data", "train"):
            check_section(getattr(self, section), section, RULES)
        coerce("name", self.name, str, allowed_of(Config, "name"))  # a label, of its type
        flat = self.to_flat_dict()
        for rule in RULES:
            rule.check(flat)
        return self

    # ---- files ------------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Config":
        """From nested sections; a key `d` lacks takes its default."""
        flat = {"name": d.get("name", "")}
        for section, section_cls in SECTIONS.items():  # a key no field has (an older version's) is left out
            known = {f.name for f in fields(section_cls)}
            flat.update({f"{section}.{k}": v for k, v in (d.get(section) or {}).items() if k in known})
        return cls.from_flat_dict(flat)

    @classmethod
    def load(cls, path: str | Path) -> "Config":
        """A config file a user gives (`hmer train --config`): its sections and keys must all be known and
        each value of its key's JSON type, so that a typo is refused instead of trained without; a key it
        lacks takes the default. ConfigError in one line naming the file and the key."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not a JSON config ({e})") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: cannot be read ({e.strerror if isinstance(e, OSError) else e})") from None
        try:
            _check_file_config(data)
            return cls.from_dict(data)
        except ConfigError as e:  # a value it holds is not allowed: name the file too
            raise ConfigError(f"{path}: {e}") from None

    @classmethod
    def from_flat_dict(cls, flat: dict[str, Any]) -> "Config":
        """From "section.key" keys; a key `flat` lacks takes its default."""
        return cls().override(flat)


def _check_file_config(data: Any) -> None:
    """What `Config.load` refuses before any value is read: anything but an object of the sections
    `model`, `data`, `train` (objects) and `name`, a key no section has, a value of another JSON type
    than its key's (a string for a boolean, a boolean for a number)."""
    if not isinstance(data, dict):
        raise ConfigError(f"a config is a JSON object of the sections {', '.join(SECTIONS)} (and name), "
                          f"not a {type(data).__name__}")
    unknown = [key for key in data if key not in (*SECTIONS, "name")]
    if unknown:
        raise ConfigError(f"unknown section {unknown[0]!r}: a config has the sections {', '.join(SECTIONS)} and name")
    for section, cls in SECTIONS.items():
        values = data.get(section, {})
        if not isinstance(values, dict):
            raise ConfigError(f"section {section!r} is a {type(values).__name__}, not an object of {section} keys")
        hints = get_type_hints(cls)
        for key, value in values.items():
            if key not in hints:
                raise ConfigError(f"unknown config key '{section}.{key}'; known {section} keys: "
                                  f"{', '.join(f.name for f in fields(cls))}")
            want = hints[key]
            if not of_type(value, want):
                kind = {bool: "true or false", int: "a whole number", float: "a number"}.get(want, "a string")
                raise ConfigError(f"{section}.{key} is {json.dumps(value)}, a JSON {type(value).__name__}: it takes "
                                  f"{kind}")


# Keys of the machine, not of what is trained: a stored config taken up again (a resumed study's
# base config, a killed trial's checkpoint) takes these from the process running now.
MACHINE_KEYS = ("data.path", "data.prefetch")


def stored_config(stored: dict[str, Any], here: Config) -> Config:
    """The config `stored` (flat "section.key" values written by an earlier process) as this
    process runs it: the stored values, with `here`'s MACHINE_KEYS. A stored config holds every key
    (module docstring), so defaults changed in the code since it was stored change nothing."""
    mine = here.to_flat_dict()
    return Config.from_flat_dict({**stored, **{key: mine[key] for key in MACHINE_KEYS}})


def parse_overrides(items: list[str] | None) -> dict[str, str]:
    """["train.lr=0.1", "model.decoder=rnn"] -> {"train.lr": "0.1", ...}"""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"override {item!r} is not of the form section.key=value")
        out[key.strip()] = value.strip()
    return out


def check_value(key: str, value: Any, option: str = "") -> Any:
    """`value` read for the dotted `key` (a string as on the command line, or a typed value), checked
    against what the field allows; the value, of the field's type. For options that stand for a field
    (`hmer evaluate --beam` is train.beam_size): `option` names it in the error."""
    section, _, attr = key.partition(".")
    if section not in SECTIONS or not attr:
        raise KeyError(f"unknown config key {key!r}: use model.X, data.X or train.X")
    hints = get_type_hints(SECTIONS[section])
    if attr not in hints:
        known = ", ".join(f"{section}.{name}" for name in hints)
        raise KeyError(f"unknown config key {key!r}; known {section} keys: {known}")
    try:
        return coerce(key, value, hints[attr], allowed_of(SECTIONS[section], attr))
    except ConfigError as exc:
        raise ConfigError(f"{option} {value}: {exc}" if option else str(exc)) from None
