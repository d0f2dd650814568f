#!/usr/bin/env python3
"""Make the golden outputs of the two reference implementations that tests/test_reference_fidelity.py and
tests/test_reference_import.py compare the project's models with (`$HMER_PEERS`, or `../shared/peers` beside
the checkout; that folder's README describes every file). It runs the references' own code from the user's
clones, never a copy: BTTR (https://github.com/Green-Wood/BTTR, commit 43cabd4) and CoMER
(https://github.com/Green-Wood/CoMER, commit ee15cdb, which has no licence, so nothing of it is in this
repository). Besides torch, numpy and PIL it needs `pip install einops`; PyTorch Lightning, torchmetrics,
editdistance, torchvision and cv2 are replaced by small stand-ins below, none of which takes part in the
computation.

  git clone https://github.com/Green-Wood/BTTR && git -C BTTR checkout 43cabd4
  git clone https://github.com/Green-Wood/CoMER && git -C CoMER checkout ee15cdb
  python tools/golden_outputs.py --bttr BTTR --comer CoMER \\
      --images ../shared/crohme/wap-offline-2014-test.tar.gz --out /tmp/peers
  python tools/golden_outputs.py ... --from-checkpoints ../shared/peers --out /tmp/peers
  python tools/golden_outputs.py --check ../shared/peers --out /tmp/peers

`--images` is the standard 2014 test images (the tarball or its unpacked folder of `<name>_0.bmp`);
`--captions` a `caption.txt` (`<name> <tokens>`) or `crohme-inkml.zip`, by default that zip beside the images.

Two modes:
- from scratch (the default): for each model, seed 0, the Lightning module built from the small config,
  two training steps on the three images with its own optimizer and loss, the perturbations of the peers
  README's "Weights" section, then `<model>.ckpt`, `<model>.full_keys.json` (the full config.yaml model) and
  the dictionaries; the golden file is then computed from the checkpoint just written, as in the other mode.
  The peers README does not say in which order the perturbations draw their random numbers; the order that
  reproduces the stored weights is: a fresh `torch.manual_seed(1)` after training, every norm in `modules()`
  order (weight, bias, then a BatchNorm's running_mean, running_var), then every attention (in_proj_bias,
  out_proj.bias). On CPU, one thread, all 14 stored files come out byte for byte.
- `--from-checkpoints DIR`: each reference model rebuilt from DIR's `<model>.ckpt` (hyper_parameters +
  state_dict, strict), then `<model>.golden.pt` from it; the stored golden files come out byte for byte.
`--check DIR` compares the files of `--out` with DIR's of the same names (tensors with torch.equal, scores
with ==), one line per file: equal, or the first difference.
"""

from __future__ import annotations

import argparse
import inspect
import io
import json
import sys
import tarfile
import types
import zipfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

NAMES = ("18_em_10", "18_em_11", "18_em_0")  # small, middle, large: all inside CoMER's size limits
SEED = 0
EOS_SOS_BIAS = 3.0
SMALL = dict(d_model=64, growth_rate=8, num_layers=4, nhead=4, num_decoder_layers=2, dim_feedforward=128,
             dropout=0.3)
SEARCH = dict(beam_size=10, max_len=200, alpha=1.0)
BTTR = dict(repo="https://github.com/Green-Wood/BTTR", commit="43cabd4", package="bttr", lit="LitBTTR",
            prefix="bttr.", lightning="1.3.5")
COMER = dict(repo="https://github.com/Green-Wood/CoMER", commit="ee15cdb", package="comer", lit="LitCoMER",
             prefix="comer_model.", lightning="1.4.9")
MODELS = {  # model -> (reference, its coverage switches)
    "bttr": (BTTR, {}),
    "comer_fusion": (COMER, dict(cross_coverage=True, self_coverage=True)),
    "comer_self": (COMER, dict(cross_coverage=False, self_coverage=True)),
    "comer_cross": (COMER, dict(cross_coverage=True, self_coverage=False)),
}
BTTR_FUNCTION = "BTTR.beam_search(img, mask, beam_size, max_len) + max(score / len**alpha) (LitBTTR.test_step)"
COMER_FUNCTION = "LitCoMER.approximate_joint_search(img, mask) = CoMER.beam_search(img, mask, **hparams)"
# the param-group keys torch 1.7/1.8 (the references' torch) wrote, so that a checkpoint reads as theirs
GROUP_KEYS = {"Adadelta": ("lr", "rho", "eps", "weight_decay", "params"),
              "SGD": ("lr", "momentum", "dampening", "weight_decay", "nesterov", "params")}


