"""varlen_attention backends against a per-document float64 reference: outputs, input gradients, edge cases."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from packer import masks  # noqa: E402
from packer.attention import (  # noqa: E402
    PackedSelfAttention,
    available_backends,
    batch_flex_block_mask,
    flex_block_mask,
    varlen_attention,
)
from packer.train.attention import backends, bucketed, cuda, flex, sdpa  # noqa: E402

CPU_TRAINABLE = [n for n, info in available_backends("cpu").items() if info["backward"]]
CUDA = torch.cuda.is_available()


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def reference(q, k, v, lengths, causal=True, window=None, scale=None):
    """Each document alone, by the textbook formula, in float64: softmax(q k^T * scale + mask) v."""
    H, D = q.shape[1], q.shape[2]
    scale = D ** -0.5 if scale is None else scale
    out, start = [], 0
    for n in lengths:
        qd, kd, vd = (t[start:start + n].double().transpose(0, 1) for t in (q, k, v))
        kd = kd.repeat_interleave(H // kd.shape[0], dim=0)
        vd = vd.repeat_interleave(H // vd.shape[0], dim=0)
        scores = qd @ kd.transpose(1, 2) * scale
        i, j = np.arange(n)[:, None], np.arange(n)[None, :]
        ok = (j <= i) if causal else np.ones((n, n), bool)
        if window is not None:
            ok = ok & (i - j <= window) & (j - i <= (0 if causal else window))
        scores = scores.masked_fill(~torch.from_numpy(ok).to(scores.device), float("-inf"))
        out.append((scores.softmax(-1) @ vd).transpose(0, 1))
        start += n
    return torch.cat(out)


def random_case(seed, lengths=None, heads=4, kv_heads=4, head_dim=16, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    if lengths is None:
        rng = np.random.default_rng(seed)
        lengths = [int(x) for x in rng.integers(1, 40, size=rng.integers(1, 9))]
    T = sum(lengths)
    q = torch.randn(T, heads, head_dim, generator=g)
    k, v = (torch.randn(T, kv_heads, head_dim, generator=g) for _ in range(2))
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    to = dict(device=device, dtype=dtype)
    return [t.to(**to).requires_grad_() for t in (q, k, v)], cu.to(device), lengths


def grads_of(fn, q, k, v, grad_out):
    for t in (q, k, v):
        t.grad = None
    out = fn(q, k, v)
    out.backward(grad_out)
    return out.detach(), [t.grad.clone() for t in (q, k, v)]


def assert_matches_reference(backend, seed, lengths=None, max_extra=0, atol=2e-5, **kw):
    heads, kv_heads = kw.pop("heads", 4), kw.pop("kv_heads", 4)
    (q, k, v), cu, lengths = random_case(seed, lengths, heads, kv_heads)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1))
    max_seqlen = max(lengths) + max_extra
    out, grads = grads_of(lambda a, b, c: varlen_attention(a, b, c, cu, max_seqlen, backend=backend, **kw),
                          q, k, v, grad_out)
    ref, ref_grads = grads_of(lambda a, b, c: reference(a, b, c, lengths, **kw), q, k, v, grad_out.double())
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
    torch.testing.assert_close(out, ref.float(), atol=atol, rtol=1e-4)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r.float(), atol=atol * 5, rtol=1e-4)
    return lengths


def test_hand_case_three_documents():
    # one head, head_dim 1, q = 0: attention is the running mean of v inside each document
    cu = torch.tensor([0, 3, 5, 6], dtype=torch.int32)
    q = torch.zeros(6, 1, 1)
    v = torch.tensor([1.0, 2, 3, 10, 20, 7]).view(6, 1, 1)
    for backend in CPU_TRAINABLE:
        out = varlen_attention(q, q, v, cu, 3, backend=backend).flatten().tolist()
        assert out == pytest.approx([1, 1.5, 2, 10, 15, 7]), backend
        out = varlen_attention(q, q, v, cu, 3, window=1, backend=backend).flatten().tolist()
        assert out == pytest.approx([1, 1.5, 2.5, 10, 15, 7]), backend


@pytest.mark.parametrize("backend", CPU_TRAINABLE)
def test_random_packs_match_per_document_attention(backend):
    multi = 0
    for seed in range(12):
        lengths = assert_matches_reference(backend, seed)
        multi += len(lengths) > 2
    assert multi >= 4  # the property was exercised on real multi-document rows


@pytest.mark.parametrize("backend", CPU_TRAINABLE)
@pytest.mark.parametrize("kw", [
    dict(heads=4, kv_heads=2), dict(heads=4, kv_heads=1), dict(window=3), dict(window=0),
    dict(window=5, heads=6, kv_heads=2), dict(causal=False), dict(causal=False, window=2), dict(scale=0.3),
], ids=lambda kw: ",".join(f"{a}={b}" for a, b in kw.items()))
def test_gqa_window_noncausal_scale(backend, kw):
    for seed in range(3):
        assert_matches_reference(backend, 100 + seed, **dict(kw))


@pytest.mark.parametrize("backend", CPU_TRAINABLE)
@pytest.mark.parametrize("lengths", [
    [1, 1, 1, 1], [1, 7, 1, 1, 30, 1], [64], [37, 0, 5],  # length-1 docs, one doc filling it, an empty segment
], ids=str)
def test_edge_lengths(backend, lengths):
    assert_matches_reference(backend, 7, lengths)
    assert_matches_reference(backend, 8, lengths, max_extra=100)  # max_seqlen above the true maximum
    assert_matches_reference(backend, 9, lengths, causal=False, window=1)


@pytest.mark.parametrize("backend", CPU_TRAINABLE)
def test_padding_segment_never_leaks_or_nans(backend):
    # a packed row of 20 tokens padded to 32: padding is its own final segment, full of garbage
    (q, k, v), cu, _ = random_case(3, [12, 8, 12])
    pad = slice(20, 32)
    out1 = varlen_attention(q, k, v, cu, 12, backend=backend)
    with torch.no_grad():
        for t in (q, k, v):
            t[pad] = 1e4 * torch.randn_like(t[pad])
    out2 = varlen_attention(q, k, v, cu, 12, backend=backend)
    out2[:20].sum().backward()
    assert torch.equal(out1[:20], out2[:20])
    assert all(torch.isfinite(t.grad).all() and (t.grad[pad] == 0).all() for t in (q, k, v))


@pytest.mark.parametrize("backend", CPU_TRAINABLE)
def test_empty_batch(backend):
    q = torch.zeros(0, 2, 4)
    assert varlen_attention(q, q, q, torch.tensor([0, 0], dtype=torch.int32), 0, backend=backend).shape == (0, 2, 4)


def test_buckets_cover_every_document_once_within_ratio():
    rng = np.random.default_rng(0)
    grouped = 0
    for _ in range(200):
        lengths = [int(x) for x in rng.integers(0, 600, size=rng.integers(1, 40))]
        groups = bucketed.buckets(lengths)
        assert sorted(i for g in groups for i in g) == [i for i, n in enumerate(lengths) if n > 0]
        for g in groups:
            top = lengths[g[0]]
            assert all(lengths[i] <= top for i in g)
            assert top <= bucketed.SMALL or all(lengths[i] >= bucketed.BUCKET_RATIO * top for i in g)
            grouped += len(g) > 1
    assert grouped > 100


@pytest.mark.skipif("flex" not in available_backends("cpu"), reason="no FlexAttention in this torch")
def test_flex_forward_on_cpu_and_its_reported_backward():
    for seed, kw in enumerate([{}, dict(window=4), dict(heads=4, kv_heads=2), dict(causal=False)]):
        heads, kv_heads = kw.pop("heads", 4), kw.pop("kv_heads", 4)
        (q, k, v), cu, lengths = random_case(seed, heads=heads, kv_heads=kv_heads)
        with torch.no_grad():
            out = varlen_attention(q, k, v, cu, max(lengths) + 3, backend="flex", **kw)
        torch.testing.assert_close(out, reference(q, k, v, lengths, **kw).float(), atol=2e-5, rtol=1e-4)
    trains = available_backends("cpu")["flex"]["backward"]
    if not trains:
        with pytest.raises(ValueError, match="cannot train on CPU"):
            varlen_attention(q, k, v, cu, max(lengths), backend="flex")
    else:
        varlen_attention(q, k, v, cu, max(lengths), backend="flex").sum().backward()


def _block_sets(block_mask):
    """(partial, full) [n, n] bool from a BlockMask's kv block lists."""
    out = []
    for num, idx in ((block_mask.kv_num_blocks, block_mask.kv_indices),
                     (block_mask.full_kv_num_blocks, block_mask.full_kv_indices)):
        num, idx = num[0, 0], idx[0, 0]
        dense = torch.zeros(len(num), idx.shape[-1], dtype=torch.bool)
        for r in range(len(num)):
            dense[r, idx[r, :num[r]].long()] = True
        out.append(dense)
    return out


