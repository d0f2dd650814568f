"""`bttr` and `comer-*` against the golden outputs of the reference code (../shared/peers).

Every golden checkpoint is imported with `hmer.tracking.reference_checkpoint` and run by the
project: encoder features (one image, and the padded batch), teacher-forced L2R and R2L logits,
and the beam searches under the matching search rule, hypothesis for hypothesis and score for
score. The full-size key manifests must map onto the `bttr` and `comer-fusion` presets exactly.
Golden token ids are the reference's; they are compared as symbols.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path

import pytest
import torch

from conftest import peers_or_skip
from hmer.decoding.reference_search import reference_decode
from hmer.data.vocab import Vocab
from hmer.model import build_model
from hmer.model.hmer_model import count_parameters
from hmer.model.accelerations import accelerate, use_matmul
from hmer.model.posenc import sinusoid_table
from hmer.model_presets import preset_config
from hmer.tracking.reference_checkpoint import (
    REFERENCES,
    ReferenceCheckpointError,
    VocabularyMapping,
    load_lightning_checkpoint,
    map_state_dict,
    read_reference_checkpoint,
    reference_config,
    reference_dictionary,
)

GOLDEN = ("bttr", "comer_fusion", "comer_self", "comer_cross")
TOL = 1e-4


@pytest.fixture(scope="module")
def peers() -> Path:
    return peers_or_skip()


@pytest.fixture(scope="module", params=GOLDEN)
def golden(request, peers):
    """(imported ReferenceModel, golden dict, reference id -> project id tensor)."""
    torch.set_num_threads(1)
    ref = read_reference_checkpoint(peers / f"{request.param}.ckpt")
    gold = torch.load(peers / f"{request.param}.golden.pt", weights_only=True)
    to_project = torch.tensor([ref.vocab.stoi[s] for s in gold["vocab"]])
    return ref, gold, to_project


def _no_pad(image: torch.Tensor) -> torch.Tensor:
    return torch.zeros(1, *image.shape[1:], dtype=torch.bool)


def test_the_golden_files_are_the_ones_described(golden):
    ref, gold, _ = golden
    assert gold["reference_commit"] in ("43cabd4", "ee15cdb")
    assert ref.preset == {"bttr": "bttr", "comer_fusion": "comer-fusion", "comer_self": "comer-self",
                          "comer_cross": "comer-cross"}[gold["model"]]
    assert ref.config.train.search_rule == ref.family
    # The imported model is the one the golden set's own hyper_parameters describe, whatever its size.
    hp, model = gold["hyper_parameters"], ref.config.model
    assert (model.d_model, model.growth_rate, model.num_dense_layers, model.nhead, model.num_decoder_layers,
            model.dim_feedforward) == (hp["d_model"], hp["growth_rate"], hp["num_layers"], hp["nhead"],
                                       hp["num_decoder_layers"], hp["dim_feedforward"])
    assert ref.config.train.beam_size == hp["beam_size"] == gold["beam"]["beam_size"]


@torch.no_grad()
def test_encoder_features_single_and_padded_batch(golden):
    ref, gold, _ = golden
    for image, expected in zip(gold["inputs"]["images"], gold["encoder"]["single"]):
        feats, _ = ref.model.encode(image[None], _no_pad(image))
        assert (feats.reshape(expected["feature"].shape) - expected["feature"]).abs().max() < TOL
    # The padded batch agrees only because the presets do not mask padding, as the references.
    assert ref.config.model.mask_padding is False
    feats, mask = ref.model.encode(gold["inputs"]["batch_images"], gold["inputs"]["batch_mask"])
    expected = gold["encoder"]["batch"]
    assert (feats.reshape(expected["feature"].shape) - expected["feature"]).abs().max() < TOL
    assert torch.equal(mask.reshape(expected["mask"].shape), expected["mask"])


@torch.no_grad()
def test_teacher_forced_l2r_and_r2l_logits(golden):
    ref, gold, to_project = golden
    cases = [(img[None], _no_pad(img), tf) for img, tf in zip(gold["inputs"]["images"],
                                                                gold["teacher_forcing"]["single"])]
    cases.append((gold["inputs"]["batch_images"], gold["inputs"]["batch_mask"], gold["teacher_forcing"]["batch"]))
    for images, mask, tf in cases:
        tgt = to_project[tf["tgt"]]
        logits = ref.model(images, mask, tgt, tf["tgt"] == 0)[..., to_project]  # rows: l2r block, r2l block
        assert logits.shape == tf["logits"].shape
        assert (logits - tf["logits"]).abs().max() < TOL


@torch.no_grad()
def test_the_accelerations_match_the_golden_outputs_too(golden):
    # what training switches on (hmer.model.accelerations), in evaluation: the l2r and r2l rows of an
    # image as one block of queries, and with train.conv1x1_as_matmul the same parameters computed
    # through F.linear
    ref, gold, to_project = golden
    accelerate(ref.model, torch.device("cpu"), conv1x1_as_matmul=True)
    assert ref.model.groups_directions and use_matmul(ref.model, True) > 0
    try:
        feats, _ = ref.model.encode(gold["inputs"]["batch_images"], gold["inputs"]["batch_mask"])
        expected = gold["encoder"]["batch"]["feature"]
        assert (feats.reshape(expected.shape) - expected).abs().max() < TOL
        tf = gold["teacher_forcing"]["batch"]
        logits = ref.model(gold["inputs"]["batch_images"], gold["inputs"]["batch_mask"], to_project[tf["tgt"]],
                           tf["tgt"] == 0)[..., to_project]
        assert (logits - tf["logits"]).abs().max() < TOL
    finally:
        accelerate(ref.model, None)


def _symbols(ref, ids):
    return [ref.vocab.itos[i] for i in ids]


def test_beam_search_hypotheses_and_scores_under_the_reference_rule(golden):
    ref, gold, _ = golden
    beam = gold["beam"]
    model, rule = ref.model, ref.config.train.search_rule
    kwargs = dict(rule=rule, direction="bi", sos_id=1, eos_id=2, beam_size=beam["beam_size"], max_len=beam["max_len"],
                  alpha=beam["alpha"])
    with torch.no_grad():
        runs = {"single": [reference_decode(model, *model.encode(img[None], _no_pad(img)), **kwargs)[0]
                           for img in gold["inputs"]["images"]]}
        if "batch" in beam:  # CoMER decodes the padded batch in one call
            runs["batch"] = reference_decode(model, *model.encode(gold["inputs"]["batch_images"],
                                                                  gold["inputs"]["batch_mask"]), **kwargs)
    for mode, results in runs.items():
        for result, expected in zip(results, beam[mode]):
            for side in ("l2r", "r2l"):
                ours = getattr(result, side)
                assert [_symbols(ref, h.tokens) for h in ours] == [h["tokens"] for h in expected[side]]
                for h, e in zip(ours, expected[side]):
                    assert abs(h.score - e["score"]) < TOL
                    if rule == "comer":
                        assert abs(h.rev_score - e["rev_score"]) < TOL
                        assert abs(h.total - e["total_score"]) < TOL
            if rule == "bttr":
                for h, e in zip(result.l2r + result.r2l, expected["joint"]):
                    assert abs(h.score + h.rev_score - e["final_score"]) < TOL
                    assert abs(h.total - e["normalized_score"]) < TOL
                assert result.best_index == expected["best"]["index"]
            assert _symbols(ref, result.best.tokens) == expected["best"]["tokens"]
            assert abs(result.best.total - expected["best"]["score"]) < TOL


# ---- the full-size key manifests --------------------------------------------------------------------

@pytest.mark.parametrize("manifest, preset", [("bttr", "bttr"), ("comer_fusion", "comer-fusion")])
def test_full_size_keys_map_onto_the_preset_completely(peers, manifest, preset):
    spec = json.loads((peers / f"{manifest}.full_keys.json").read_text())
    family = "bttr" if manifest == "bttr" else "comer"
    prefix = REFERENCES[family][1]
    assert spec["prefix"] == prefix
    # The reference's full-size model is the preset, parameter for parameter.
    assert count_parameters(build_model(preset)) == spec["num_parameters"]
    mapping = VocabularyMapping.build(reference_dictionary(family))
    cfg = reference_config(family, spec["hyper_parameters"], len(mapping.vocab))
    assert cfg.model == dataclasses.replace(preset_config(preset), vocab_size=len(mapping.vocab))
    state = {}
    for entry in spec["state_dict"]:
        dtype = getattr(torch, entry["dtype"].removeprefix("torch."))
        state[entry["key"]] = torch.zeros(entry["shape"], dtype=dtype)
    state[prefix + "decoder.pos_enc.pe"] = sinusoid_table(*state[prefix + "decoder.pos_enc.pe"].shape)
    assert len(state) == spec["num_state_dict_entries"]
    with torch.device("meta"):
        expected = build_model(cfg.model).state_dict()
    mapped = map_state_dict(state, prefix, mapping, expected)  # raises on any missing/extra key or shape
    assert set(mapped) == set(expected)


# ---- safe loading, clear errors ---------------------------------------------------------------------

def test_checkpoints_load_only_with_the_allow_list(peers):
    with pytest.raises(pickle.UnpicklingError):
        torch.load(peers / "bttr.ckpt", weights_only=True)  # Lightning's AttributeDict
    ckpt = load_lightning_checkpoint(peers / "bttr.ckpt")
    gold = torch.load(peers / "bttr.golden.pt", weights_only=True)  # its generator copied them there
    assert type(ckpt["hyper_parameters"]) is dict and ckpt["hyper_parameters"] == gold["hyper_parameters"]


def test_a_foreign_global_is_refused_by_name(tmp_path):
    import datetime

    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "when": datetime.date(2020, 1, 1)}, path)
    with pytest.raises(ReferenceCheckpointError, match="datetime.date"):
        load_lightning_checkpoint(path)


def test_unmapped_keys_and_unknown_families_are_listed(peers):
    ckpt = load_lightning_checkpoint(peers / "comer_self.ckpt")
    state = dict(ckpt["state_dict"])
    state["comer_model.decoder.extra.weight"] = torch.zeros(2)
    mapping = VocabularyMapping.build(reference_dictionary("comer"))
    cfg = reference_config("comer", ckpt["hyper_parameters"], len(mapping.vocab))
    with torch.device("meta"):
        expected = build_model(cfg.model).state_dict()
    with pytest.raises(ReferenceCheckpointError, match=r"comer_model\.decoder\.extra\.weight"):
        map_state_dict(state, "comer_model.", mapping, expected)
    del state["comer_model.decoder.extra.weight"], state["comer_model.decoder.proj.bias"]
    with pytest.raises(ReferenceCheckpointError, match=r"missing decoder\.out\.bias"):
        map_state_dict(state, "comer_model.", mapping, expected)


def test_comer_vocabulary_is_permuted_by_symbol(peers):
    ref = read_reference_checkpoint(peers / "comer_fusion.ckpt")
    comer_symbols = [line.strip() for line in (peers / "comer_dictionary.txt").read_text().splitlines() if line.strip()]
    project_symbols = Vocab().itos[3:]
    reference_only = [s for s in comer_symbols if s not in project_symbols]  # CoMER's \\Pi
    project_only = [s for s in project_symbols if s not in comer_symbols]  # the project's '
    assert reference_only and project_only
    assert ref.mapping.reference_only == reference_only and ref.mapping.project_only == project_only
    ckpt = load_lightning_checkpoint(peers / "comer_fusion.ckpt")
    gold = torch.load(peers / "comer_fusion.golden.pt", weights_only=True)
    comer_ids = {s: i for i, s in enumerate(gold["vocab"])}  # the reference's id of each symbol
    out = ref.model.decoder.out
    for symbol in ("x", "\\frac", *reference_only):
        assert torch.equal(out.weight[ref.vocab.stoi[symbol]],
                           ckpt["state_dict"]["comer_model.decoder.proj.weight"][comer_ids[symbol]])
    for symbol in project_only:  # never predicted, as the reference cannot
        assert out.bias[ref.vocab.stoi[symbol]] == float("-inf")


def test_a_wrong_dictionary_is_one_clear_error(peers, tmp_path):
    short = tmp_path / "dictionary.txt"
    short.write_text("a\nb\n")
    with pytest.raises(ReferenceCheckpointError, match="2 symbols"):
        read_reference_checkpoint(peers / "bttr.ckpt", dictionary=short)
