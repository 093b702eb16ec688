"""The stats figures as a printed table, a PNG of four charts, a self-contained HTML page (the charts as SVG).
The mask picture of `packer show-mask` is packer/stats/mask_image.py.

Everything here reads only the JSON-ready dict of packer.stats.figures (so a stats.json can be
redrawn later). matplotlib is an optional extra (`pip install 'packer[plot]'`), imported
only when a picture is asked for, through its object API (no pyplot, no global backend).
"""

from __future__ import annotations

import base64
import html
import io
import json
import re
import time

import numpy as np

from packer.stats.step_balance import STEP_BALANCE_HEAD, step_balance_rows, step_balance_title
from packer.stats.svg import charts_svg, panel_svgs

REPORT_INCHES, REPORT_DPI = (12.0, 8.0), 100  # report PNG: 1200 x 800 pixels
LABELS = {
    "pad_to_context": "pad every document to the context",
    "pad_random_batches": "pad to longest, random batches of {B} (expected)",
    "pad_sorted_batches": "pad to longest, length-sorted batches of {B}",
    "truncate": "truncate to the context",
    "pack_ffd": "pack, first-fit decreasing",
    "pack_bfd": "pack, best-fit decreasing",
}


def _figure(inches, dpi):
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ValueError(
            "pictures need matplotlib, which is not installed: pip install 'packer[plot]' (or pip install matplotlib)"
        ) from None
    return Figure(figsize=inches, dpi=dpi)


def _pct(x) -> str:
    return f"{x:.2%}"


def _source_line(f: dict) -> str:
    src = f["source"]
    what = "dataset" if src["kind"] == "dataset" else "corpus"
    line = f"{what}: {', '.join(src['inputs']) or '(inputs not recorded)'}"
    if src.get("sample"):
        s = src["sample"]
        line += f"  (seeded sample of {s['documents']:,} of {s['of_documents']:,} documents, seed {s['seed']}: figures describe the sample)"
    elif src.get("documents_from") == "segments":
        line += "  (no doc_ids stored: each stored segment counts as a document)"
    return line


def table_rows(f: dict) -> list[tuple[str, str]]:
    """(label, value) pairs of the summary, in print order."""
    lens, p = f["lengths"], f["lengths"]["percentiles"]
    rows = [
        ("documents", f"{lens['documents']:,}"),
        ("tokens", f"{lens['tokens']:,}"),
        ("length p50 / p90 / p99 / max", f"{p['p50']:,.0f} / {p['p90']:,.0f} / {p['p99']:,.0f} / {p['max']:,}"),
        ("longer than the context", f"{_pct(lens['long_documents_share'])} of documents, {_pct(lens['long_tokens_share'])} of tokens"),
    ]
    pk = f.get("packing")
    if pk:
        d = pk["docs_per_sequence"]
        rows += [
            (f"packed ({pk['algorithm']}, {pk['source']})", f"{pk['sequences']:,} sequences, fill {pk['fill_rate']:.4f}, lower bound {pk['lower_bound']:,}"),
            ("documents per sequence", f"p50 {d['p50']:.0f}, p90 {d['p90']:.0f}, p99 {d['p99']:.0f}, max {d['max']:,}, mean {d['mean']:.2f}"),
            ("single split piece only", f"{_pct(pk['single_split_piece_share'])} of sequences"),
            ("trend, output order", _trend_text(pk["trend_output_order"], pk["trend_noise_level"])),
        ]
        if pk["trend_packing_order"]:
            rows.append(("trend, packing order", _trend_text(pk["trend_packing_order"], pk["trend_noise_level"])))
    a = f.get("attention")
    if a:
        rows.append(("attention entries", f"dense {a['dense_causal']:.3g}, block-causal {a['block_causal']:.3g}: varlen saves {_pct(a['saving_share'])}"))
    return rows


def _trend_text(t: dict, noise: float) -> str:
    def r(x):
        return "n/a (constant)" if x is None else f"{x:+.3f}"

    return f"r(position, fill) {r(t['fill_correlation'])}, r(position, documents) {r(t['docs_correlation'])}; noise |r| < {noise:.3f}"


