"""The committed runs that trained otherwise than today's layers build their config, and why.

Every committed run's stored config (`config.json`) is rebuilt through today's layers from what the
store records about it (hmer.store.provenance; `tests/test_config_replay.py` holds the whole store
to it). Where a run trained otherwise, the key, the runs and the reason are written down here, and
nowhere else: `hmer runs show RUN` prints them beside the run's config, and the test holds that
exactly these keys differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The `cpu` budget before c13ce17 (issue 24): the tiny presets at small's widths with the pilots'
# AdamW-cosine recipe, 64 px, 4 epochs. Studies begun under it train under their stored base config.
BEGUN_UNDER_ANOTHER_BUDGET = {
    "sweep-cpu": "the cpu budget before c13ce17",
    "ablate_direction-cpu-4ep": "the cpu budget before c13ce17 (superseded by ablate_direction-cpu)",
}

# The --set a committed study's command gave (the store records the resulting base config, not the
# command): study -> {key: value}. The long direction study sets CoMER's embedding norm, so that its
# bi cell is the long coverage study's none cell, trained once (README, "The long budget").
STUDY_SETS: dict[str, dict[str, object]] = {
    "ablate_direction-long": {"model.embed_norm": True},
}

# The grid cells that trained otherwise than today's layers give them: (study, variant) -> {key: why}.
CELLS_CHANGED_SINCE: dict[tuple[str, str], dict[str, str]] = {
    # ConvS2S's attention was Gehring's until ffdbb27, which brought `scaled` with model.decoder=convs2s
    # (hmer.model.convs2s); the study is kept under this name for it, its convs2s cells superseded
    ("ablate_decoder-cpu-gehring", "convs2s"): {"model.conv_attention": "gehring before ffdbb27"},
    # The long direction study's bi cell is the long coverage study's none cell, copied (hmer.studies.reuse):
    # the same model, trained once, under the name of the preset that built it there
    ("ablate_direction-long", "bi"): {"name": "copied from ablate_coverage-long's none cell (run d9873c59), "
                                              "built there as preset tiny-comer: with model.embed_norm=true "
                                              "(STUDY_SETS) tiny is the same model"},
}
# The defaults that changed since the oldest runs of `hmer train`: key -> why.
BEFORE_ISSUE_24 = {"train.channels_last": "False by default until 246d93c (issue 24): the encoder ran channels-first"}
BEFORE_THE_HOLD_OUT_RULE = {**BEFORE_ISSUE_24, "data.val_min_edits": (
    "the key did not exist before 8fb14e1: validation kept out only exact twins of a training caption (its "
    "value before, 1); the default has been 2 since")}

# The pilots' AdamW-cosine recipe, given with --set (docs/cpu_protocol.md, "The pilot")
_ADAMW_COSINE = ("train.recipe", "train.optimizer", "train.lr", "train.weight_decay", "train.eps",
                 "train.warmup_steps", "train.schedule", "train.min_lr")
# Sweep trial 16's drawn values (docs/cpu_protocol.md, "From the sweep to the budget")
_TRIAL_16 = ("train.lr", "train.warmup_steps", "train.label_smoothing", "model.dropout", "model.encoder_dropout",
             "data.max_batch_size", "data.batch_pixels", "data.aug_share", "model.growth_rate", "model.d_model",
             "model.dim_feedforward", "model.num_decoder_layers")


@dataclass(frozen=True)
class Command:
    """`hmer train --preset P [--budget B] --set KEY=... ...`, the command that trains a run's config
    today: the keys its --set gives (their values are the run's own; a run made before the `cpu`
    budget existed gave that budget's keys one by one), and the keys whose default has changed since
    the run trained."""

    budget: str | None
    set_keys: tuple[str, ...]
    changed: dict[str, str] = field(default_factory=dict)
    where: str = ""  # where the command is written down


# Every committed `hmer train` run, by id.
TRAIN_COMMANDS: dict[str, Command] = {
    # cpu-pilot, at bdc5f49: 5 epochs with the BTTR recipe (stopped while decoding) and with AdamW cosine
    "32d2a680a11e4982a8aa85d891fc295f": Command(
        None, ("data.render_height", "train.epochs", "data.test_years", "data.test_limit"),
        BEFORE_THE_HOLD_OUT_RULE, "docs/cpu_protocol.md, The pilot"),
    "27bc34392cf64d5dbbf9ecab69c5dca0": Command(
        None, ("data.render_height", "train.epochs", "data.test_years", "data.test_limit",
               *(k for k in _ADAMW_COSINE if k != "train.recipe")),
        BEFORE_THE_HOLD_OUT_RULE, "docs/cpu_protocol.md, The pilot"),
    # cpu-protocol, at d4d19dc: tiny 16 epochs, small 8 epochs, tiny on the old random split
    "9d118b309c874c2d8c461508761340b6": Command(
        None, ("data.render_height", "train.epochs", "train.device", *_ADAMW_COSINE),
        BEFORE_THE_HOLD_OUT_RULE, "docs/cpu_protocol.md, The pilot"),
    "aa801a81a3c5419dba07474d275776c0": Command(
        None, ("data.render_height", "train.epochs", "train.device", *_ADAMW_COSINE),
        BEFORE_THE_HOLD_OUT_RULE, "docs/cpu_protocol.md, The pilot"),
    "f155019ea1404734adbd109524e1da41": Command(
        None, ("data.render_height", "train.epochs", "train.device", "data.val_split", *_ADAMW_COSINE),
        BEFORE_THE_HOLD_OUT_RULE, "docs/cpu_protocol.md, The pilot"),
    # cpu-best, at 2880448: small, the same recipe, 24 epochs
    "7ef3f75865114ed5848ddc270842bf0d": Command(
        None, ("data.render_height", "train.epochs", *_ADAMW_COSINE), BEFORE_ISSUE_24,
        "docs/cpu_protocol.md, The recipe at 22 epochs"),
    # cpu-budget-pilot, at f711c04: sweep trial 16's recipe for 24 epochs, with its constant rate and with cosine
    "dd933152ad084231a2504a194d0574ed": Command(
        "cpu", (*_TRIAL_16, "train.epochs", "train.seed", "train.schedule"), {},
        "docs/cpu_protocol.md, From the sweep to the budget"),
    "2042cd99b6914f59888b3d16924e6cd9": Command(
        "cpu", (*_TRIAL_16, "train.epochs", "train.seed"), {}, "docs/cpu_protocol.md, From the sweep to the budget"),
    # cpu-best, at c13ce17: the cpu budget's recipe for 22 epochs (the warm-up at the same share)
    "f03c6924a6e745589942d333e6e1b42c": Command(
        "cpu", ("train.epochs", "train.warmup_steps"), {}, "docs/cpu_protocol.md, The recipe at 22 epochs"),
    # cpu-budget-cost, at c6a05c6: the direction study's bi cell, seed 4
    "aed99a4f9d274b8497b05e83902d21d4": Command(
        "cpu", ("train.seed",), {}, "README, What a trial of the budget costs"),
}
