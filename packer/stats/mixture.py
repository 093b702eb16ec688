"""The effective mixture of a blend, from manifests only: each source's share of sequences and tokens,
how often its rows repeat, and its epochs in a token budget.

A blend draws sources by weight, either per sequence (mix_by="sequences": a source of weight share
w supplies w of the sequences) or per token (mix_by="tokens": w of the tokens), as
packer.data.PackedDataset(..., weights=..., mix_by=...) does. One blended epoch is S sequences
(num_samples; default: every source's rows together); source i is drawn s_i * S times, where s_i is
its share of sequences, so its rows repeat s_i * S / rows_i times. Worked example:

    web: 1,000 rows, 2,000,000 tokens (2,000 a row)   code: 100 rows, 150,000 tokens (1,500 a row)
    weights web 0.7, code 0.3, by sequences; S = 1,100
      drawn        web 0.7 * 1100 = 770            code 0.3 * 1100 = 330
      repetition   web 770 / 1000 = 0.77           code 330 / 100 = 3.3
      token share  web 0.7 * 2000 / (0.7 * 2000 + 0.3 * 1500) = 0.757    code 0.243
    budget 10,000,000 tokens: 10M / 1850 tokens a sequence = 5,405.4 sequences
      epochs       web 0.7 * 5405.4 / 1000 = 3.78  code 0.3 * 5405.4 / 100 = 16.2

By tokens the weights are the token shares, and the share of sequences follows from them:
s_i = (w_i / mean_i) / sum_j (w_j / mean_j), mean_i = tokens_i / rows_i; the rest is as above.
Tokens are stored tokens (padding not counted).

As the loader does, the shares of sequences are whole counts over a period of P = min(S, 2^18)
positions (largest remainder: S = 7, weights 1:1 -> 4 and 3 of every 7), so s_i is that count / P:
over every prefix of the blend a source is within one sequence of it.
"""

from __future__ import annotations

from packer.io import fs
from packer.store.manifest import read_manifest

SCHEMA_ID = "packer.mixture/1"
MIX_BY = ("sequences", "tokens")
PERIOD = 2**18  # the loader's pattern period (packer/train/blend.py): shares are kept to 1 / PERIOD


def parse_weights(text: str) -> dict[str, float]:
    """'web=0.7,code=0.3' -> {"web": 0.7, "code": 0.3}."""
    weights = {}
    for item in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = item.partition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = None
        if not sep or not name.strip() or weight is None:
            raise ValueError(f"--weights item {item!r} is not NAME=WEIGHT; write e.g. --weights web=0.7,code=0.3")
        if name.strip() in weights:
            raise ValueError(f"--weights names {name.strip()!r} twice; give each source one weight")
        weights[name.strip()] = weight
    if not weights:
        raise ValueError(f"--weights {text!r} names no source; write e.g. --weights web=0.7,code=0.3")
    return weights


def parse_mix(items) -> tuple[dict[str, str], dict[str, float]]:
    """['web=out/web:0.7', 'code=s3://b/code'] -> ({name: path}, {name: weight} where one is given): the
    weight is a number after the last ':' (a URI keeps its own ':')."""
    paths, weights = {}, {}
    for item in items:
        name, sep, rest = item.partition("=")
        path, colon, value = rest.rpartition(":")
        try:
            weight = float(value) if colon and path else None
        except ValueError:
            weight = None
        if weight is None:
            path = rest
        if not sep or not name or not path:
            raise ValueError(f"--mix {item!r} is not NAME=PATH[:WEIGHT]; write e.g. --mix web=out/web:0.7")
        if name in paths:
            raise ValueError(f"--mix names {name!r} twice; give each dataset one name")
        paths[name] = path
        if weight is not None:
            weights[name] = weight
    return paths, weights


def dataset_sources(path) -> list[dict]:
    """[{"name", "dataset", "sequences" (rows), "tokens"}] of the named sources of one built dataset."""
    manifest = read_manifest(path)
    named = manifest.get("sources")
    if not named:
        raise ValueError(f"{fs.redact(path)} was built without named sources, so --weights has nothing to weigh; "
                         "build it with --source NAME=PATH, or blend several datasets with --mix NAME=PATH:WEIGHT")
    return [{"name": s["name"], "dataset": fs.redact(str(path)), "sequences": s["sequences"][1] - s["sequences"][0],
             "tokens": s["tokens"]} for s in named]


