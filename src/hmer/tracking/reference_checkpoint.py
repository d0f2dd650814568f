"""Published BTTR and CoMER checkpoints as project models: safe loading, config, weight mapping.

The checkpoints are PyTorch Lightning 1.x files of Green-Wood/BTTR (keys `bttr.*`) and
Green-Wood/CoMER (keys `comer_model.*`). Nothing in a file can run code: only Lightning's
`AttributeDict` (read as a `dict`) and inert stand-ins for its callback classes are allowed. The
checkpoint has no vocabulary: rows are permuted to the project's ids, so that the model ranks exactly
the reference's symbols. `hmer import` (`import_reference`) records one as a run that `hmer evaluate`
and `hmer predict` reload. See docs/fidelity.md, "`hmer import CHECKPOINT`".
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import torch
from torch import Tensor

from ..checkpoint import MODEL_FILE, model_artifact, save_model_file
from ..config import Config
from ..data.vocab import CROHME_SYMBOLS, SPECIALS, Vocab
from ..model.hmer_model import build_model
from ..model.posenc import sinusoid_table
from ..model_presets import preset_with_recipe
from . import keys
from .run import log_metrics, log_params, split_metrics
from .store import git_commit, open_experiment

REFERENCES = {
    "bttr": ("https://github.com/Green-Wood/BTTR", "bttr."),
    "comer": ("https://github.com/Green-Wood/CoMER", "comer_model."),
}

# Globals a Lightning 1.x checkpoint refers to, each read as something inert.
_ATTRIBUTE_DICT = "pytorch_lightning.utilities.parsing.AttributeDict"  # read as a dict: SETITEMS needs a real one
_LIGHTNING_CALLBACK_KEYS = (  # `callbacks` is keyed by the callback classes themselves
    "pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint",
    "pytorch_lightning.callbacks.lr_monitor.LearningRateMonitor",
    "pytorch_lightning.callbacks.early_stopping.EarlyStopping",
)


class ReferenceCheckpointError(ValueError):
    """A checkpoint that cannot be read or mapped; the message names the file and what is wrong."""


def _callback_stand_in(qualified: str) -> type:
    module, _, name = qualified.rpartition(".")
    return type(name, (), {"__module__": module, "__doc__": f"stand-in for {qualified} (a dict key only)"})


def load_lightning_checkpoint(path: str | Path) -> dict[str, Any]:
    """The checkpoint dict, loaded with `weights_only=True` and an allow-list (module doc)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such checkpoint file")
    allowed: list[Callable[..., Any] | tuple[Callable[..., Any], str]] = [
        (dict, _ATTRIBUTE_DICT), *((_callback_stand_in(name), name) for name in _LIGHTNING_CALLBACK_KEYS)]
    try:
        with torch.serialization.safe_globals(allowed):
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises UnpicklingError, RuntimeError, EOFError...
        found = re.search(r"(?:Unsupported global: GLOBAL|global) ([\w.]+)", str(exc))
        why = f"it refers to {found.group(1)}, which the safe loader does not accept" if found else \
            str(exc).strip().splitlines()[-1][:200]
        raise ReferenceCheckpointError(f"{path}: cannot be read safely as a Lightning checkpoint ({why})") from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), Mapping):
        raise ReferenceCheckpointError(f"{path}: not a Lightning checkpoint (no state_dict entry)")
    return ckpt


# ---- family, dictionary, config -----------------------------------------------------------------

def reference_dictionary(family: str) -> list[str]:
    """The symbols of the family's `dictionary.txt`, in order (ids 3, 4, ...)."""
    if family == "bttr":
        return list(CROHME_SYMBOLS)
    return sorted((set(CROHME_SYMBOLS) - {"'"}) | {"\\Pi"})


