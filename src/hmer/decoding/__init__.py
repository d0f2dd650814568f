"""Decoding: greedy, batched beam search, and BTTR's bidirectional approximate joint search.

    from hmer.decoding import decode_batch
    ids = decode_batch(model, images, image_mask, "bi", beam_size=10, max_len=200,
                       length_penalty=1.0, sos_id=vocab.sos_id, eos_id=vocab.eos_id)
    # -> list[list[int]] per image, left-to-right, without sos/eos

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
