"""Count the documents that hold the EOS id inside them (anywhere but as their last token), fed a unit's ids in parts.

Why: packer's rows keep boundaries as offsets, so an EOS inside a document (a chat template that
ends every message with EOS, a pre-tokenized record) is just a token. A trainer that finds
boundaries or masks from EOS (NeMo's packed collate, torchtitan <= 0.2, an EOS-based document
mask) cuts such a document there; the manifest's totals.docs_inner_eos says how many there are.

The parts are the tokenize stage's (packer/encode/text.py encode_parts): (ids, lengths) whose
concatenation is the unit's, a document longer than a part spread over several with its length on
its last. eos 0:

    ([5 0 7 0], [4]), ([3], []), ([0 9], [3]), ([0], [1])  ->  2   ([5 0 7 0] and [3 0 9]; [0] ends in its EOS)
"""

from __future__ import annotations

import numpy as np


class InnerEos:
    """docs: the documents seen whole so far that hold `eos_id` before their last token."""

    def __init__(self, eos_id: int):
        self.eos_id = eos_id
        self.docs = 0
        self._inner = False  # the open document (its length not given yet) has an EOS followed by more of it
        self._last_eos = False  # the open document's last token so far is EOS
        self._open = 0  # tokens of the open document seen so far (its length counts them too)

    def add(self, ids: np.ndarray, lengths: np.ndarray):
        ends = np.cumsum(np.asarray(lengths, np.int64)) - self._open  # the first closes the open document
        bounds = np.concatenate([[0], ends, [len(ids)]])  # segment j = ids[bounds[j]:bounds[j+1]]; the last stays open
        at = np.flatnonzero(np.asarray(ids) == self.eos_id)
        segment = np.searchsorted(bounds[1:], at, side="right")  # the segment of each EOS
        inner = np.zeros(len(bounds) - 1, bool)
        inner[segment[at != bounds[segment + 1] - 1]] = True  # an EOS with more of its segment after it
        sizes = np.diff(bounds)
        inner[0] |= self._inner or (self._last_eos and sizes[0] > 0)  # the open document goes on here
        last_eos = bool(sizes[-1]) and bool(ids[-1] == self.eos_id)
        if len(ends):
            self.docs += int(np.count_nonzero(inner[:-1]))
            self._inner, self._last_eos, self._open = bool(inner[-1]), last_eos, int(sizes[-1])
        else:  # no length: the open document only grew
            self._inner, self._last_eos = bool(inner[0]), last_eos if sizes[0] else self._last_eos
            self._open += len(ids)
