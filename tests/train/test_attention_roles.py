"""varlen_attention with a role policy (packer.masks.RolePolicy) against masks.hybrid_mask in float64."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from packer.attention import PackedSelfAttention, available_backends, varlen_attention  # noqa: E402
from packer.masks import DEFAULT_ROLES, RolePolicy, hybrid_mask  # noqa: E402
from packer.train.attention import flex  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

ROLES = DEFAULT_ROLES
CPU_ROLES = [n for n, info in available_backends("cpu").items() if info["roles"] and info["backward"]]
CUDA = torch.cuda.is_available()
POLICIES = [
    RolePolicy(role_windows={"user": 3}, global_roles={"system"}),
    RolePolicy(window=0, global_roles={"system"}),
    RolePolicy(window=5, role_windows={"assistant": 1, "user": 0}),
    RolePolicy(),  # no window: plain document-causal
]


def reference(q, k, v, offsets, role_ids, policy, roles=ROLES):
    """softmax(q k^T * scale + the policy's dense mask) v in float64, the whole row at once."""
    H, D = q.shape[1], q.shape[2]
    mask = torch.from_numpy(hybrid_mask(np.asarray(offsets), role_ids.cpu().numpy(), policy, roles)).to(q.device)
    qd, kd, vd = (t.double().transpose(0, 1) for t in (q, k, v))
    kd, vd = kd.repeat_interleave(H // kd.shape[0], 0), vd.repeat_interleave(H // vd.shape[0], 0)
    scores = (qd @ kd.transpose(1, 2) * D ** -0.5).masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1) @ vd).transpose(0, 1)


def chat_case(seed, lengths=None, heads=4, kv_heads=2, head_dim=16, device="cpu", dtype=torch.float32):
    """Random documents, each a run of turns: a system turn, then user / assistant turns (and a tool one)."""
    rng = np.random.default_rng(seed)
    lengths = lengths or [int(x) for x in rng.integers(1, 60, size=rng.integers(1, 7))]
    role_ids = []
    for n in lengths:
        turns = [ROLES["system"]] + [ROLES[r] for r in rng.choice(["user", "assistant", "tool", "template"], 6)]
        cuts = np.sort(rng.integers(0, n + 1, size=len(turns) - 1))
        role_ids += np.repeat(turns, np.diff(np.concatenate([[0], cuts, [n]]))).tolist()
    g = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    q = torch.randn(T, heads, head_dim, generator=g)
    k, v = (torch.randn(T, kv_heads, head_dim, generator=g) for _ in range(2))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    qkv = [t.to(device=device, dtype=dtype).requires_grad_() for t in (q, k, v)]
    cu = torch.tensor(offsets, dtype=torch.int32, device=device)
    return qkv, cu, torch.tensor(role_ids, dtype=torch.uint8, device=device), lengths


def grads_of(fn, qkv, grad_out):
    for t in qkv:
        t.grad = None
    out = fn(*qkv)
    out.backward(grad_out)
    return out.detach(), [t.grad.clone() for t in qkv]