# ---------------------------------------------------------------- stand-ins for what the references import

class AttributeDict(dict):
    """pytorch_lightning.utilities.parsing.AttributeDict: the class a Lightning 1.x checkpoint pickles."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError as missing:
            raise AttributeError(key) from missing

    def __setattr__(self, key, value):
        self[key] = value


AttributeDict.__module__ = "pytorch_lightning.utilities.parsing"  # the global a checkpoint pickles, as Lightning's


class LightningModule(torch.nn.Module):
    """What the references reach of pl.LightningModule: hparams, device, log, trainer."""

    trainer = types.SimpleNamespace(check_val_every_n_epoch=1)  # configure_optimizers divides by it

    def save_hyperparameters(self):
        # the caller's __init__ arguments, in its signature's order, as Lightning collects them
        frame = inspect.currentframe().f_back
        args = inspect.getargvalues(frame)
        self.hparams = AttributeDict((name, args.locals[name]) for name in args.args if name != "self")

    @property
    def device(self):
        tensor = next(iter([*self.parameters(), *self.buffers()]), None)
        return torch.device("cpu") if tensor is None else tensor.device

    def log(self, *args, **kwargs):
        pass


class Metric(torch.nn.Module):
    """torchmetrics.Metric, enough for the references' ExpRateRecorder (never called here)."""

    def __init__(self, dist_sync_on_step=False, **kwargs):
        super().__init__()

    def add_state(self, name, default, dist_reduce_fx=None, persistent=False):
        setattr(self, name, default.clone())

    def forward(self, *args, **kwargs):
        return self.update(*args, **kwargs)


def edit_distance(a, b):
    """editdistance.eval (Levenshtein distance)."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


class ToTensor:
    """torchvision ToTensor for 8-bit grayscale: uint8 [H, W] -> float32 [1, H, W] / 255."""

    def __call__(self, image):
        return torch.from_numpy(np.array(image, dtype=np.uint8))[None].float().div(255)


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, x):
        for transform in self.transforms:
            x = transform(x)
        return x


def _never(*args, **kwargs):
    raise RuntimeError("a stand-in was called that the golden inputs never need (cv2: no resizing)")


def install_stand_ins():
    """Register the stand-in modules in sys.modules, so that the references import them."""
    def module(name, **attrs):
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        sys.modules[name] = mod
        return mod

    parsing = module("pytorch_lightning.utilities.parsing", AttributeDict=AttributeDict)
    utilities = module("pytorch_lightning.utilities", parsing=parsing)
    module("pytorch_lightning", LightningModule=LightningModule, LightningDataModule=object,
           seed_everything=torch.manual_seed, utilities=utilities)
    module("torchmetrics", Metric=Metric)
    module("editdistance", eval=edit_distance)
    transforms = module("torchvision.transforms", ToTensor=ToTensor, Compose=Compose)
    transforms.transforms = transforms  # BTTR: `from torchvision.transforms import transforms`
    module("torchvision", transforms=transforms)
    module("cv2", resize=_never, INTER_LINEAR=1, INTER_AREA=3)


def import_reference(reference, clone):
    """The reference's Lightning module class, its datamodule module and its utils, from the user's clone."""
    import importlib

    sys.path.insert(0, str(Path(clone).resolve()))
    package = reference["package"]
    lit = importlib.import_module(f"{package}.lit_{package}")
    data = importlib.import_module(f"{package}.datamodule.datamodule")
    utils = importlib.import_module("bttr.utils" if package == "bttr" else "comer.utils.utils")
    return types.SimpleNamespace(Lit=getattr(lit, reference["lit"]), data=data, utils=utils, clone=Path(clone))


# ---------------------------------------------------------------- inputs

def read_images(source):
    """{name: PIL image} of NAMES from a tarball or a folder of `<name>_0.bmp`."""
    source = Path(source)
    images = {}
    if source.is_dir():
        for name in NAMES:
            with Image.open(source / f"{name}_0.bmp") as image:
                images[name] = image.copy()
        return images
    with tarfile.open(source) as tar:
        for member in tar.getmembers():
            name = Path(member.name).name.removesuffix("_0.bmp")
            if name in NAMES and member.name.endswith("_0.bmp"):
                images[name] = Image.open(io.BytesIO(tar.extractfile(member).read())).copy()
    missing = [name for name in NAMES if name not in images]
    if missing:
        raise SystemExit(f"{source}: no {', '.join(missing)}")
    return images


def read_captions(source):
    """{name: tokens} of NAMES from a caption.txt or from crohme-inkml.zip's crohme/2014/caption.txt."""
    source = Path(source)
    if zipfile.is_zipfile(source):
        with zipfile.ZipFile(source) as archive:
            text = archive.read("crohme/2014/caption.txt").decode()
    else:
        text = source.read_text()
    captions = {}
    for line in text.splitlines():
        name, *tokens = line.split()
        if name in NAMES:
            captions[name] = tokens
    return {name: captions[name] for name in NAMES}


