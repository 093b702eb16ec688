"""Offsets -> position ids, document ids, labels, cu_seqlens, masks: hand cases, then token-by-token
references on random offsets, for numpy and torch inputs, single rows and batches."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from packer import masks

ROOT = Path(__file__).resolve().parents[1]


def test_three_document_row():
    offsets = [0, 3, 5, 6]
    assert masks.position_ids(offsets).tolist() == [0, 1, 2, 0, 1, 0]
    assert masks.document_ids(offsets).tolist() == [0, 0, 0, 1, 1, 2]
    assert masks.labels([10, 11, 12, 13, 14, 15], offsets).tolist() == [-100, 11, 12, -100, 14, -100]
    assert masks.cu_seqlens(offsets).tolist() == [0, 3, 5, 6] and masks.cu_seqlens(offsets).dtype == np.int32
    assert masks.block_causal_mask(offsets).astype(int).tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [0, 0, 0, 1, 0, 0],
        [0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],
    ]


def test_padding_is_its_own_segment():
    offsets = [0, 2, 3]  # two documents, padded to 5
    assert masks.position_ids(offsets, 5).tolist() == [0, 1, 0, 0, 1]
    assert masks.document_ids(offsets, 5).tolist() == [0, 0, 1, 2, 2]
    assert masks.cu_seqlens(offsets, 5).tolist() == [0, 2, 3, 5]
    assert masks.labels([7, 8, 9, 0, 0], offsets).tolist() == [-100, 8, -100, -100, -100]
    mask = masks.block_causal_mask(offsets, 5)
    assert mask.astype(int).tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 0, 1, 0],
        [0, 0, 0, 1, 1],
    ]
    assert mask.any(axis=1).all()  # never a fully masked row
    assert masks.cu_seqlens(offsets, 3).tolist() == [0, 2, 3]  # no padding: no extra segment
    with pytest.raises(ValueError, match="shorter than the row"):
        masks.position_ids(offsets, 2)


def _random_offsets(rng, max_docs=7, max_len=9):
    lengths = rng.integers(1, max_len, size=rng.integers(1, max_docs))
    return np.concatenate([[0], np.cumsum(lengths)])


def _reference(offsets, length):
    """Token by token: position ids, document ids, labels of arange(100, ...), dense mask."""
    n = int(offsets[-1])
    segments = [(int(a), int(b)) for a, b in zip(offsets[:-1], offsets[1:])]
    if length > n:
        segments.append((n, length))
    pos, doc, labels = [], [], []
    for d, (a, b) in enumerate(segments):
        for t in range(a, b):
            pos.append(t - a)
            doc.append(d)
            labels.append(-100 if t == a or t >= n else 100 + t)
    mask = [[doc[i] == doc[j] and j <= i for j in range(length)] for i in range(length)]
    cu = [a for a, _ in segments] + [length]
    return pos, doc, labels, mask, cu


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_random_rows_against_token_by_token_reference(backend):
    torch = pytest.importorskip("torch") if backend == "torch" else None
    rng = np.random.default_rng(0)
    padded = 0
    for _ in range(150):
        offsets = _random_offsets(rng)
        length = int(offsets[-1]) + int(rng.integers(0, 4))
        padded += length > offsets[-1]
        pos, doc, labels, mask, cu = _reference(offsets, length)
        x = torch.as_tensor(offsets) if torch else offsets
        ids = np.arange(100, 100 + length)
        got = {
            "pos": masks.position_ids(x, length),
            "doc": masks.document_ids(x, length),
            "labels": masks.labels(torch.as_tensor(ids) if torch else ids, x),
            "mask": masks.block_causal_mask(x, length),
            "cu": masks.cu_seqlens(x, length),
        }
        for value in got.values():
            assert isinstance(value, torch.Tensor if torch else np.ndarray)
        assert got["pos"].tolist() == pos and got["doc"].tolist() == doc and got["labels"].tolist() == labels
        assert got["mask"].tolist() == mask and got["cu"].tolist() == cu
        assert str(got["cu"].dtype).endswith("int32") and str(got["pos"].dtype).endswith("int64")
    assert padded > 20  # both padded and unpadded rows were exercised


def test_batch_versions_equal_rows_stacked():
    rng = np.random.default_rng(1)
    for _ in range(30):
        rows = [_random_offsets(rng) for _ in range(rng.integers(1, 5))]
        length = max(int(o[-1]) for o in rows) + int(rng.integers(0, 3))
        ids_BL = rng.integers(0, 50, size=(len(rows), length))
        assert masks.batch_position_ids(rows, length).tolist() == [masks.position_ids(o, length).tolist() for o in rows]
        assert masks.batch_document_ids(rows, length).tolist() == [masks.document_ids(o, length).tolist() for o in rows]
        assert masks.batch_labels(ids_BL, rows).tolist() == [masks.labels(i, o).tolist() for i, o in zip(ids_BL, rows)]
        assert masks.batch_block_causal_mask(rows, length).tolist() == [
            masks.block_causal_mask(o, length).tolist() for o in rows
        ]


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_next_token_labels_are_each_positions_own_target(backend):
    """[-100, t1, t2, -100, t4, -100] -> [t1, t2, -100, t4, -100, -100]; and on random rows, [B, L] too: position t's
    label is the token it predicts (t + 1 in its document, trained) or -100, the same type out as in."""
    torch = pytest.importorskip("torch") if backend == "torch" else None
    wrap = torch.as_tensor if torch else np.asarray
    got = masks.next_token_labels(wrap([-100, 11, 12, -100, 14, -100]))
    assert type(got) is type(wrap([0])) and got.tolist() == [11, 12, -100, 14, -100, -100]
    rng = np.random.default_rng(7)
    for _ in range(30):
        rows = [_random_offsets(rng) for _ in range(int(rng.integers(1, 4)))]
        length = max(int(o[-1]) for o in rows) + int(rng.integers(0, 3))
        ids_BL = rng.integers(0, 50, size=(len(rows), length))
        next_BL = masks.next_token_labels(wrap(masks.batch_labels(ids_BL, rows))).tolist()
        for ids, offsets, got in zip(ids_BL.tolist(), rows, next_BL):
            ends = set(offsets[1:].tolist())  # no target from a document's last token, nor past the row's end
            assert got == [ids[t + 1] if t + 1 not in ends and t + 1 < offsets[-1] else -100 for t in range(length)]


def test_merge_offsets_concatenates_rows():
    assert masks.merge_offsets([[0, 3, 4], [0, 2]]).tolist() == [0, 3, 4, 6]
    assert masks.merge_offsets([[0, 3, 4], [0, 2]], lengths=[6, 2]).tolist() == [0, 3, 4, 6, 8]
    rng = np.random.default_rng(2)
    for _ in range(30):
        rows = [_random_offsets(rng) for _ in range(rng.integers(1, 5))]
        merged = masks.merge_offsets(rows)
        doc_of_token = np.concatenate([masks.document_ids(o) + 100 * k for k, o in enumerate(rows)])
        boundaries = [0] + [t for t in range(1, len(doc_of_token)) if doc_of_token[t] != doc_of_token[t - 1]]
        assert merged.tolist() == boundaries + [len(doc_of_token)]


def test_masks_module_does_not_import_torch():
    code = "import sys, packer.masks as m; m.position_ids([0, 2]); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT)})