def test_flex_block_mask_from_ranges_equals_the_dense_classification():
    """The O(T + blocks^2) builder against the classification of each 128 x 128 block of the dense
    token mask: full blocks exactly; partial blocks exactly without a window, and with one a
    superset of the blocks with a visible pair (mask_mod decides inside them)."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    B, rng, seen = flex.FLEX_BLOCK, np.random.default_rng(4), set()
    for trial in range(40):
        lengths = rng.choice([1, 5, 60, 127, 128, 129, 300, 700], size=int(rng.integers(1, 9)))
        if trial % 7 == 0:
            lengths = np.append(lengths, 0)  # an empty segment
        cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
        T = int(cu[-1])
        causal, window = trial % 2 == 0, [None, 1, 127, 200, None][trial % 5]
        if T == 0:
            continue
        partial, full = _block_sets(flex.document_block_mask(cu, T, causal, window, "cpu"))
        doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
        n = -(-T // B)
        doc = torch.cat([doc, torch.full((n * B - T,), -1)])
        pos = torch.arange(n * B)
        q, kv = pos[:, None], pos[None, :]
        ok = (doc[q] == doc[kv]) & (doc[q] >= 0)
        if causal:
            ok &= kv <= q
        if window is not None:
            ok &= (q - kv <= window) & (kv - q <= (0 if causal else window))
        blocks = ok.view(n, B, n, B)
        exact_full, exact_any = blocks.all(3).all(1), blocks.any(3).any(1)
        assert torch.equal(full, exact_full)
        if window is None:
            assert torch.equal(partial, exact_any & ~exact_full)
        else:
            assert not (partial & full).any() and ((partial | full) >= exact_any).all()
        seen.add((causal, window is None, bool(full.any()), bool(partial.any())))
    assert len(seen) >= 6  # causal and not, windows, full and partial blocks all exercised


def test_auto_picks_a_trainable_backend_and_bad_calls_fail_clearly():
    assert backends.pick_backend("cpu", torch.float32, True) == CPU_TRAINABLE[0]
    (q, k, v), cu, lengths = random_case(0, [5, 3])
    with pytest.raises(ValueError, match="not one of"):
        varlen_attention(q, k, v, cu, 5, backend="nope")
    if "flash_attn" not in available_backends("cpu"):
        with pytest.raises(ValueError, match="not available on cpu"):
            varlen_attention(q, k, v, cu, 5, backend="flash_attn")
    with pytest.raises(ValueError, match="below the longest"):
        varlen_attention(q, k, v, cu, 4)
    with pytest.raises(ValueError, match="int32"):
        varlen_attention(q, k, v, cu.long(), 5)
    with pytest.raises(ValueError, match="total_tokens=8"):
        varlen_attention(q, k, v, torch.tensor([0, 5, 7], dtype=torch.int32), 5)


# ----------------------------------------------------------------------------- the backend table


def textbook(q, k, v, cu_seqlens, max_seqlen, causal, window, scale):
    """A whole backend: the float64 reference in the table's calling convention."""
    cu = cu_seqlens.tolist()
    lengths = [b - a for a, b in zip(cu[:-1], cu[1:])]
    return reference(q, k, v, lengths, causal, window, scale).to(q.dtype)