def reference_inputs(ref, images, captions):
    """The three inputs as the reference's collate_fn pads them: one per image, and the batch of three."""
    tensors = [ToTensor()(images[name]) for name in NAMES]
    tokens = [captions[name] for name in NAMES]
    singles = [ref.data.collate_fn([([name], [tensor], [caption])])
               for name, tensor, caption in zip(NAMES, tensors, tokens)]
    batch = ref.data.collate_fn([(list(NAMES), tensors, tokens)])
    return tensors, singles, batch


# ---------------------------------------------------------------- weights and checkpoint

def small_hparams(reference, coverage):
    extra = dict(dc=8, **coverage) if reference is COMER else {}
    search = dict(early_stopping=False, temperature=1.0) if reference is COMER else {}
    learning_rate = 0.08 if reference is COMER else 1.0
    return dict(**SMALL, **extra, **SEARCH, **search, learning_rate=learning_rate, patience=20)


def train_two_steps(lit, batch):
    """Two of the module's own training steps on the batch; the optimizer's state, as torch 1.7/1.8 wrote it."""
    optimizer = lit.configure_optimizers()["optimizer"]
    lit.train()
    for step in range(2):
        optimizer.zero_grad()
        lit.training_step(batch, step).backward()
        optimizer.step()
    state = optimizer.state_dict()
    keys = GROUP_KEYS[type(optimizer).__name__]
    groups = [{key: group[key] for key in keys} for group in state["param_groups"]]
    # torch 2 keeps Adadelta's step as a tensor; torch 1.7/1.8 kept an int
    per_param = {index: {key: int(value) if key == "step" else value for key, value in entry.items()}
                 for index, entry in state["state"].items()}
    return {"state": per_param, "param_groups": groups}


@torch.no_grad()
def perturb(lit, ref):
    """The peers README's "Weights" items 3 and 4: non-trivial norms and attention biases, +3 on sos/eos."""
    norms = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.LayerNorm)
    for module in lit.modules():
        if isinstance(module, norms):
            module.weight.copy_(1 + 0.1 * torch.randn_like(module.weight))
            module.bias.copy_(0.1 * torch.randn_like(module.bias))
            if getattr(module, "running_mean", None) is not None:  # BatchNorm, not LayerNorm
                module.running_mean.copy_(0.1 * torch.randn_like(module.running_mean))
                module.running_var.copy_(0.5 + torch.rand_like(module.running_var))
    for module in lit.modules():  # then the attention biases, torch's or CoMER's attention
        if hasattr(module, "in_proj_bias") and hasattr(module, "out_proj"):
            module.in_proj_bias.copy_(0.02 * torch.randn_like(module.in_proj_bias))
            module.out_proj.bias.copy_(0.02 * torch.randn_like(module.out_proj.bias))
    bias = reference_model(lit).decoder.proj.bias
    bias[ref.data.vocab.SOS_IDX] += EOS_SOS_BIAS
    bias[ref.data.vocab.EOS_IDX] += EOS_SOS_BIAS


