"""Models: DenseNet-B encoder, positional encodings, attention + CoMER ARM, transformer / GRU /
ConvS2S decoders, direction helpers, and the factory with its named presets.

    from hmer.model import build_model, list_presets
    model = build_model("bttr")            # or build_model(cfg.model)
"""

from .decoder_base import Decoder, DecoderState
from .direction import make_targets
from .factory import DESCRIPTIONS, PRESETS, build_model, count_parameters, list_presets, preset_config
from .hmer_model import HMERModel

__all__ = [
    "DESCRIPTIONS",
    "Decoder",
    "DecoderState",
    "HMERModel",
    "PRESETS",
    "build_model",
    "count_parameters",
    "list_presets",
    "make_targets",
    "preset_config",
]