def test_a_backend_registered_in_the_table_is_listed_picked_and_called(monkeypatch):
    before = list(available_backends("cpu"))
    monkeypatch.setitem(backends.BACKENDS, "textbook", backends.Backend(textbook, {"*": -1}, "float64 reference"))
    assert list(available_backends("cpu"))[0] == "textbook"  # rank -1: ahead of every other, on any device
    assert available_backends("meta")["textbook"] == {"forward": True, "backward": True, "roles": False,
                                                    "note": "float64 reference"}
    assert backends.pick_backend("cpu", torch.float32, True) == "textbook"
    (q, k, v), cu, lengths = random_case(5, [7, 1, 4])
    want = reference(q, k, v, lengths, window=2).float()
    for backend in ("textbook", "auto"):
        torch.testing.assert_close(varlen_attention(q, k, v, cu, 7, window=2, backend=backend), want, atol=0, rtol=0)
    assert list(available_backends("cpu"))[1:] == before  # the others stay, in their order
    monkeypatch.delitem(backends.BACKENDS, "textbook")
    assert list(available_backends("cpu")) == before and backends.pick_backend("cpu", torch.float32, True) != "textbook"


def test_the_table_decides_devices_dtypes_availability_and_training(monkeypatch):
    (q, k, v), cu, lengths = random_case(6, [3, 5])
    monkeypatch.setitem(backends.BACKENDS, "gpu_only", backends.Backend(textbook, {"cuda": -1}, "needs a GPU"))
    monkeypatch.setitem(backends.BACKENDS, "missing", backends.Backend(textbook, {"*": -1}, "not installed",
                                                                       available=lambda: False))
    monkeypatch.setitem(backends.BACKENDS, "f64", backends.Backend(textbook, {"*": -1}, "float64 only",
                                                                   dtypes=(torch.float64,)))
    monkeypatch.setitem(backends.BACKENDS, "no_grad", backends.Backend(textbook, {"cpu": -2}, "forward only",
                                                                       trains=lambda kind: False))
    cpu = available_backends("cpu")
    assert "gpu_only" not in cpu and "missing" not in cpu and list(cpu)[:2] == ["no_grad", "f64"]
    assert cpu["no_grad"]["backward"] is False and "no no_grad backward on cpu" in cpu["no_grad"]["note"]
    assert "no_grad" not in available_backends("meta")  # a device-specific rank counts on that device only
    assert backends.pick_backend("cpu", torch.float32, False) == "no_grad"
    assert backends.pick_backend("cpu", torch.float32, True) == CPU_TRAINABLE[0]  # skips no_grad and f64
    assert backends.pick_backend("cpu", torch.float64, True) == "f64"
    for name in ("gpu_only", "missing"):
        with pytest.raises(ValueError, match=f"{name}' is not available on cpu"):
            varlen_attention(q, k, v, cu, 5, backend=name)


