"""RolePolicy and hybrid_mask against a brute-force loop over documents, tokens and keys."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.masks import DEFAULT_ROLES, PAD_ROLE, UNLIMITED, RolePolicy, hybrid_mask, token_key_windows

ROLES = DEFAULT_ROLES


def brute_force(offsets, role_ids, policy, roles):
    """The policy's words, one pair at a time: same document, j <= i, j global or within its role's window."""
    n = int(offsets[-1])
    name_of = {i: name for name, i in roles.items()}
    out = np.zeros((n, n), bool)
    for a, b in zip(offsets[:-1], offsets[1:]):
        for i in range(a, b):
            for j in range(a, i + 1):
                role = name_of.get(int(role_ids[j]))
                if role in policy.global_roles:
                    out[i, j] = True
                    continue
                w = policy.role_windows.get(role, policy.window) if role is not None else policy.window
                out[i, j] = w is None or i - j <= w
    return out


def test_hand_case_system_global_user_window():
    policy = RolePolicy(role_windows={"user": 2}, global_roles={"system"})
    S, U, A = ROLES["system"], ROLES["user"], ROLES["assistant"]
    want = np.array([[1, 0, 0, 0, 0, 0, 0],
                     [1, 1, 0, 0, 0, 0, 0],
                     [1, 1, 1, 0, 0, 0, 0],
                     [1, 1, 1, 1, 0, 0, 0],
                     [1, 1, 1, 1, 1, 0, 0],
                     [1, 1, 0, 1, 1, 1, 0],
                     [1, 1, 0, 0, 1, 1, 1]], bool)
    got = hybrid_mask(np.array([0, 7]), np.array([S, S, U, U, U, A, A]), policy, ROLES)
    np.testing.assert_array_equal(got, want)
    # two conversations in one row: never across them
    two = hybrid_mask(np.array([0, 7, 14]), np.array([S, S, U, U, U, A, A] * 2), policy, ROLES)
    np.testing.assert_array_equal(two[:7, :7], want)
    np.testing.assert_array_equal(two[7:, 7:], want)
    assert not two[7:, :7].any() and not two[:7, 7:].any()


policies = st.builds(
    RolePolicy,
    window=st.none() | st.integers(0, 6),
    role_windows=st.dictionaries(st.sampled_from(["user", "assistant", "tool"]), st.integers(0, 6), max_size=3),
    global_roles=st.sets(st.sampled_from(["system", "template"]), max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 12), min_size=1, max_size=5), policies, st.integers(0, 2**32 - 1))
def test_hybrid_mask_equals_brute_force(lengths, policy, seed):
    rng = np.random.default_rng(seed)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ids = [*ROLES.values(), PAD_ROLE]  # an id outside the table too: it takes the default window
    role_ids = rng.choice(ids, size=int(offsets[-1])).astype(np.uint8)
    got = hybrid_mask(offsets, role_ids, policy, ROLES)
    np.testing.assert_array_equal(got, brute_force(offsets, role_ids, policy, ROLES))
    assert got.diagonal().all()  # every query sees itself: no empty row


def test_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    policy = RolePolicy(window=1, global_roles={"system"})
    offsets, role_ids = np.array([0, 3, 5]), np.array([0, 1, 1, 2, 2], np.uint8)
    got = hybrid_mask(torch.tensor(offsets), torch.tensor(role_ids), policy, ROLES)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.bool
    np.testing.assert_array_equal(got.numpy(), hybrid_mask(offsets, role_ids, policy, ROLES))


def test_key_windows_and_parse():
    policy = RolePolicy.parse("system=global,user=64,*=8")
    assert policy == RolePolicy(window=8, role_windows={"user": 64}, global_roles={"system"})
    table = policy.key_windows(ROLES)
    assert table[ROLES["system"]] == UNLIMITED and table[ROLES["user"]] == 64 and table[ROLES["assistant"]] == 8
    assert table[PAD_ROLE] == 8
    assert list(token_key_windows(np.array([1, 0, 2]), policy, ROLES)) == [64, UNLIMITED, 8]
    assert RolePolicy.parse("user=none") == RolePolicy()
    assert hash(policy) == hash(RolePolicy.parse("user=64, system=global, *=8"))


@pytest.mark.parametrize("kwargs, message", [
    ({"window": -1}, "window=-1"),
    ({"role_windows": {"user": 1.5}}, "role_windows"),
    ({"role_windows": {"system": 3}, "global_roles": {"system"}}, "both global and windowed"),
])
def test_bad_policies_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RolePolicy(**kwargs)


def test_unknown_role_and_bad_lengths_are_refused():
    with pytest.raises(ValueError, match="'usr', which the role table lacks"):
        RolePolicy(role_windows={"usr": 3}).key_windows(ROLES)
    with pytest.raises(ValueError, match="3 role ids for a row of 4 tokens"):
        hybrid_mask(np.array([0, 4]), np.array([0, 1, 2]), RolePolicy(), ROLES)
    with pytest.raises(ValueError, match="not ROLE=global"):
        RolePolicy.parse("user:64")
    assert RolePolicy(global_roles="system").global_roles == {"system"}  # one name, not its letters
