"""The effective mixture of a blend, from manifests only: each source's share of sequences and tokens,
how often its rows repeat, and its epochs in a token budget.

A blend draws sources by weight, either per sequence (weight_by="sequences": a source of weight share
w supplies w of the sequences) or per token (weight_by="tokens": w of the tokens), as
packer.data.PackedDataset(..., weights=...) does. One blended epoch is S sequences (default: every
source's rows together, the length of the sources laid end to end); source i is drawn s_i * S times,
where s_i is its share of sequences, so its rows repeat s_i * S / rows_i times. Worked example:

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
"""

from __future__ import annotations

from packer.io import fs
from packer.store.manifest import read_manifest

SCHEMA_ID = "packer.mixture/1"
WEIGHT_BY = ("sequences", "tokens")


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
    """['web=out/web:0.7', 'code=s3://b/code:0.3'] -> ({name: path}, {name: weight}); the weight is
    after the last ':' (a URI keeps its own)."""
    paths, weights = {}, {}
    for item in items:
        name, sep, rest = item.partition("=")
        path, colon, value = rest.rpartition(":")
        try:
            weight = float(value)
        except ValueError:
            weight = None
        if not sep or not name or not colon or not path or weight is None:
            raise ValueError(f"--mix {item!r} is not NAME=PATH:WEIGHT; write e.g. --mix web=out/web:0.7")
        if name in paths:
            raise ValueError(f"--mix names {name!r} twice; give each dataset one name")
        paths[name], weights[name] = path, weight
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
    """Several built datasets, each one source: {name: path} -> [{"name", "dataset", "sequences", "tokens"}]."""
    out = []
    for name, path in paths.items():
        totals = read_manifest(path)["totals"]
        out.append({"name": name, "dataset": fs.redact(str(path)), "sequences": totals["sequences"],
                    "tokens": totals["tokens_out"]})
    return out


def _check(sources, weights, weight_by):
    if weight_by not in WEIGHT_BY:
        raise ValueError(f"weight_by must be one of {', '.join(WEIGHT_BY)}; got {weight_by!r}")
    names = [s["name"] for s in sources]
    unknown, missing = sorted(set(weights) - set(names)), [n for n in names if n not in weights]
    if unknown or missing:
        raise ValueError(f"weights name {unknown or 'no unknown source'} and leave out {missing or 'none'}; "
                         f"the sources are {', '.join(names)}: give each one a weight (0 leaves it out)")
    bad = {n: w for n, w in weights.items() if not w >= 0 or w == float("inf")}
    if bad or not sum(weights.values()) > 0:
        raise ValueError(f"weights must be finite, >= 0 and not all 0; got {weights}")
    empty = [s["name"] for s in sources if weights[s["name"]] > 0 and not s["sequences"]]
    if empty:
        raise ValueError(f"source {', '.join(empty)} has no rows but a weight above 0; give it weight 0")


def mixture(sources: list[dict], weights: dict[str, float], *, weight_by: str = "sequences",
            samples: int | None = None, budget_tokens: int | None = None) -> dict:
    """The mixture figures (see the module docstring) of `sources` ([{"name", "sequences", "tokens", ...}])
    blended with `weights` ({name: weight}, any positive scale)."""
    _check(sources, weights, weight_by)
    total = sum(weights.values())
    w = [weights[s["name"]] / total for s in sources]
    mean = [s["tokens"] / s["sequences"] if s["sequences"] else 0.0 for s in sources]
    if weight_by == "sequences":
        seq_share = w
    else:
        inverse = [wi / m if wi else 0.0 for wi, m in zip(w, mean)]
        seq_share = [x / sum(inverse) for x in inverse]
    tokens_per_sample = sum(s * m for s, m in zip(seq_share, mean))
    token_share = [s * m / tokens_per_sample for s, m in zip(seq_share, mean)]
    samples = samples or sum(s["sequences"] for s in sources)
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
    return {"schema": SCHEMA_ID, "weight_by": weight_by, "samples": samples, "tokens_per_sample": tokens_per_sample,
            "budget_tokens": budget_tokens, "budget_samples": budget_samples, "sources": rows}
