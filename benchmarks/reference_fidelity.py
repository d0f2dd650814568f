"""How closely the `bttr` / `comer-*` presets reproduce the reference code: the numbers of the README's
"Fidelity" section.

    OMP_NUM_THREADS=1 python benchmarks/reference_fidelity.py [--peers ../shared/peers]

For every golden model in the peers folder (see its README.md): the checkpoint imported as
`hmer import` does, then the maximum absolute difference to the reference's own outputs of
the encoder features (each image alone, and the padded batch), the teacher-forced logits (both
directions), and the beam-search scores under the matching search rule, and whether every
hypothesis's tokens are the same. With --ablate, also the padded-batch features of the same
weights with `model.mask_padding=True` (the project's masking), which is a different function.
The test that asserts the same agreement: tests/test_reference_fidelity.py.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch

from hmer.decoding.reference_search import reference_decode
from hmer.model import build_model
from hmer.tracking.reference_checkpoint import read_reference_checkpoint

GOLDEN = ("bttr", "comer_fusion", "comer_self", "comer_cross")


def _no_pad(image):
    return torch.zeros(1, *image.shape[1:], dtype=torch.bool)


@torch.no_grad()
def measure(peers: Path, name: str, ablate: bool) -> dict[str, object]:
    ref = read_reference_checkpoint(peers / f"{name}.ckpt")
    gold = torch.load(peers / f"{name}.golden.pt", weights_only=True)
    model, inputs = ref.model, gold["inputs"]
    to_project = torch.tensor([ref.vocab.stoi[s] for s in gold["vocab"]])
    row: dict[str, object] = {"model": name}

    def diff(a, b):
        return float((a.reshape(b.shape) - b).abs().max())

    row["features (single)"] = max(diff(model.encode(img[None], _no_pad(img))[0], e["feature"])
                                   for img, e in zip(inputs["images"], gold["encoder"]["single"]))
    row["features (batch)"] = diff(model.encode(inputs["batch_images"], inputs["batch_mask"])[0],
                                   gold["encoder"]["batch"]["feature"])
    if ablate:
        masked = build_model(dataclasses.replace(ref.config.model, mask_padding=True)).eval()
        masked.load_state_dict(model.state_dict())
        ours = masked.encode(inputs["batch_images"], inputs["batch_mask"])[0]
        expected = gold["encoder"]["batch"]
        valid = ~expected["mask"]  # compared where there is image: the masked model zeroes padding
        row["features (batch, mask_padding=True, unpadded positions)"] = float(
            (ours.reshape(expected["feature"].shape) - expected["feature"]).abs()[valid].max())
    logits = []
    cases = [(img[None], _no_pad(img), tf) for img, tf in zip(inputs["images"], gold["teacher_forcing"]["single"])]
    cases.append((inputs["batch_images"], inputs["batch_mask"], gold["teacher_forcing"]["batch"]))
    for images, mask, tf in cases:
        out = model(images, mask, to_project[tf["tgt"]], tf["tgt"] == 0)[..., to_project]
        logits.append(diff(out, tf["logits"]))
    row["logits l2r+r2l"] = max(logits)

    beam, rule = gold["beam"], ref.config.train.search_rule
    kwargs = dict(rule=rule, direction="bi", sos_id=1, eos_id=2, beam_size=beam["beam_size"],
                  max_len=beam["max_len"], alpha=beam["alpha"])
    runs = [(reference_decode(model, *model.encode(img[None], _no_pad(img)), **kwargs)[0], e)
            for img, e in zip(inputs["images"], beam["single"])]
    if "batch" in beam:
        results = reference_decode(model, *model.encode(inputs["batch_images"], inputs["batch_mask"]), **kwargs)
        runs += list(zip(results, beam["batch"]))
    worst, same, count = 0.0, True, 0
    for result, expected in runs:
        for side in ("l2r", "r2l"):
            for h, e in zip(getattr(result, side), expected[side]):
                same &= [ref.vocab.itos[i] for i in h.tokens] == e["tokens"]
                worst = max(worst, abs(h.score - e["score"]))
                if rule == "comer":
                    worst = max(worst, abs(h.rev_score - e["rev_score"]), abs(h.total - e["total_score"]))
                count += 1
            same &= len(getattr(result, side)) == len(expected[side])
        if rule == "bttr":
            for h, e in zip(result.l2r + result.r2l, expected["joint"]):
                worst = max(worst, abs(h.score + h.rev_score - e["final_score"]), abs(h.total - e["normalized_score"]))
        same &= [ref.vocab.itos[i] for i in result.best.tokens] == expected["best"]["tokens"]
        worst = max(worst, abs(result.best.total - expected["best"]["score"]))
    row[f"beam scores ({rule} rule)"] = worst
    row["hypotheses"] = f"{count} {'identical' if same else 'DIFFERENT'}"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", default=str(Path(__file__).resolve().parents[2] / "shared" / "peers"))
    parser.add_argument("--ablate", action="store_true", help="also the batch features with mask_padding=True")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name in GOLDEN:
        row = measure(Path(args.peers), name, args.ablate)
        print("  ".join(f"{k}: {v:.1e}" if isinstance(v, float) else f"{k}: {v}" for k, v in row.items()), flush=True)


if __name__ == "__main__":
    main()