def test_auto_order_on_each_device(monkeypatch):
    names = backends.backend_names("cpu")
    assert names == [n for n in ("bucketed", "flex", "sdpa") if n in names] and names[0] == "bucketed"
    assert backends.backend_names("meta") == ["bucketed", "sdpa"]
    if not CUDA:
        assert backends.backend_names("cuda") == ["bucketed", "sdpa"]  # no GPU: the CUDA kernels are not offered
    # the CPU twin of a GPU machine: torch sees a GPU, so the fused kernels rank first
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    needs = {"flash_attn": "flash_attn", "torch_varlen": "torch.nn.attention.varlen",
             "flex": "torch.nn.attention.flex_attention"}
    order = [n for n in ("flash_attn", "torch_varlen", "flex", "bucketed", "sdpa")
             if n not in needs or importlib.util.find_spec(needs[n]) is not None]
    assert backends.backend_names("cuda") == order and list(available_backends("cuda")) == order
    assert all(info["backward"] for info in available_backends("cuda").values())
    assert backends.pick_backend("cuda", torch.bfloat16, True) == order[0]
    any_dtype = [n for n in order if n not in ("flash_attn", "torch_varlen")]  # those two are fp16/bf16 only
    assert backends.pick_backend("cuda", torch.float32, True) == any_dtype[0]