def reference_config(family: str, hp: Mapping[str, Any], vocab_size: int, path="checkpoint") -> Config:
    """The project Config computing the reference model of `hyper_parameters` `hp`, with its search."""
    needed = ("d_model", "growth_rate", "num_layers", "nhead", "num_decoder_layers", "dim_feedforward", "dropout")
    missing = [k for k in needed + (("dc",) if family == "comer" else ()) if k not in hp]
    if missing:
        raise ReferenceCheckpointError(f"{path}: hyper_parameters lack {', '.join(missing)}")
    if family == "comer":
        if hp.get("early_stopping", False):
            raise ReferenceCheckpointError(f"{path}: hyper_parameters early_stopping=True is not supported "
                                           "(the comer search rule is CoMER's early_stopping=False)")
        if float(hp.get("temperature", 1.0)) != 1.0:
            raise ReferenceCheckpointError(f"{path}: hyper_parameters temperature={hp['temperature']} "
                                           "is not supported (only 1.0)")
        cross, self_ = bool(hp.get("cross_coverage")), bool(hp.get("self_coverage"))
        if not (cross or self_):
            raise ReferenceCheckpointError(f"{path}: hyper_parameters have neither cross_coverage nor self_coverage")
    preset = "bttr" if family == "bttr" else f"comer-{'fusion' if cross and self_ else 'cross' if cross else 'self'}"
    values: dict[str, Any] = {
        "model.vocab_size": vocab_size, "model.d_model": hp["d_model"], "model.growth_rate": hp["growth_rate"],
        "model.num_dense_layers": hp["num_layers"], "model.num_dense_blocks": 3, "model.nhead": hp["nhead"],
        "model.num_decoder_layers": hp["num_decoder_layers"], "model.dim_feedforward": hp["dim_feedforward"],
        "model.dropout": hp["dropout"], "model.encoder_dropout": 0.2, "train.search_rule": family,
    }
    if family == "comer":
        values["model.coverage_channels"] = hp["dc"]
    else:  # BTTR decodes one image at a time; unmasked padding would change the features of a batch
        values["data.eval_max_batch_size"] = 1
    for ref_key, key in (("beam_size", "train.beam_size"), ("max_len", "train.max_decode_len"),
                         ("alpha", "train.length_penalty")):
        if ref_key in hp:
            values[key] = hp[ref_key]
    return preset_with_recipe(preset).override(values).validate()


# ---- weights ----------------------------------------------------------------------------------------

_DENSE = re.compile(r"encoder\.model\.dense(\d)\.(\d+)\.(conv1|bn1|conv2|bn2)\.(.+)")
_TRANS = re.compile(r"encoder\.model\.trans(\d)\.(conv1|bn1)\.(.+)")
_LAYER = re.compile(r"decoder\.model\.layers\.(\d+)\.(.+)")
_PLAIN = {  # reference key (prefix removed) -> project key, where only the name differs
    "encoder.model.conv1.weight": "encoder.stem_conv.weight",
    "encoder.feature_proj.0.weight": "feature_proj.weight", "encoder.feature_proj.0.bias": "feature_proj.bias",
    "encoder.feature_proj.weight": "feature_proj.weight", "encoder.feature_proj.bias": "feature_proj.bias",
    "encoder.norm.weight": "feature_norm.weight", "encoder.norm.bias": "feature_norm.bias",
    "decoder.word_embed.0.weight": "decoder.embed.table.weight",
    "decoder.word_embed.1.weight": "decoder.embed.embed_norm.weight",
    "decoder.word_embed.1.bias": "decoder.embed.embed_norm.bias",
    "decoder.norm.weight": "decoder.embed.out_norm.weight", "decoder.norm.bias": "decoder.embed.out_norm.bias",
    "decoder.proj.weight": "decoder.out.weight", "decoder.proj.bias": "decoder.out.bias",
    "decoder.model.arm.conv.weight": "decoder.arm.conv.weight", "decoder.model.arm.conv.bias": "decoder.arm.conv.bias",
    "decoder.model.arm.proj.weight": "decoder.arm.proj.weight",
}
_BN_PREFIXES = {"encoder.model.norm1.": "encoder.stem_norm.", "encoder.model.post_norm.": "encoder.final_norm.",
                "decoder.model.arm.post_norm.bn.": "decoder.arm.norm."}
_POSITION_TABLE = "decoder.pos_enc.pe"
_ROWS_BY_SYMBOL = ("decoder.embed.table.weight", "decoder.out.weight", "decoder.out.bias")


