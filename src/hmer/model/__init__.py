"""Models: DenseNet-B encoder, positional encodings, attention + CoMER ARM, transformer / GRU /
ConvS2S decoders, direction helpers, and the factory that builds them (`build_model`).

Every module of this package is imported here, so a decoder, position encoding or coverage kind
that registers itself (hmer.registry) is one new module: nothing else names it.
"""

from ..registry import import_submodules
from .decoder_base import Decoder, DecoderState, make_targets
from .hmer_model import HMERModel, build_model, count_parameters, list_presets

import_submodules(__name__, __path__)

__all__ = ["Decoder", "DecoderState", "HMERModel", "build_model", "count_parameters", "list_presets", "make_targets"]