def test_packed_self_attention_matches_each_document_alone():
    torch.manual_seed(0)
    layer = PackedSelfAttention(32, 4, n_kv_heads=2, window=6)
    lengths = [9, 1, 14, 6]
    x = torch.randn(sum(lengths), 32)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    pos = torch.cat([torch.arange(n) for n in lengths])
    packed = layer(x, pos, cu, max(lengths))
    alone = torch.cat([layer(xd, torch.arange(len(xd)), torch.tensor([0, len(xd)], dtype=torch.int32), len(xd))
                       for xd in x.split(lengths)])
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-5)
    # rotary is relative: positions that run on across documents give the same attention, since
    # the mask alone keeps documents apart; positions that are not a shift do change it
    torch.testing.assert_close(layer(x, torch.arange(len(x)), cu, max(lengths)), alone, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(layer(x, 2 * pos, cu, max(lengths)), alone, atol=1e-3)


# ----------------------------------------------------------------------------- CPU twins of the CUDA kernels
# The CUDA kernels' call signatures, faked over the CPU reference: what our adapters pass them
# (causal flag or window_size, scale, GQA) must give per-document attention.


def _from_window_size(window_size):
    left, right = window_size
    causal = right == 0
    return causal, (left if left >= 0 else None)


def fake_varlen_attn_new(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                         window_size=(-1, -1), enable_gqa=False, seqused_k=None, block_table=None, num_splits=None):
    assert enable_gqa or key.shape[1] == query.shape[1]
    causal, window = _from_window_size(window_size)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    return sdpa.sdpa_per_document(query, key, value, cu_seq_q, max_q, causal, window, scale)


def fake_varlen_attn_old(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
    assert key.shape[1] == query.shape[1]  # no GQA in the first release
    return sdpa.sdpa_per_document(query, key, value, cu_seq_q, max_q, is_causal, None, query.shape[-1] ** -0.5)


def fake_flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None):
    assert window_size[1] in (-1, 0) or not causal
    window = window_size[0] if window_size[0] >= 0 else None
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    return sdpa.sdpa_per_document(q, k, v, cu_seqlens_q, max_seqlen_q, causal, window, scale)


@pytest.mark.parametrize("kernel", ["torch_varlen_new", "torch_varlen_old", "flash_attn"])
def test_cuda_adapters_pass_the_right_arguments(kernel, monkeypatch):
    import sys
    import types

    import torch.nn.attention.varlen as varlen_module

    if kernel == "flash_attn":
        monkeypatch.setitem(sys.modules, "flash_attn", types.SimpleNamespace(
            flash_attn_varlen_func=fake_flash_attn_varlen_func))
        call = cuda.flash_attn_varlen
    else:
        fake = fake_varlen_attn_new if kernel == "torch_varlen_new" else fake_varlen_attn_old
        monkeypatch.setattr(varlen_module, "varlen_attn", fake)
        cuda.torch_varlen_params.cache_clear()
        call = cuda.torch_varlen
    cases = [dict(), dict(scale=0.2), dict(heads=4, kv_heads=2), dict(window=3), dict(causal=False)]
    try:
        for seed, kw in enumerate(cases):
            heads, kv_heads = kw.pop("heads", 4), kw.pop("kv_heads", 4)
            causal, window, scale = kw.get("causal", True), kw.get("window"), kw.get("scale")
            (q, k, v), cu, lengths = random_case(seed, heads=heads, kv_heads=kv_heads)
            if kernel == "torch_varlen_old" and window is not None:
                with pytest.raises(ValueError, match="no window_size"):
                    call(q, k, v, cu, max(lengths), causal, window, 0.25)
                continue
            out = call(q, k, v, cu, max(lengths), causal, window, q.shape[-1] ** -0.5 if scale is None else scale)
            torch.testing.assert_close(out, reference(q, k, v, lengths, **kw).float(), atol=2e-5, rtol=1e-4)
    finally:
        cuda.torch_varlen_params.cache_clear()


# ----------------------------------------------------------------------------- CUDA (benchmarks/gpu_check.sh)

GPU_BACKENDS = [n for n in ("flash_attn", "torch_varlen", "flex", "bucketed")
                if CUDA and n in available_backends("cuda")]


@pytest.mark.skipif(not GPU_BACKENDS, reason="needs CUDA (and flash-attn for the flash_attn backend)")
@pytest.mark.parametrize("backend", GPU_BACKENDS or ["none"])
@pytest.mark.parametrize("kw", [{}, dict(heads=8, kv_heads=2), dict(window=16)], ids=["plain", "gqa", "window"])
def test_cuda_backends_match_reference(backend, kw):
    heads, kv_heads = kw.pop("heads", 4), kw.pop("kv_heads", 4)
    for seed in range(3):
        rng = np.random.default_rng(seed)
        lengths = [int(x) for x in rng.integers(1, 150, size=6)] + [1]  # T < 1024: flex runs eager
        (q, k, v), cu, lengths = random_case(seed, lengths, heads, kv_heads, head_dim=64, device="cuda",
                                             dtype=torch.bfloat16)
        grad_out = torch.randn(q.shape, device="cuda", dtype=torch.bfloat16)
        out, grads = grads_of(lambda a, b, c: varlen_attention(a, b, c, cu, max(lengths) + 5, backend=backend, **kw),
                              q, k, v, grad_out)
        ref, ref_grads = grads_of(lambda a, b, c: reference(a, b, c, lengths, **kw), q, k, v, grad_out.double())
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
        for g, r in zip(grads, ref_grads):
            torch.testing.assert_close(g.float(), r.float(), atol=5e-2, rtol=5e-2)


def test_flex_block_mask_matches_dense_mask():
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    rng = np.random.default_rng(3)
    for length_extra in (0, 5):
        offsets = _random_offsets(rng, max_docs=6, max_len=40)
        length = int(offsets[-1]) + length_extra
        block = flex_block_mask(offsets, length, block_size=16)
        assert block.shape == (1, 1, length, length)
        dense = flex.create_mask(block.mask_mod, 1, 1, length, length, device="cpu")[0, 0]
        assert torch.equal(dense, torch.as_tensor(masks.block_causal_mask(offsets, length)))
    rows = [_random_offsets(rng, max_len=20) for _ in range(3)]
    length = max(int(o[-1]) for o in rows) + 3
    block = batch_flex_block_mask(rows, length, block_size=16)
    dense = flex.create_mask(block.mask_mod, 3, 1, length, length, device="cpu")[:, 0]
    assert torch.equal(dense, torch.as_tensor(masks.batch_block_causal_mask(rows, length)))


def test_flex_attention_with_the_block_mask_equals_masked_sdpa():
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    offsets = np.array([0, 5, 17, 18, 30])
    q, k, v = torch.randn(3, 1, 2, 32, 8, generator=torch.Generator().manual_seed(0)).unbind(0)
    out = flex.flex_attention(q, k, v, block_mask=flex_block_mask(offsets, 32, block_size=16))
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=torch.as_tensor(masks.block_causal_mask(offsets, 32))
    )
    assert torch.allclose(out, ref, atol=1e-5)


def _random_offsets(rng, max_docs=7, max_len=9):
    lengths = rng.integers(1, max_len, size=rng.integers(1, max_docs))
    return np.concatenate([[0], np.cumsum(lengths)])