def project_keys(ref_key: str, value: Tensor) -> dict[str, Tensor] | None:
    """{project key: tensor} for one reference key (prefix removed); None if it has no counterpart.
    The fused attention projection `in_proj_*` ([q; k; v] rows) splits into `q_proj` / `kv_proj`."""
    if ref_key in _PLAIN:
        return {_PLAIN[ref_key]: value}
    for old, new in _BN_PREFIXES.items():
        if ref_key.startswith(old):
            rest = ref_key[len(old):]
            if new == "decoder.arm.norm." and rest == "num_batches_tracked":
                return {}  # the masked norm keeps no count (fixed momentum, as CoMER's BatchNorm1d)
            return {new + rest: value}
    if m := _DENSE.fullmatch(ref_key):
        block, layer, part, rest = m.groups()
        part = {"bn1": "norm1", "bn2": "norm2"}.get(part, part)
        return {f"encoder.blocks.{int(block) - 1}.layers.{layer}.{part}.{rest}": value}
    if m := _TRANS.fullmatch(ref_key):
        trans, part, rest = m.groups()
        return {f"encoder.transitions.{int(trans) - 1}.{'conv' if part == 'conv1' else 'norm'}.{rest}": value}
    if m := _LAYER.fullmatch(ref_key):
        layer, rest = m.groups()
        rest = rest.replace("multihead_attn.", "cross_attn.", 1)
        head, _, kind = rest.rpartition(".in_proj_")
        if kind in ("weight", "bias"):
            d = value.shape[0] // 3
            return {f"decoder.layers.{layer}.{head}.q_proj.{kind}": value[:d],
                    f"decoder.layers.{layer}.{head}.kv_proj.{kind}": value[d:]}
        return {f"decoder.layers.{layer}.{rest}": value}
    return None


@dataclass
class VocabularyMapping:
    """How the reference's ids become project ids (module doc)."""

    vocab: Vocab  # of the imported model
    source_rows: list[Optional[int]]  # per imported id: the reference id, or None (never predicted)
    reference_only: list[str]  # appended symbols
    project_only: list[str]  # symbols the model never predicts

    @classmethod
    def build(cls, reference_symbols: Sequence[str]) -> "VocabularyMapping":
        ref_ids = {s: i for i, s in enumerate(list(SPECIALS) + list(reference_symbols))}
        reference_only = [s for s in reference_symbols if s not in set(CROHME_SYMBOLS)]
        vocab = Vocab(list(CROHME_SYMBOLS) + reference_only)
        rows = [ref_ids.get(s) for s in vocab.itos]
        return cls(vocab, rows, reference_only, [s for s in CROHME_SYMBOLS if s not in ref_ids])

    def permute(self, key: str, value: Tensor) -> Tensor:
        """Rows of the embedding / output projection in the imported vocabulary's order."""
        out = value.new_zeros((len(self.source_rows), *value.shape[1:]))
        for new, old in enumerate(self.source_rows):
            if old is not None:
                out[new] = value[old]
            elif key.endswith("out.bias"):
                out[new] = float("-inf")  # a symbol the reference cannot output
        return out


def map_state_dict(state_dict: Mapping[str, Tensor], prefix: str, mapping: VocabularyMapping,
                   expected: Mapping[str, Tensor], path="checkpoint") -> dict[str, Tensor]:
    """The project state dict; the error lists every key without a counterpart, or shape that differs."""
    out: dict[str, Tensor] = {}
    unmapped: list[str] = []
    for key, value in state_dict.items():
        if not key.startswith(prefix):
            unmapped.append(key)
            continue
        ref_key = key[len(prefix):]
        if ref_key == _POSITION_TABLE:  # fixed sinusoids: the project recomputes them
            if not torch.allclose(value.float(), sinusoid_table(value.shape[0], value.shape[1]), atol=1e-4):
                raise ReferenceCheckpointError(f"{path}: decoder.pos_enc.pe is not the standard sinusoid table")
            continue
        mapped = project_keys(ref_key, value)
        if mapped is None:
            unmapped.append(key)
            continue
        for new_key, tensor in mapped.items():
            out[new_key] = mapping.permute(new_key, tensor) if new_key in _ROWS_BY_SYMBOL else tensor
    if unmapped:
        raise ReferenceCheckpointError(f"{path}: {len(unmapped)} keys have no counterpart in the project model: "
                                       + ", ".join(unmapped))
    missing = [k for k in expected if k not in out]
    extra = [k for k in out if k not in expected]
    wrong = [f"{k} {tuple(out[k].shape)} vs {tuple(v.shape)}" for k, v in expected.items()
             if k in out and out[k].shape != v.shape]
    if missing or extra or wrong:
        parts = [f"missing {', '.join(missing)}" if missing else "", f"unexpected {', '.join(extra)}" if extra else "",
                 f"shapes differ: {'; '.join(wrong)}" if wrong else ""]
        raise ReferenceCheckpointError(f"{path}: the weights do not fit the project model ("
                                       + "; ".join(p for p in parts if p) + ")")
    return out


