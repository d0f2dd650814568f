"""Decoding: greedy, batched beam search, and BTTR's bidirectional approximate joint search
(`decode_batch`; docs/architecture.md, "decoding -> evaluation").

Searches run on `model.decoder.init_state / step / reorder_state`; joint search also rescores
with teacher forcing (`model.decode`). `reference_search` holds BTTR's and CoMER's own searches.
Rules register by name where defined (hmer.registry.SEARCH_RULES); every module is imported here,
so a new rule is one new module.
"""

from ..config import DIRECTIONS
from ..registry import import_submodules
from .beam import Hypothesis, beam_search, length_normalized
from .decode import decode_batch, greedy_search, joint_beam_search, sequence_log_probs

import_submodules(__name__, __path__)

__all__ = ["DIRECTIONS", "Hypothesis", "beam_search", "decode_batch", "greedy_search", "joint_beam_search",
           "length_normalized", "sequence_log_probs"]