def fresh_checkpoint(ref, reference, coverage, batch):
    """A `<model>.ckpt` dict made from scratch, in the layout PyTorch Lightning 1.x writes."""
    torch.manual_seed(SEED)
    lit = ref.Lit(**small_hparams(reference, coverage))
    optimizer_state = train_two_steps(lit, batch)
    torch.manual_seed(SEED + 1)  # the perturbations draw from a seed of their own, not after the dropout's draws
    perturb(lit, ref)
    return {"epoch": 0, "global_step": 2, "pytorch-lightning_version": reference["lightning"],
            "state_dict": dict(lit.state_dict()), "optimizer_states": [optimizer_state], "lr_schedulers": [],
            "hparams_name": "kwargs", "hyper_parameters": lit.hparams}


def load_checkpoint(path):
    """A `.ckpt` dict; its hyper_parameters unpickle as pytorch_lightning's AttributeDict (the stand-in's)."""
    if "pytorch_lightning" not in sys.modules:
        install_stand_ins()
    return torch.load(path, map_location="cpu", weights_only=False)


def rebuild(ref, checkpoint):
    """The reference module from a checkpoint: strict weights, eval mode, no gradients."""
    lit = ref.Lit(**checkpoint["hyper_parameters"])
    lit.load_state_dict(checkpoint["state_dict"], strict=True)
    lit.eval()
    lit.requires_grad_(False)  # with gradients on, logits differ in their low bits (peers README)
    return lit


def reference_model(lit):
    return lit.bttr if hasattr(lit, "bttr") else lit.comer_model