# ---- everything together ------------------------------------------------------------------------------

@dataclass
class ReferenceModel:
    path: Path
    family: str  # bttr | comer
    preset: str  # bttr | comer-self | comer-cross | comer-fusion
    config: Config
    vocab: Vocab
    mapping: VocabularyMapping
    model: torch.nn.Module
    hyper_parameters: dict[str, Any]
    lightning_version: str
    epoch: int
    global_step: int


def read_reference_checkpoint(path: str | Path, dictionary: str | Path | None = None) -> ReferenceModel:
    """Load a BTTR / CoMER Lightning checkpoint safely and rebuild it as a project model (eval mode)."""
    path = Path(path)
    ckpt = load_lightning_checkpoint(path)
    state = ckpt["state_dict"]
    # the family, from the keys' Lightning prefix
    family = next((name for name, (_, prefix) in REFERENCES.items() if any(k.startswith(prefix) for k in state)), None)
    if family is None:
        raise ReferenceCheckpointError(f"{path}: neither a BTTR (bttr.*) nor a CoMER (comer_model.*) checkpoint; "
                                       f"keys start {', '.join(list(state)[:3])}")
    _, prefix = REFERENCES[family]
    symbols = reference_dictionary(family)
    if dictionary:
        symbols = [line.strip() for line in Path(dictionary).read_text().splitlines() if line.strip()]
        dupes = sorted({s for s in symbols if symbols.count(s) > 1})
        if dupes:
            raise ReferenceCheckpointError(f"{dictionary}: repeated symbols {' '.join(dupes)}")
    rows = state.get(prefix + "decoder.proj.bias")
    if rows is None:
        raise ReferenceCheckpointError(f"{path}: no {prefix}decoder.proj.bias (the output layer)")
    if rows.shape[0] != len(symbols) + len(SPECIALS):
        raise ReferenceCheckpointError(
            f"{path}: the output layer has {rows.shape[0]} rows, the {family} dictionary "
            f"{len(symbols)} symbols + {len(SPECIALS)} specials; give the checkpoint's dictionary.txt")
    mapping = VocabularyMapping.build(symbols)
    hp = dict(ckpt.get("hyper_parameters") or {})
    cfg = reference_config(family, hp, len(mapping.vocab), path)
    with torch.device("meta"):
        shapes = build_model(cfg.model).state_dict()
    weights = map_state_dict(state, prefix, mapping, shapes, path)
    model = build_model(cfg.model)
    model.load_state_dict(weights, strict=True)
    model.eval()
    return ReferenceModel(path, family, cfg.name, cfg, mapping.vocab, mapping, model, hp,
                          str(ckpt.get("pytorch-lightning_version", "")), int(ckpt.get("epoch", -1)),
                          int(ckpt.get("global_step", -1)))


@dataclass
class ImportResult:
    run_id: str
    reference: ReferenceModel
    registered: Optional[str]  # "name/version", or None
    scores: dict  # year -> Scores, for the years scored at import