@pytest.mark.parametrize("backend", CPU_ROLES)
@pytest.mark.parametrize("policy", POLICIES, ids=range(len(POLICIES)))
@pytest.mark.parametrize("seed", range(3))
def test_backends_with_a_policy_match_the_dense_reference(backend, policy, seed):
    qkv, cu, role_ids, lengths = chat_case(seed)
    grad_out = torch.randn(qkv[0].shape, generator=torch.Generator().manual_seed(seed + 7))
    out, grads = grads_of(lambda q, k, v: varlen_attention(q, k, v, cu, max(lengths), backend=backend,
                                                           role_ids=role_ids, policy=policy), qkv, grad_out)
    ref, ref_grads = grads_of(lambda q, k, v: reference(q, k, v, cu, role_ids, policy), qkv, grad_out.double())
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
    torch.testing.assert_close(out, ref.float(), atol=2e-5, rtol=1e-4)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r.float(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", CPU_ROLES)
def test_float64_exact_and_equal_rows(backend):
    # equal documents take bucketed's no-gather path; float64 against float64 to 1e-12
    qkv, cu, role_ids, lengths = chat_case(3, lengths=[40, 40, 40], dtype=torch.float64)
    policy = POLICIES[0]
    out = varlen_attention(*qkv, cu, 40, backend=backend, role_ids=role_ids, policy=policy)
    torch.testing.assert_close(out, reference(*qkv, cu, role_ids, policy), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("backend", CPU_ROLES)
def test_window_zero_leaves_each_query_its_own_key(backend):
    # every key of every query but its own is outside a window of 0: still no NaN, the output is v itself
    qkv, cu, role_ids, lengths = chat_case(4, lengths=[7, 1, 12], kv_heads=4)
    role_ids = torch.full_like(role_ids, ROLES["user"])
    out = varlen_attention(*qkv, cu, 12, backend=backend, role_ids=role_ids, policy=RolePolicy(window=0))
    out.sum().backward()
    assert torch.isfinite(out).all() and all(torch.isfinite(t.grad).all() for t in qkv)
    torch.testing.assert_close(out, qkv[2].detach(), atol=1e-6, rtol=0)


def test_the_policy_changes_the_output_and_no_policy_is_causal():
    qkv, cu, role_ids, lengths = chat_case(5)
    plain = varlen_attention(*qkv, cu, max(lengths), backend="sdpa")
    windowed = varlen_attention(*qkv, cu, max(lengths), backend="bucketed", role_ids=role_ids, policy=POLICIES[1])
    open_ = varlen_attention(*qkv, cu, max(lengths), backend="bucketed", role_ids=role_ids, policy=RolePolicy())
    assert (windowed - plain).abs().max() > 1e-2
    torch.testing.assert_close(open_, plain, atol=2e-6, rtol=1e-5)


def test_flex_forward_on_cpu_with_a_policy():
    qkv, cu, role_ids, lengths = chat_case(6, lengths=[200, 90, 300, 17])  # several 128-token blocks
    for policy in POLICIES:
        with torch.no_grad():
            out = varlen_attention(*qkv, cu, 300, backend="flex", role_ids=role_ids, policy=policy)
        torch.testing.assert_close(out, reference(*qkv, cu, role_ids, policy).float(), atol=2e-5, rtol=1e-4)


def test_flex_block_mask_with_key_windows_keeps_every_visible_pair():
    # every (query block, key block) pair the dense mask has a True in is kept; full ones are all True
    _, cu, role_ids, lengths = chat_case(8, lengths=[300, 5, 400, 129])
    T = sum(lengths)
    for policy in POLICIES:
        windows = torch.as_tensor(policy.key_windows(ROLES))[role_ids.long()]
        block_mask = flex.document_block_mask(cu, T, True, None, "cpu", windows)
        dense = torch.from_numpy(hybrid_mask(cu.numpy(), role_ids.numpy(), policy, ROLES))
        n = -(-T // flex.FLEX_BLOCK)
        pad = torch.zeros(n * flex.FLEX_BLOCK, n * flex.FLEX_BLOCK, dtype=torch.bool)
        pad[:T, :T] = dense
        blocks = pad.view(n, flex.FLEX_BLOCK, n, flex.FLEX_BLOCK)
        anywhere, everywhere = blocks.any(dim=(1, 3)), blocks.all(dim=(1, 3))
        kept = torch.zeros(n, n, dtype=torch.bool)
        full = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            kept[i, block_mask.kv_indices[0, 0, i, :block_mask.kv_num_blocks[0, 0, i]].long()] = True
            f = block_mask.full_kv_indices[0, 0, i, :block_mask.full_kv_num_blocks[0, 0, i]].long()
            full[i, f] = True
        assert not (kept & full).any()
        assert ((kept | full) >= anywhere).all()  # nothing visible dropped
        assert (everywhere >= full).all()  # a full block is all visible (its mask_mod is skipped)


def test_refusals_name_the_fix():
    qkv, cu, role_ids, lengths = chat_case(9)
    call = lambda **kw: varlen_attention(*qkv, cu, max(lengths), **kw)  # noqa: E731
    with pytest.raises(ValueError, match="needs both role_ids"):
        call(policy=POLICIES[0])
    with pytest.raises(ValueError, match="put the window in the policy"):
        call(role_ids=role_ids, policy=POLICIES[0], window=4)
    with pytest.raises(ValueError, match="causal=True"):
        call(role_ids=role_ids, policy=POLICIES[0], causal=False)
    with pytest.raises(ValueError, match="one role id per token"):
        call(role_ids=role_ids[:-1], policy=POLICIES[0])
    with pytest.raises(ValueError, match="a role id is 0..255"):
        call(role_ids=role_ids.long() + 256, policy=POLICIES[0])
    with pytest.raises(ValueError, match="which the role table lacks"):
        call(role_ids=role_ids, policy=POLICIES[0], roles={"user": 0})


@pytest.mark.parametrize("kernel", ["flash_attn", "torch_varlen"])
def test_kernels_that_take_one_window_refuse_a_policy(kernel, monkeypatch):
    from packer.train.attention import backends

    monkeypatch.setitem(backends.BACKENDS, kernel, backends.Backend(
        lambda *a, **k: pytest.fail("called"), {"*": 0}, "test", available=lambda: True))  # as if present here
    qkv, cu, role_ids, lengths = chat_case(10)
    with pytest.raises(ValueError, match=f"{kernel!r} cannot run a role policy.*'bucketed'"):
        varlen_attention(*qkv, cu, max(lengths), backend=kernel, role_ids=role_ids, policy=POLICIES[0])
    assert backends.pick_backend("cpu", torch.float32, True, roles=True) == "bucketed"


def test_packed_self_attention_with_a_policy_matches_each_conversation_alone():
    torch.manual_seed(0)
    layer = PackedSelfAttention(32, 4, 2, policy=POLICIES[0], backend="bucketed").double()
    qkv, cu, role_ids, lengths = chat_case(11, lengths=[20, 33, 9])
    x = torch.randn(sum(lengths), 32, dtype=torch.float64)
    pos = torch.cat([torch.arange(n) for n in lengths])
    packed = layer(x, pos, cu, max(lengths), role_ids)
    start = 0
    for n in lengths:
        alone = layer(x[start:start + n], torch.arange(n), torch.tensor([0, n], dtype=torch.int32), n,
                      role_ids[start:start + n])
        torch.testing.assert_close(packed[start:start + n], alone, atol=1e-12, rtol=1e-12)
        start += n
    with pytest.raises(ValueError, match="role_ids go with a policy"):
        layer(x, pos, cu, max(lengths))


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (CPU twin: test_backends_with_a_policy_match...)")
@pytest.mark.parametrize("policy", POLICIES, ids=range(len(POLICIES)))
def test_flex_on_cuda_forward_and_backward_match_the_reference(policy):
    qkv, cu, role_ids, lengths = chat_case(12, lengths=[700, 64, 1500, 33, 300], device="cuda")
    grad_out = torch.randn(qkv[0].shape, generator=torch.Generator().manual_seed(13)).cuda()
    out, grads = grads_of(lambda q, k, v: varlen_attention(q, k, v, cu, 1500, backend="flex", role_ids=role_ids,
                                                           policy=policy), qkv, grad_out)
    ref, ref_grads = grads_of(lambda q, k, v: reference(q, k, v, cu.cpu(), role_ids, policy), qkv, grad_out.double())
    torch.testing.assert_close(out, ref.float(), atol=2e-4, rtol=1e-3)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r.float(), atol=1e-3, rtol=1e-3)
