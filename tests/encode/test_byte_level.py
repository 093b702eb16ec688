"""byte_level's merge order against the three-pass version it replaced, on seeded random merge lists."""

from __future__ import annotations

import random

import pytest

from packer.encode.engines import byte_level

ALPHABET = byte_level.byte_chars()
LETTERS = "abcdeĠ"  # byte-level characters (Ġ: the space)


def _reference_merge_order(merges: list, alphabet: dict) -> tuple[list[str], str | None]:
    """The three passes byte_level._merge_order made before 2026-12-05: the duplicate check, the reach
    closed over every merge, then the order; kept here as the reference."""
    pairs = [m.split(" ", 1) if isinstance(m, str) else m for m in merges]
    if len(set(map(tuple, pairs))) != len(pairs):
        return [], "a merge is listed twice"
    reach, grew = set(alphabet), True
    while grew:
        size = len(reach)
        reach.update(a + b for a, b in pairs if a in reach and b in reach)
        grew = len(reach) > size
    order, placed, last = [], set(), None
    for i, (a, b) in enumerate(pairs):
        if a not in reach or b not in reach:
            continue
        c = a + b
        if c != last:
            if c in placed:
                return [], f"the merges making {c!r} are not consecutive (merge {i})"
            placed.add(c)
            order.append(c)
            last = c
    return order, None


def _random_merges(rng: random.Random) -> list:
    """A trained-looking merge list (each merge's parts made before it), then disturbed: merges moved
    earlier than what makes their parts, pairs listed twice, a token made again apart or next to its
    first merge, parts no merge makes (not byte-level characters), some merges written "a b"."""
    pool, merges = list(LETTERS), []
    for _ in range(rng.randint(0, 30)):
        a, b = rng.choice(pool), rng.choice(pool)
        if [a, b] not in merges:
            merges.append([a, b])
            pool.append(a + b)
    for _ in range(rng.randint(0, 3)):
        kind = rng.randrange(5)
        if kind == 0 and len(merges) > 1:  # a merge moved before the merge making its part
            i = rng.randrange(1, len(merges))
            merges.insert(rng.randrange(i), merges.pop(i))
        elif kind == 1 and merges:  # listed twice
            merges.insert(rng.randrange(len(merges) + 1), list(rng.choice(merges)))
        elif kind == 2 and merges:  # the same token made another way, somewhere
            a, b = rng.choice(merges)
            if len(a + b) > 2:
                cut = rng.choice([k for k in range(1, len(a + b)) if k != len(a)] or [len(a)])
                merges.insert(rng.randrange(len(merges) + 1), [(a + b)[:cut], (a + b)[cut:]])
        elif kind == 3 and merges:  # the same token made another way, right after its merge
            i = rng.randrange(len(merges))
            a, b = merges[i]
            if len(a + b) > 2:
                cut = rng.choice(range(1, len(a + b)))
                merges.insert(i + 1, [(a + b)[:cut], (a + b)[cut:]])
        else:  # a part no merge makes: never fires
            merges.insert(rng.randrange(len(merges) + 1), [rng.choice(pool), rng.choice(["x y", "\u4e00", "zz"])])
    return [" ".join(m) if " " not in "".join(m) and rng.random() < 0.3 else m for m in merges]


def test_merge_order_equals_the_three_pass_reference():
    seen = {"accepted": 0, "listed twice": 0, "not consecutive": 0, "late part": 0}
    for seed in range(3000):
        merges = _random_merges(random.Random(seed))
        want = _reference_merge_order(merges, ALPHABET)
        assert byte_level._merge_order(merges, ALPHABET) == want, (seed, merges)
        why = want[1] or "accepted"
        seen[next(k for k in seen if k in why)] += 1
        made = {c for c in want[0]}
        pairs = [m.split(" ", 1) if isinstance(m, str) else m for m in merges]
        seen["late part"] += any(a + b in made and {a, b} - set(ALPHABET) - {"".join(p) for p in pairs[:i]}
                                 for i, (a, b) in enumerate(pairs))
    assert min(seen.values()) >= 50, seen  # every kind of list was exercised, not one alone


@pytest.mark.parametrize("merges, want", [
    ([["a", "b"], ["ab", "c"]], (["ab", "abc"], None)),
    ([["ab", "c"], ["a", "b"]], (["abc", "ab"], None)),  # a merge before its part's merge fires all the same
    (["a b", ["a", "b"]], ([], "a merge is listed twice")),
    ([["a", "b"], ["b", "c"], ["ab", "c"], ["c", "d"], ["a", "bc"]],
     ([], "the merges making 'abc' are not consecutive (merge 4)")),
    ([["a", "b"], ["ab", "c"], ["a", "bc"], ["b", "c"]], (["ab", "abc", "bc"], None)),  # (a, bc) next to (ab, c)
    ([["a", "\u4e00"], ["a", "b"]], (["ab"], None)),  # a part no merge makes: left out
])
def test_merge_order_by_hand(merges, want):
    assert byte_level._merge_order(merges, ALPHABET) == want == _reference_merge_order(merges, ALPHABET)