def strategy_rows(f: dict) -> list[tuple[str, ...]]:
    """(strategy, sequences, compute slots, padding share, tokens lost, note) per strategy."""
    rows = []
    for key, s in f["strategies"].items():
        note = ""
        if "fill_rate" in s:
            note = f"fill {s['fill_rate']:.4f}, {s['sequences']:,} vs lower bound {s['lower_bound']:,} (+{s['bins_over_lower_bound']:,})"
        lost = f"{s['tokens_lost']:,} ({_pct(s['tokens_lost_share'])})" if s["tokens_lost"] else "0"
        if "trained_share" in s:  # fine-tuning data: the share of compute slots that trains
            note = f"trained {_pct(s['trained_share'])}" + (f"; {note}" if note else "")
        rows.append((LABELS[key].format(B=f["batch_size"]), f"{s['sequences']:,}", f"{s['compute_slots']:,.0f}",
                     _pct(s["padding_share"]), lost, note))
    return rows


def source_rows(f: dict) -> list[tuple[str, ...]]:
    """(source, documents, tokens, sequences, fill, padding, skipped) per named source (none: [])."""
    rows = []
    for s in f.get("sources") or ():
        skipped = s.get("docs_skipped")
        rows.append((s["name"], f"{s['documents']:,}", f"{s['tokens']:,}", f"{s['sequences']:,}", f"{s['fill_rate']:.4f}",
                     _pct(s["padding_share"]), "n/a" if skipped is None else f"{sum(skipped.values()):,}"))
    return rows


SOURCE_HEAD = ("source", "documents", "tokens", "sequences", "fill", "padding", "skipped")


def _aligned(rows) -> list[str]:
    """Rows of cells as text columns: the first left-aligned, the others right-aligned."""
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join([r[0].ljust(w[0])] + [c.rjust(wi) for c, wi in zip(r[1:], w[1:])]).rstrip() for r in rows]


def format_table(f: dict) -> str:
    """The printed report: source, summary, one line per batching strategy, and one per named source."""
    lines = [_source_line(f), f"context length {f['context_length']:,}, batch size {f['batch_size']}, seed {f['seed']}", ""]
    lines += [f"{k:<30}{v}" for k, v in table_rows(f)]
    head = ("strategy", "sequences", "compute slots", "padding", "tokens lost", "")
    rows = [head] + strategy_rows(f)
    w = [max(len(r[i]) for r in rows) for i in range(5)]
    lines.append("")
    for r in rows:
        lines.append(f"{r[0]:<{w[0]}}  {r[1]:>{w[1]}}  {r[2]:>{w[2]}}  {r[3]:>{w[3]}}  {r[4]:>{w[4]}}  {r[5]}".rstrip())
    if f.get("sources"):
        lines += ["", *_aligned([SOURCE_HEAD] + source_rows(f))]
    if balance_rows := step_balance_rows(f):
        lines += ["", step_balance_title(f), *_aligned([STEP_BALANCE_HEAD] + balance_rows)]
    return "\n".join(lines)


def _draw_lengths(ax, f):
    h = f["lengths"]["histogram"]
    edges = np.asarray(h["edges"], dtype=float)
    ax.stairs(h["counts"], edges, fill=True, alpha=0.7)
    ax.set_xscale("log")
    ax.axvline(f["context_length"], color="crimson", linestyle="--", label=f"context {f['context_length']:,}")
    ax.set_xlabel("document length (tokens, log scale)")
    ax.set_ylabel("documents")
    ax.set_title("document lengths")
    ax.legend()