def datasets_as_sources(paths: dict[str, str]) -> list[dict]:
    """The sources of several built datasets, as PackedDataset({name: path, ...}) sees them: a dataset's
    named sources, or the dataset as one source under its name -> [{"name", "dataset", "sequences", "tokens"}]."""
    out = []
    for name, path in paths.items():
        manifest = read_manifest(path)
        if manifest.get("sources"):
            out += dataset_sources(path)
        else:
            totals = manifest["totals"]
            out.append({"name": name, "dataset": fs.redact(str(path)), "sequences": totals["sequences"],
                        "tokens": totals["tokens_out"]})
    names = [s["name"] for s in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"source names {twice} occur in more than one dataset (a dataset with named sources "
                         "brings its own names); rename the datasets in --mix, or blend them apart")
    return out


def _check(sources, weights, mix_by):
    if mix_by not in MIX_BY:
        raise ValueError(f"mix_by must be one of {', '.join(MIX_BY)}; got {mix_by!r}")
    names = [s["name"] for s in sources]
    unknown = sorted(set(weights) - set(names))
    if unknown:
        raise ValueError(f"weights name {unknown}, which are not sources here; the sources are {', '.join(names)} "
                         "(one left out has weight 0)")
    bad = {n: w for n, w in weights.items() if not w >= 0 or w == float("inf")}
    if bad or not sum(weights.values()) > 0:
        raise ValueError(f"weights must be finite, >= 0 and not all 0; got {weights}")
    empty = [s["name"] for s in sources if weights.get(s["name"], 0) > 0 and not s["sequences"]]
    if empty:
        raise ValueError(f"source {', '.join(empty)} has no rows but a weight above 0; give it weight 0")


def apportion(weights: list[float], total: int) -> list[int]:
    """Whole counts summing to `total` in proportion to `weights`, by largest remainder (ties to the
    earlier source), as the loader's blend apportions its period: [1, 1], 7 -> [4, 3]."""
    ideal = [w / sum(weights) * total for w in weights]
    counts = [int(x // 1) for x in ideal]
    by_remainder = sorted(range(len(ideal)), key=lambda i: -(ideal[i] - counts[i]))  # stable: ties keep order
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def _sequence_shares(w, mean, mix_by, period, names) -> list[float]:
    per_sequence = w if mix_by == "sequences" else [wi / max(m, 1) for wi, m in zip(w, mean)]
    counts = apportion(per_sequence, period)
    small = [n for n, x, c in zip(names, per_sequence, counts) if x > 0 and c == 0]
    if small:
        raise ValueError(f"sources {small} have weights below 1 / {period} of the blend: they would never be "
                         "read; raise their weight or num_samples, or drop them")
    return [c / period for c in counts]


def mixture(sources: list[dict], weights: dict[str, float] | None, *, mix_by: str = "sequences",
            num_samples: int | None = None, budget_tokens: int | None = None) -> dict:
    """The mixture figures (see the module docstring) of `sources` ([{"name", "sequences", "tokens", ...}])
    blended with `weights` ({name: weight}, any positive scale; a source left out has weight 0; None: in
    proportion to their rows, the loader's default)."""
    if weights is None:
        weights = {s["name"]: float(s["sequences"]) for s in sources}
    _check(sources, weights, mix_by)
    total = sum(weights.values())
    w = [weights.get(s["name"], 0.0) / total for s in sources]
    mean = [s["tokens"] / s["sequences"] if s["sequences"] else 0.0 for s in sources]
    samples = num_samples or sum(s["sequences"] for s in sources)
    seq_share = _sequence_shares(w, mean, mix_by, min(samples, PERIOD), [s["name"] for s in sources])
    tokens_per_sample = sum(s * m for s, m in zip(seq_share, mean))
    token_share = [s * m / tokens_per_sample for s, m in zip(seq_share, mean)]
    budget_samples = budget_tokens / tokens_per_sample if budget_tokens else None
    rows = []
    for s, wi, si, ti in zip(sources, w, seq_share, token_share):
        n = s["sequences"]
        row = {**s, "weight": wi, "sequence_share": si, "token_share": ti, "drawn": si * samples,
               "repetition": si * samples / n if n else 0.0}
        if budget_tokens:
            row.update(budget_sequences=si * budget_samples, budget_tokens=ti * budget_tokens,
                       epochs=si * budget_samples / n if n else 0.0)
        rows.append(row)
    return {"schema": SCHEMA_ID, "mix_by": mix_by, "num_samples": samples, "tokens_per_sample": tokens_per_sample,
            "budget_tokens": budget_tokens, "budget_samples": budget_samples, "sources": rows}
