"""Padding-waste figures: what padding every document to the context would cost, and what packing saves.

All figures come from lengths alone: document lengths for a raw corpus, and the segment
lengths and row lengths of a built dataset. Shares are fractions in [0, 1].
"""

from __future__ import annotations

import numpy as np


def padding_stats(doc_lengths, context_length: int, n_sequences: int | None = None) -> dict:
    """Compare pad-to-context (one document per row; a longer one takes ceil(l / L) rows) with
    packing into `n_sequences` rows of the context length (when given)."""
    lengths = np.asarray(doc_lengths, dtype=np.int64)
    n_tokens = int(lengths.sum())
    padded_rows = int((-(-lengths // context_length)).sum())
    padded_slots = padded_rows * context_length
    out = {
        "documents": int(len(lengths)),
        "tokens": n_tokens,
        "context_length": context_length,
        "padded_rows": padded_rows,
        "padded_padding_share": 1 - n_tokens / padded_slots if padded_slots else 0.0,
    }
    if n_sequences is not None:
        packed_slots = n_sequences * context_length
        out.update(
            {
                "packed_rows": int(n_sequences),
                "packed_fill_rate": n_tokens / packed_slots if packed_slots else 1.0,
                "packed_padding_share": 1 - n_tokens / packed_slots if packed_slots else 0.0,
                "lower_bound_rows": -(-n_tokens // context_length),
                "rows_saved_share": 1 - n_sequences / padded_rows if padded_rows else 0.0,
            }
        )
    return out


def dataset_stats(ds) -> dict:
    """Padding figures of a built dataset (an open_dataset reader), from its stored segments.

    A split document is several segments of at most L tokens each, so padding each segment
    to L costs exactly the ceil(l / L) rows that padding the whole document would."""
    context_length = ds.manifest["config"]["context_length"]
    doc_lengths = np.concatenate([np.diff(offs) for _, offs in ds]) if len(ds) else np.zeros(0, np.int64)
    return padding_stats(doc_lengths, context_length, n_sequences=len(ds))