def full_keys(ref, reference, model, coverage):
    """`<model>.full_keys.json`'s content: every state_dict key of the full config.yaml model."""
    import yaml

    config = yaml.safe_load((ref.clone / "config.yaml").read_text())["model"]
    config.update(coverage)
    lit = ref.Lit(**config)
    entries = [{"key": key, "shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}
               for key, value in lit.state_dict().items()]
    return {"model": model, "reference_repo": reference["repo"], "reference_commit": reference["commit"],
            "lightning_class": reference["lit"], "prefix": reference["prefix"],
            "hyper_parameters": dict(lit.hparams), "num_parameters": sum(p.numel() for p in lit.parameters()),
            "num_state_dict_entries": len(entries), "state_dict": entries}


# ---------------------------------------------------------------- golden outputs

def hypothesis(vocab, ids, **scores):
    return {"tokens": vocab.indices2words(ids), "ids": list(ids), **scores}


def bttr_beam(lit, ref, sample):
    """BTTR's bidirectional search on one image, its raw scores caught before _cross_rate_score adds to them."""
    vocab, hp, decoder = ref.data.vocab, lit.hparams, lit.bttr.decoder
    raw = {}
    search = decoder._beam_search

    def catching(src, mask, direction, beam_size, max_len):
        hyps = search(src, mask, direction, beam_size, max_len)
        raw[direction] = [hypothesis(vocab, h.seq, score=float(h.score)) for h in hyps]
        return hyps

    decoder._beam_search = catching
    try:
        hyps = lit.bttr.beam_search(sample.imgs, sample.mask, hp.beam_size, hp.max_len)
    finally:
        del decoder._beam_search
    directions = ["l2r"] * len(raw["l2r"]) + ["r2l"] * len(raw["r2l"])
    raws = [h["score"] for h in raw["l2r"] + raw["r2l"]]
    joint = [{"direction": direction, **hypothesis(vocab, h.seq), "raw_score": score,
              "final_score": float(h.score), "normalized_score": float(h.score / (len(h) ** hp.alpha))}
             for direction, score, h in zip(directions, raws, hyps)]
    best = max(hyps, key=lambda h: h.score / (len(h) ** hp.alpha))  # LitBTTR.test_step's choice
    index = next(i for i, h in enumerate(hyps) if h is best)
    return {"function": BTTR_FUNCTION, "l2r": raw["l2r"], "r2l": raw["r2l"], "joint": joint,
            "best": {"index": index, **hypothesis(vocab, best.seq), "score": joint[index]["normalized_score"],
                     "final_score": joint[index]["final_score"]}}


def comer_beam(lit, ref, sample):
    """CoMER's approximate joint search on a batch, one entry per image: both directions' final hypotheses
    with their own and the opposite direction's ratings (caught around _beam_search and _rate), and the best."""
    vocab, decoder, beam_size = ref.data.vocab, lit.comer_model.decoder, lit.hparams.beam_size
    caught = {}
    search, rate = decoder._beam_search, decoder._rate

    def catching_search(*args, **kwargs):
        hyps, scores = search(*args, **kwargs)
        caught["hyps"], caught["scores"] = list(hyps), scores.clone()  # the caller flips the r2l half in place
        return hyps, scores

    def catching_rate(*args, **kwargs):
        caught["rate"] = rate(*args, **kwargs)
        return caught["rate"]

    decoder._beam_search, decoder._rate = catching_search, catching_rate
    try:
        best = lit.approximate_joint_search(sample.imgs, sample.mask)
    finally:
        del decoder._beam_search, decoder._rate
    half = len(caught["hyps"]) // 2
    # the rating of the first half (l2r hypotheses) came second: the reference swaps the halves back so
    rev = torch.cat((caught["rate"][half:], caught["rate"][:half]), dim=0)
    total = caught["scores"] + rev

    def entry(j, reverse):
        ids = caught["hyps"][j].tolist()
        return hypothesis(vocab, ids[::-1] if reverse else ids, score=float(caught["scores"][j]),
                          rev_score=float(rev[j]), total_score=float(total[j]))

    return [{"l2r": [entry(i * beam_size + k, False) for k in range(beam_size)],
             "r2l": [entry(half + i * beam_size + k, True) for k in range(beam_size)],
             "best": hypothesis(vocab, h.seq, score=float(h.score))} for i, h in enumerate(best)]


def encoded(model, sample):
    feature, mask = model.encoder(sample.imgs, sample.mask)
    return {"feature": feature, "mask": mask}


def teacher_forced(lit, ref, sample):
    tgt, out = ref.utils.to_bi_tgt_out(sample.indices, lit.device)
    logits = lit(sample.imgs, sample.mask, tgt)
    return {"tgt": tgt, "out": out, "logits": logits, "loss": ref.utils.ce_loss(logits, out)}


@torch.no_grad()
def golden(ref, reference, model, checkpoint, inputs, captions):
    """`<model>.golden.pt`'s content, from the reference model rebuilt from `checkpoint`."""
    lit = rebuild(ref, checkpoint)
    tensors, singles, batch = inputs
    vocab, hp = ref.data.vocab, lit.hparams
    net = reference_model(lit)
    if reference is BTTR:
        beam = {**SEARCH, "single": [bttr_beam(lit, ref, sample) for sample in singles]}
    else:
        beam = {**SEARCH, "single": [comer_beam(lit, ref, sample)[0] for sample in singles],
                "early_stopping": hp.early_stopping, "temperature": hp.temperature, "function": COMER_FUNCTION,
                "batch": comer_beam(lit, ref, batch)}
    return {
        "format": "golden-v1", "model": model, "reference_repo": reference["repo"],
        "reference_commit": reference["commit"], "hyper_parameters": dict(hp), "eos_sos_bias": EOS_SOS_BIAS,
        "vocab": [vocab.idx2word[i] for i in range(len(vocab))],
        "inputs": {"names": list(NAMES), "captions": [captions[name] for name in NAMES],
                   "caption_ids": batch.indices, "images": tensors,
                   # copies: the stored files keep the inputs apart from the encoder's mask (a view of its input)
                   "batch_images": batch.imgs.clone(), "batch_mask": batch.mask.clone()},
        "encoder": {"single": [encoded(net, sample) for sample in singles], "batch": encoded(net, batch)},
        "teacher_forcing": {"single": [teacher_forced(lit, ref, sample) for sample in singles],
                            "batch": teacher_forced(lit, ref, batch)},
        "beam": beam,
    }


# ---------------------------------------------------------------- comparison

def first_difference(a, b, where=""):
    """Where `a` and `b` first differ (tensors bit for bit, floats exactly), or None."""
    if type(a) is not type(b) and not (isinstance(a, dict) and isinstance(b, dict)):
        return f"{where}: {type(a).__name__} against {type(b).__name__}"
    if isinstance(a, dict):
        if list(a) != list(b):
            return f"{where}: keys {list(a)} against {list(b)}"
        return next((d for key in a if (d := first_difference(a[key], b[key], f"{where}[{key!r}]"))), None)
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{where}: {len(a)} items against {len(b)}"
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := first_difference(x, y, f"{where}[{i}]"))),
                    None)
    if isinstance(a, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{where}: {a.dtype} {tuple(a.shape)} against {b.dtype} {tuple(b.shape)}"
        if not torch.equal(a, b):
            gap = (a.double() - b.double()).abs().max().item() if a.is_floating_point() else "-"
            return f"{where}: values differ (largest gap {gap})"
        return None
    return None if a == b else f"{where}: {a!r} against {b!r}"


def check(out, against):
    """One line per file of `out`: equal to `against`'s file of that name, or the first difference."""
    for path in sorted(Path(out).iterdir()):
        other = Path(against) / path.name
        if not other.exists():
            print(f"{path.name}: not in {against}")
            continue
        if path.suffix == ".pt":
            diff = first_difference(torch.load(path, weights_only=True), torch.load(other, weights_only=True))
        elif path.suffix == ".ckpt":
            diff = first_difference(load_checkpoint(path), load_checkpoint(other))
        elif path.suffix == ".json":
            diff = first_difference(json.loads(path.read_text()), json.loads(other.read_text()))
        else:
            diff = None if path.read_bytes() == other.read_bytes() else "bytes differ"
        same_bytes = path.read_bytes() == other.read_bytes()
        print(f"{path.name}: " + (f"differs at {diff}" if diff else "equal" + ("" if same_bytes else
                                                                              " (not byte for byte)")))


# ---------------------------------------------------------------- main

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bttr", type=Path, help="a clone of Green-Wood/BTTR at 43cabd4")
    parser.add_argument("--comer", type=Path, help="a clone of Green-Wood/CoMER at ee15cdb")
    parser.add_argument("--images", type=Path, help="the 2014 test images: the tarball or its folder")
    parser.add_argument("--captions", type=Path, help="caption.txt or crohme-inkml.zip (default: the zip beside "
                                                      "the images)")
    parser.add_argument("--from-checkpoints", type=Path, metavar="DIR",
                        help="rebuild each model from DIR/<model>.ckpt instead of training one")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--check", type=Path, metavar="DIR", help="compare --out's files with DIR's")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the golden numbers are one thread's (other counts move the low bits)
    if args.bttr or args.comer:
        wanted = {MODELS[model][0]["package"] for model in args.models}
        missing = [f"--{package}" for package in sorted(wanted) if getattr(args, package) is None]
        if missing or args.images is None:
            parser.error(f"making {', '.join(args.models)} needs {', '.join([*missing, '--images'])}")
        make(args)
    elif not args.check:
        parser.error("nothing to do: give --bttr/--comer and --images to make the files, --check to compare")
    if args.check:
        check(args.out, args.check)


def make(args):
    install_stand_ins()
    images = read_images(args.images)
    captions = read_captions(args.captions or args.images.parent / "crohme-inkml.zip")
    args.out.mkdir(parents=True, exist_ok=True)
    refs = {}
    for model in args.models:
        reference, coverage = MODELS[model]
        clone = args.bttr if reference is BTTR else args.comer
        if reference["package"] not in refs:
            refs[reference["package"]] = import_reference(reference, clone)
        ref = refs[reference["package"]]
        inputs = reference_inputs(ref, images, captions)
        if args.from_checkpoints:
            checkpoint = load_checkpoint(args.from_checkpoints / f"{model}.ckpt")
        else:
            torch.save(fresh_checkpoint(ref, reference, coverage, inputs[2]), args.out / f"{model}.ckpt")
            checkpoint = load_checkpoint(args.out / f"{model}.ckpt")
            (args.out / f"{model}.full_keys.json").write_text(
                json.dumps(full_keys(ref, reference, model, coverage), indent=1))
            dictionary = ref.clone / reference["package"] / "datamodule" / "dictionary.txt"
            (args.out / f"{reference['package']}_dictionary.txt").write_bytes(dictionary.read_bytes())
        torch.save(golden(ref, reference, model, checkpoint, inputs, captions), args.out / f"{model}.golden.pt")
        print(f"{model}: written to {args.out}")


if __name__ == "__main__":
    main()