def _draw_strategies(ax, f):
    keys = list(f["strategies"])
    shares = [f["strategies"][k]["padding_share"] for k in keys]
    labels = [LABELS[k].format(B=f["batch_size"]).replace(", ", ",\n") for k in keys]
    bars = ax.barh(range(len(keys)), shares, color=["#c44" if not k.startswith("pack") else "#4a4" for k in keys])
    ax.set_yticks(range(len(keys)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(1e-9, max(shares)) * 1.25)
    for b, s in zip(bars, shares):
        ax.text(b.get_width(), b.get_y() + b.get_height() / 2, f" {s:.1%}", va="center", fontsize=8)
    ax.set_xlabel("share of compute slots that are padding")
    ax.set_title("padding by batching strategy")


def _draw_fill(ax, f):
    pk = f["packing"]
    h = pk["fill_histogram"]
    ax.stairs(h["counts"], h["edges"], fill=True, alpha=0.7, color="#4a4")
    ax.set_yscale("symlog")
    ax.set_xlabel("fill rate of a packed sequence")
    ax.set_ylabel("sequences")
    ax.set_title(f"fill rates ({pk['algorithm']}, mean {pk['fill_rate']:.4f})")


def _draw_trend(ax, f):
    pk = f["packing"]
    for key, label, style in (("trend_packing_order", "packing order", "--"), ("trend_output_order", "output order (shuffled)", "-")):
        t = pk[key]
        if t:
            ax.plot(np.arange(1, len(t["docs_by_group"]) + 1), t["docs_by_group"], style, marker="o",
                    label=f"{label}: r = {t['docs_correlation'] if t['docs_correlation'] is None else round(t['docs_correlation'], 3)}")
    ax.set_xlabel("tenth of the sequences, by position")
    ax.set_ylim(bottom=0)  # from zero, so noise does not look like a trend
    ax.set_ylabel("mean documents per sequence")
    ax.set_title("composition against position")
    ax.legend(fontsize=8)


def report_figure(f: dict):
    """The four charts on one matplotlib Figure (REPORT_INCHES at REPORT_DPI)."""
    fig = _figure(REPORT_INCHES, REPORT_DPI)
    axes = fig.subplots(2, 2)
    _draw_lengths(axes[0, 0], f)
    _draw_strategies(axes[0, 1], f)
    if f.get("packing"):
        _draw_fill(axes[1, 0], f)
        _draw_trend(axes[1, 1], f)
    fig.suptitle(_source_line(f)[:150], fontsize=9)
    fig.subplots_adjust(left=0.07, right=0.97, top=0.9, bottom=0.08, wspace=0.45, hspace=0.4)
    return fig


def write_png(f: dict, path) -> None:
    report_figure(f).savefig(path, format="png")


def _html_table(head, rows) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>"


def _sources_html(f: dict) -> str:
    """The per-source table of a build with named sources ('' without: other pages keep their bytes)."""
    if not f.get("sources"):
        return ""
    return f"\n<h2>Sources</h2>\n{_html_table(SOURCE_HEAD, source_rows(f))}"


def _step_balance_html(f: dict) -> str:
    """The step-balance table of a dataset's own rows ('' without: other pages keep their bytes)."""
    if not (rows := step_balance_rows(f)):
        return ""
    return (f"\n<h2>Step balance</h2>\n<p>{html.escape(step_balance_title(f))}</p>\n"
            f"{_html_table(STEP_BALANCE_HEAD, rows)}")


def _page_before_header(f: dict) -> str:
    """The page as packer wrote it before 2026-12-05 (no build header, one 1200 x 800 chart): kept so
    `packer verify` still redraws a dataset's page of then byte for byte (check_report)."""
    img = charts_svg(f, LABELS, _source_line(f))
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>packer stats</title>
<style>body{{font:14px system-ui,sans-serif;margin:2em;max-width:1250px}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:left}}td:nth-child(n+2){{text-align:right}}img{{max-width:100%}}</style>
</head><body>
<h1>packer stats</h1>
<p>{html.escape(_source_line(f))}<br>context length {f['context_length']:,}, batch size {f['batch_size']}, seed {f['seed']}</p>
<h2>Padding by batching strategy</h2>
{_html_table(("strategy", "sequences", "compute slots", "padding", "tokens lost", "packing"), strategy_rows(f))}
<h2>Summary</h2>
{_html_table(("figure", "value"), table_rows(f))}{_sources_html(f)}{_step_balance_html(f)}
{img}
<details><summary>figures as JSON (schema {html.escape(f['schema'])})</summary><pre>{html.escape(json.dumps(f, indent=2))}</pre></details>
</body></html>
"""
    return page


EXPLAINED = {  # summary rows a reader may not know, one line each (docs/stats.md has the longer story)
    "length p50 / p90 / p99 / max": "Half, 90%, 99% of documents are at most this long (tokens, with eos/bos).",
    "longer than the context": "Documents split into several sequences (--long-docs split keeps every token).",
    "documents per sequence": "How many documents share one packed row: attention never crosses them.",
    "single split piece only": "Rows holding one piece of a long document and nothing else.",
    "trend, output order": "Correlation of a row's position with its fill and document count, in stored order: "
                           "near 0 (inside the noise) means no early or late rows differ.",
    "trend, packing order": "The same before the shuffle: FFD fills its first rows with long documents.",
    "attention entries": "Query-key pairs attention computes: dense causal over the whole row against per-document "
                         "(block-causal, what varlen attention does). Fewer is faster.",
}
CHART_NOTES = (  # one caption per chart, in charts order: what it shows and which way is better
    "Document lengths (log scale); the dashed line is the context length.",
    "Share of compute slots that are padding, per batching strategy: lower is better.",
    "Fill rate of each packed sequence: higher is better (1 = no padding).",
    "Mean documents per row along the dataset: flat is better (no part of an epoch unlike the rest).",
)
PAGE_STYLE = """body{font:15px system-ui,sans-serif;margin:1em auto;padding:0 1em;max-width:1250px}
h1{font-size:1.4em;overflow-wrap:anywhere}.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}
td:nth-child(n+2){text-align:right}td.why{text-align:left;color:#555;font-size:.9em;min-width:12em}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 1em}dt{color:#555}dd{margin:0;overflow-wrap:anywhere}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(100%,560px),1fr));gap:1em}
figure{margin:0;min-width:0}figure svg{width:100%;height:auto;display:block}figcaption{color:#555;font-size:.9em}
pre{overflow-x:auto}"""


def page_build(manifest: dict | None) -> dict | None:
    """What the page's header says about the build, from its manifest (so `packer verify` redraws it
    from the same file): the settings, the encode engine and the date. No output path: the page is the
    same wherever the dataset is moved; the header shows where it lies by itself."""
    if not manifest:
        return None
    config, tok = manifest.get("config", {}), manifest.get("tokenizer", {})
    engine = tok.get("encode_engine") or {}
    created = manifest.get("created_unix")
    return {"tokenizer": str(tok.get("path", "?")), "tokenizer_sha256": str(tok.get("sha256", ""))[:12],
            "vocab_size": tok.get("vocab_size"), "format": config.get("format", "arrow"),
            "algorithm": config.get("algorithm", "ffd"), "long_docs": config.get("long_docs", "split"),
            "inputs": len(manifest.get("inputs") or ()),
            "engine": " ".join(str(engine[k]) for k in ("name", "check") if engine.get(k)) or None,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(created)) if created else None}


def _header_html(f: dict, build: dict | None) -> str:
    """The page's header: where it lies (its own folder, read by the browser), the build's settings,
    its encode engine and the date it was built (both from manifest.json)."""
    where = "dataset directory" if build else "this page's folder"
    rows = [(where, '<span id="where">the folder holding this page</span>')]
    if build:
        rows += [("tokenizer", html.escape(f"{build['tokenizer']} (vocab {build['vocab_size']:,}, sha256 "
                                           f"{build['tokenizer_sha256']})" if build["vocab_size"] else build["tokenizer"])),
                 ("format", html.escape(build["format"])),
                 ("packing", html.escape(f"{build['algorithm']}, long documents {build['long_docs']}"))]
    rows += [("context length", f"{f['context_length']:,}"), ("batch size, seed", f"{f['batch_size']}, {f['seed']}"),
             ("inputs", html.escape(_source_line(f)))]
    if build and build.get("engine"):
        rows.append(("encode engine", html.escape(build["engine"] + " (every engine gives the tokenizer's own ids)")))
    if build and build.get("date"):
        rows.append(("built", html.escape(build["date"])))
    items = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
    script = ("<script>document.getElementById('where').textContent=decodeURIComponent("
              r"location.pathname.replace(/\/[^\/]*$/,'')||'.')</script>")
    return f"<dl>{items}</dl>{script}"


def html_page(f: dict, build: dict | None = None) -> str:
    """One HTML page with everything inline, readable on a phone: a header naming the build (`build`:
    page_build(manifest), None for a raw corpus), the tables (they scroll sideways where the screen is
    narrow; each figure that needs it says what it means), the charts as SVG, one per row on a narrow
    screen (packer/stats/svg.py: the page depends on stats.json, the manifest and packer alone, so
    `packer verify` redraws it anywhere), and the JSON figures."""
    charts = "".join(f"<figure>{svg}<figcaption>{html.escape(note)}</figcaption></figure>"
                     for svg, note in zip(panel_svgs(f, LABELS), CHART_NOTES))
    summary = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td><td class=\"why\">"
                      f"{html.escape(EXPLAINED.get(k, ''))}</td></tr>" for k, v in table_rows(f))
    what = "dataset" if f["source"]["kind"] == "dataset" else "corpus"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>packer report</title>
<style>{PAGE_STYLE}</style>
</head><body>
<h1>packer report: {what}</h1>
{_header_html(f, build)}
<h2>Padding by batching strategy</h2>
<p>Compute slots: tokens a model processes, padding included. Padding: the share of them that trains nothing.</p>
<div class="scroll">{_html_table(("strategy", "sequences", "compute slots", "padding", "tokens lost", "packing"), strategy_rows(f))}</div>
<h2>Summary</h2>
<div class="scroll"><table><thead><tr><th>figure</th><th>value</th><th>what it means</th></tr></thead><tbody>{summary}</tbody>\
</table></div>{_scrolled(_sources_html(f))}{_scrolled(_step_balance_html(f))}
<h2>Charts</h2>
<div class="charts">{charts}</div>
<details><summary>figures as JSON (schema {html.escape(f['schema'])})</summary><pre>{html.escape(json.dumps(f, indent=2))}</pre></details>
</body></html>
"""


def _scrolled(section: str) -> str:
    """A section's table in a box that scrolls sideways on a narrow screen."""
    return section.replace("<table>", '<div class="scroll"><table>').replace("</table>", "</table></div>")


def write_html(f: dict, path, build: dict | None = None) -> None:
    """`html_page(f, build)` as a file."""
    with open(path, "w", encoding="utf-8") as out:
        out.write(html_page(f, build))


MIXTURE_HEAD = ("source", "rows", "tokens", "weight", "sequence share", "token share", "repetition")


def mixture_rows(m: dict) -> list[tuple[str, ...]]:
    """One row per blended source (packer.stats.mixture): its size, shares, repetition per blended
    epoch, and with a budget its sequences, tokens and epochs in that budget."""
    rows = []
    for s in m["sources"]:
        row = (s["name"], f"{s['sequences']:,}", f"{s['tokens']:,}", f"{s['weight']:.4f}", _pct(s["sequence_share"]),
               _pct(s["token_share"]), f"{s['repetition']:.3f}x")
        if m["budget_tokens"]:
            row += (f"{s['budget_sequences']:,.0f}", f"{s['budget_tokens']:,.0f}", f"{s['epochs']:.3f}")
        rows.append(row)
    return rows


def _mixture_head(m: dict) -> tuple[str, ...]:
    return MIXTURE_HEAD + (("budget sequences", "budget tokens", "epochs") if m["budget_tokens"] else ())


def _mixture_line(m: dict) -> str:
    line = (f"blend by {m['mix_by']}: {m['num_samples']:,} sequences a blended epoch, "
            f"{m['tokens_per_sample']:,.1f} tokens a sequence on average")
    if m["budget_tokens"]:
        line += f"; budget {m['budget_tokens']:,} tokens = {m['budget_samples']:,.0f} sequences"
    return line


def format_mixture(m: dict) -> str:
    """The printed mixture report: one line on the blend, then one row per source."""
    return "\n".join([_mixture_line(m), "", *_aligned([_mixture_head(m)] + mixture_rows(m))])


def mixture_figure(m: dict):
    """Two charts: weight, sequence share and token share per source; and how often each source's rows
    repeat (per blended epoch, and in the budget when one is given), with 1x marked."""
    fig = _figure((12.0, 4.5), REPORT_DPI)
    share_ax, rep_ax = fig.subplots(1, 2)
    names = [s["name"] for s in m["sources"]]
    y = np.arange(len(names))
    for k, (key, label) in enumerate((("weight", "weight"), ("sequence_share", "share of sequences"),
                                      ("token_share", "share of tokens"))):
        share_ax.barh(y + (k - 1) * 0.27, [s[key] for s in m["sources"]], height=0.27, label=label)
    share_ax.set_yticks(y, names)
    share_ax.invert_yaxis()
    share_ax.set_xlabel("share")
    share_ax.set_title(f"mixture (blend by {m['mix_by']})")
    share_ax.legend(fontsize=8)
    keys = [("repetition", "per blended epoch")] + ([("epochs", "in the budget")] if m["budget_tokens"] else [])
    for k, (key, label) in enumerate(keys):
        rep_ax.barh(y + (k - (len(keys) - 1) / 2) * 0.4, [s[key] for s in m["sources"]], height=0.4, label=label)
    rep_ax.axvline(1.0, color="crimson", linestyle="--", label="each row once")
    rep_ax.set_yticks(y, names)
    rep_ax.invert_yaxis()
    rep_ax.set_xlabel("times each row is seen")
    rep_ax.set_title("repetition")
    rep_ax.legend(fontsize=8)
    fig.subplots_adjust(left=0.08, right=0.97, top=0.88, bottom=0.14, wspace=0.35)
    return fig


def mixture_html(m: dict) -> str:
    """The mixture report as one self-contained HTML page: the table, the charts inline, the JSON."""
    try:
        buf = io.BytesIO()
        mixture_figure(m).savefig(buf, format="png")
        img = f'<img alt="mixture charts" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'
    except ValueError as e:
        img = f"<p><em>{html.escape(str(e))}</em></p>"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>packer mixture</title>
<style>body{{font:14px system-ui,sans-serif;margin:2em;max-width:1250px}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:left}}td:nth-child(n+2){{text-align:right}}img{{max-width:100%}}</style>
</head><body>
<h1>packer mixture</h1>
<p>{html.escape(_mixture_line(m))}</p>
{_html_table(_mixture_head(m), mixture_rows(m))}
{img}
<details><summary>figures as JSON (schema {html.escape(m['schema'])})</summary><pre>{html.escape(json.dumps(m, indent=2))}</pre></details>
</body></html>
"""


_CHARTS = re.compile(rb'<svg xmlns=.*?</svg>|<img alt="charts" src="data:image/png;base64,[^"]*">|<p><em>pictures need matplotlib[^<]*</em></p>', re.S)


def _without_charts(page: bytes) -> bytes:
    """A page with its charts cut out: a page written before 2026-12-04 holds a matplotlib PNG (only
    the same matplotlib redraws it byte for byte) or the line saying how to install it; the rest of
    it must still be what stats.json gives."""
    return _CHARTS.sub(b"", page, count=1)


def check_report(path, manifest: dict | None = None):
    """A dataset's report.html is the page its stats.json gives (deterministic); ValueError naming
    the file otherwise. Nothing to check without either file. `manifest`: the dataset's, already read (None:
    read from `path`, where there is one)."""
    from packer.io import fs
    from packer.store.manifest import MANIFEST, REPORT, STATS, read_manifest, read_stats

    path = fs.location(path)
    report, stats = path / REPORT, path / STATS
    if not (stats.is_file() and report.is_file()):  # the page is optional: only `packer run` wrote it before 2026-12
        return
    page, figures = report.read_bytes(), read_stats(stats)
    if b'<meta name="viewport"' in page:  # written since 2026-12-05: the header names the build from its manifest
        if manifest is None and (path / MANIFEST).is_file():
            manifest = read_manifest(path)
        want = html_page(figures, page_build(manifest)).encode()
    else:
        want = _page_before_header(figures).encode("utf-8")
    if page != want and (b"<svg xmlns=" in page or _without_charts(page) != _without_charts(want)):
        raise ValueError(f"{fs.redact(report)}: not the page this dataset's stats.json gives (edited, or of another "
                         "build); rebuild, or delete it")