def import_reference(checkpoint: str | Path, *, tracking_uri: str | None = None, experiment: str = "hmer",
                     run_name: str | None = None, dictionary: str | Path | None = None,
                     register_as: str | None = "", data: str | None = None, years: Sequence[str] = (),
                     limit: int = 0, device: str = "cpu") -> ImportResult:
    """Record `checkpoint` as a run (module doc). register_as: "" = `<preset>-reference`, None = not."""
    ref = read_reference_checkpoint(checkpoint, dictionary)
    cfg = ref.config
    client, experiment_id = open_experiment(tracking_uri, experiment)
    repo, _ = REFERENCES[ref.family]
    tags = {
        keys.VARIANT: f"{cfg.name} (reference)",
        keys.STATUS: "running",
        keys.GIT_COMMIT: git_commit(),
        keys.IMPORT_SOURCE: str(Path(checkpoint).resolve()),
        keys.IMPORT_REFERENCE: repo,
        keys.IMPORT_LIGHTNING_VERSION: ref.lightning_version,
        keys.IMPORT_EPOCH: str(ref.epoch),
        keys.IMPORT_HYPER_PARAMETERS: json.dumps(ref.hyper_parameters, sort_keys=True, default=str)[:5000],
        keys.IMPORT_REFERENCE_ONLY_SYMBOLS: " ".join(ref.mapping.reference_only),
        keys.IMPORT_NEVER_PREDICTED_SYMBOLS: " ".join(ref.mapping.project_only),
    }
    run = client.create_run(experiment_id, run_name=run_name or f"{cfg.name}-reference", tags=tags)
    run_id = run.info.run_id
    status = "FAILED"
    try:
        num_params = sum(p.numel() for p in ref.model.parameters())
        log_params(client, run_id, {**cfg.to_flat_dict(), "num_params": num_params})
        client.log_text(run_id, json.dumps(cfg.to_dict(), indent=2, sort_keys=True), "config.json")
        artifact = model_artifact(ref.model, cfg, ref.vocab, ref.epoch, -1.0)
        with tempfile.TemporaryDirectory() as tmp:
            save_model_file(artifact, Path(tmp) / "model" / MODEL_FILE)
            client.log_artifacts(run_id, str(Path(tmp) / "model"), "model")
        scores = _score_years(client, run_id, ref, data, years, limit, device) if years else {}
        registered = None
        if register_as is not None:
            name = register_as or f"{cfg.name}-reference"
            registered = _register(client, name, run_id)
            client.set_tag(run_id, keys.REGISTERED_MODEL, registered)
        client.set_tag(run_id, keys.STATUS, "finished")
        status = "FINISHED"
        return ImportResult(run_id, ref, registered, scores)
    finally:
        client.set_terminated(run_id, status=status)


def _register(client, name: str, run_id: str) -> str:
    """A new version of registered model `name` from the run's `model/` folder (not an MLflow flavour,
    which `mlflow.register_model` would want)."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(name, description="imported with `hmer import`; reload with "
                                                         "`hmer evaluate RUN` / `hmer predict RUN`")
    source = f"{client.get_run(run_id).info.artifact_uri}/model"
    version = client.create_model_version(name, source, run_id=run_id)
    return f"{name}/{version.version}"


def _score_years(client, run_id: str, ref: ReferenceModel, data: str | None, years: Sequence[str], limit: int,
                 device: str) -> dict:
    """Decode and score the test years as training's final evaluation does, logged the same way."""
    import time

    from ..data import load_dataset
    from ..device import autocast_dtype, resolve_device
    from ..evaluation.evaluate import decode_options, evaluate_split
    from .artifacts import log_test_predictions

    cfg = ref.config
    dev = resolve_device(device)
    model = ref.model.to(dev)
    cfg.data.test_limit = limit
    splits = load_dataset(data or cfg.data.path or None, cfg.data, splits=tuple(years))
    metrics: dict[str, float] = {}
    results = {}
    for year in years:
        t0 = time.monotonic()
        results[year] = evaluate_split(model, splits[year], ref.vocab,
                                       **decode_options(cfg, dev, autocast_dtype(cfg.train.precision, dev)))
        metrics.update(split_metrics(f"test_{year}", results[year], time.monotonic() - t0))
    log_test_predictions(client, run_id, results)
    log_metrics(client, run_id, metrics, step=0)
    return {year: res.scores for year, res in results.items()}
