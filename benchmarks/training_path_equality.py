"""Does a study's own training path compute the same at two commits? The fingerprint's training
(`hmer.training.fingerprint_training`) with the study's settings in place of the fingerprint's parts,
by the code on PYTHONPATH; prints its losses and weights' hash as JSON, to compare between commits.

    for tree in /work/wt-frontier /work/main; do
        ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=SSE41 OMP_NUM_THREADS=1 \
            PYTHONPATH=$tree/src python benchmarks/training_path_equality.py frontier > /tmp/$(basename $tree).json
    done; cmp /tmp/wt-frontier.json /tmp/main.json

Why: the fingerprint (`hmer runs show`) trains each decoder family on the `swept` recipe, not the
frontier's schedule with its decay and weight average nor CAN's counting module, so a study that
continues across a refactor first measures its own path this way. The portable kernels are the
fingerprint's (its module docstring), so that the answer is the code's and not the CPU's.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings

FUSION_BI = {"model.decoder": "transformer", "model.direction": "bi", "model.coverage": "fusion",
             "model.embed_norm": True}
PATHS = {
    # the frontier's cells: wsd with a decay branch, with and without the weight average
    "frontier": {"wsd": {**FUSION_BI, "train.schedule": "wsd", "train.decay_epochs": 1, "train.epochs": 3},
                 "wsd-ema": {**FUSION_BI, "train.schedule": "wsd", "train.decay_epochs": 1, "train.epochs": 3,
                             "train.ema_decay": 0.9}},
    # the counting study's cells: each decoder with CAN's counting module
    "counting": {"rnn": {"model.decoder": "rnn", "model.direction": "l2r", "model.counting": True,
                         "model.counting_channels": 8},
                 "transformer-bi": {"model.decoder": "transformer", "model.direction": "bi", "model.coverage": "none",
                                    "model.counting": True, "model.counting_channels": 8}},
}


def main() -> None:
    if len(sys.argv) != 2 or sys.argv[1] not in PATHS:
        sys.exit(f"usage: python {sys.argv[0]} {{{','.join(PATHS)}}}")
    import hmer.training.fingerprint_training as training

    training.PARTS = PATHS[sys.argv[1]]
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    with open(os.devnull, "w") as quiet:  # train() prints its epochs; the answer is the last line
        stdout, sys.stdout = sys.stdout, quiet
        try:
            measured = training._measure()
        finally:
            sys.stdout = stdout
    print(json.dumps(measured, sort_keys=True))


if __name__ == "__main__":
    main()
