"""The report's four charts as inline SVG text, drawn from the stats figures alone (no matplotlib).

A build's report.html embeds these, so the page is a function of stats.json and of packer alone:
`packer verify` can redraw it anywhere, with or without matplotlib, and a build pays no plotting
library (importing and drawing with matplotlib cost a build 0.7-1.2 s and 65 MB, 2026-12-04).
Every coordinate is printed with one decimal, so the text is the same on every machine.

    charts_svg(f) -> '<svg ... viewBox="0 0 1200 800">' + lengths | strategies / fill | trend
"""

from __future__ import annotations

import html
import math

WIDTH, HEIGHT = 1200, 800  # the page's chart area, as the report PNG's pixels
PANEL_W, PANEL_H = WIDTH // 2, (HEIGHT - 40) // 2  # four panels under a title line
GREEN, RED, BLUE, GREY = "#4a4", "#c44", "#47a", "#888"


def _n(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def _text(x, y, s, size=11, anchor="middle", extra="") -> str:
    return f'<text x="{_n(x)}" y="{_n(y)}" font-size="{size}" text-anchor="{anchor}"{extra}>{html.escape(str(s))}</text>'


def _line(x1, y1, x2, y2, color="#000", extra="") -> str:
    return f'<line x1="{_n(x1)}" y1="{_n(y1)}" x2="{_n(x2)}" y2="{_n(y2)}" stroke="{color}"{extra}/>'


def _rect(x, y, w, h, color, extra="") -> str:
    return f'<rect x="{_n(x)}" y="{_n(y)}" width="{_n(max(w, 0))}" height="{_n(max(h, 0))}" fill="{color}"{extra}/>'


class _Panel:
    """One chart's plot area inside its panel; x and y map data (already scaled: log etc.) to pixels."""

    def __init__(self, col: int, row: int, title: str, xlabel: str, ylabel: str, left: int = 70):
        self.x0, self.y0 = col * PANEL_W + left, 40 + row * PANEL_H + 30
        self.w, self.h = PANEL_W - left - 30, PANEL_H - 90
        self.parts = [_text(col * PANEL_W + PANEL_W / 2, 40 + row * PANEL_H + 18, title, 13, extra=' font-weight="bold"'),
                      _text(self.x0 + self.w / 2, self.y0 + self.h + 36, xlabel)]
        if ylabel:
            cy = self.y0 + self.h / 2
            self.parts.append(_text(self.x0 - 50, cy, ylabel, extra=f' transform="rotate(-90 {_n(self.x0 - 50)} {_n(cy)})"'))
        self.parts.append(_rect(self.x0, self.y0, self.w, self.h, "none", ' stroke="#000"'))

    def x(self, v, lo, hi) -> float:
        return self.x0 + (v - lo) / ((hi - lo) or 1) * self.w

    def y(self, v, lo, hi) -> float:
        return self.y0 + self.h - (v - lo) / ((hi - lo) or 1) * self.h

    def xtick(self, px, label):
        self.parts += [_line(px, self.y0 + self.h, px, self.y0 + self.h + 4), _text(px, self.y0 + self.h + 17, label, 10)]

    def ytick(self, py, label):
        self.parts += [_line(self.x0 - 4, py, self.x0, py), _text(self.x0 - 7, py + 3.5, label, 10, "end")]

    def svg(self) -> str:
        return "<g>" + "".join(self.parts) + "</g>"


def _nice_ticks(hi: float, n: int = 5) -> list[float]:
    """0 and round steps up to hi (1, 2 or 5 times a power of ten)."""
    if hi <= 0:
        return [0.0]
    raw = hi / n
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 5, 10) if m * step >= raw)
    return [k * step for k in range(int(hi / step + 1e-9) + 1)]


def _tick_label(v: float) -> str:
    return f"{v:,.0f}" if v >= 1 or v == 0 else f"{v:g}"


def _lengths(f: dict) -> str:
    hist, ctx = f["lengths"]["histogram"], f["context_length"]
    edges, counts = [float(e) for e in hist["edges"]], hist["counts"]
    p = _Panel(0, 0, "document lengths", "document length (tokens, log scale)", "documents")
    lo, hi = math.log10(max(edges[0], 1)), math.log10(max(edges[-1], ctx * 1.5, 2))
    top = max(max(counts, default=0), 1) * 1.05
    for k in range(math.ceil(lo), math.floor(hi) + 1):
        p.xtick(p.x(k, lo, hi), f"{10 ** k:,}")
    for v in _nice_ticks(top):
        p.ytick(p.y(v, 0, top), _tick_label(v))
    for a, b, c in zip(edges, edges[1:], counts):
        if c:
            xa, xb = p.x(math.log10(max(a, 1)), lo, hi), p.x(math.log10(max(b, 1)), lo, hi)
            p.parts.append(_rect(xa, p.y(c, 0, top), xb - xa, p.y0 + p.h - p.y(c, 0, top), BLUE, ' opacity="0.7"'))
    cx = p.x(math.log10(ctx), lo, hi)
    p.parts += [_line(cx, p.y0, cx, p.y0 + p.h, "crimson", ' stroke-dasharray="6 4"'),
                _text(cx - 4, p.y0 + 14, f"context {ctx:,}", 10, "end", ' fill="crimson"')]
    return p.svg()


def _strategies(f: dict, labels: dict) -> str:
    keys = list(f["strategies"])
    shares = [f["strategies"][k]["padding_share"] for k in keys]
    p = _Panel(1, 0, "padding by batching strategy", "share of compute slots that are padding", "", left=250)
    top = max(max(shares, default=0), 1e-9) * 1.25
    for v in _nice_ticks(top, 4):
        p.xtick(p.x(v, 0, top), f"{v:.0%}" if top >= 0.04 else f"{v:.2%}")
    band = p.h / max(len(keys), 1)
    for i, (k, s) in enumerate(zip(keys, shares)):
        y = p.y0 + i * band
        x1 = p.x(s, 0, top)
        p.parts += [_rect(p.x0, y + band * 0.15, x1 - p.x0, band * 0.7, GREEN if k.startswith("pack") else RED),
                    _text(x1 + 4, y + band / 2 + 4, f"{s:.1%}", 10, "start"),
                    _text(p.x0 - 6, y + band / 2 + 4, labels[k].format(B=f["batch_size"]), 10, "end")]
    return p.svg()


def _fill(f: dict) -> str:
    pk = f["packing"]
    hist = pk["fill_histogram"]
    edges, counts = [float(e) for e in hist["edges"]], hist["counts"]
    p = _Panel(0, 1, f"fill rates ({pk['algorithm']}, mean {pk['fill_rate']:.4f})", "fill rate of a packed sequence",
               "sequences (log scale)")
    lo, hi = edges[0], edges[-1]
    top = math.log10(1 + max(max(counts, default=0), 1)) * 1.05  # log(1 + n): 0 stays 0, as symlog
    for v in _nice_ticks(hi - lo, 5):
        p.xtick(p.x(lo + v, lo, hi), f"{lo + v:g}")
    for k in range(0, math.floor(top) + 1):
        p.ytick(p.y(math.log10(1 + 10 ** k), 0, top), f"{10 ** k:,}")
    for a, b, c in zip(edges, edges[1:], counts):
        if c:
            y = p.y(math.log10(1 + c), 0, top)
            p.parts.append(_rect(p.x(a, lo, hi), y, p.x(b, lo, hi) - p.x(a, lo, hi), p.y0 + p.h - y, GREEN, ' opacity="0.7"'))
    return p.svg()


def _trend(f: dict) -> str:
    pk = f["packing"]
    p = _Panel(1, 1, "composition against position", "tenth of the sequences, by position", "mean documents per sequence")
    lines = [(key, label, dash) for key, label, dash in
             (("trend_packing_order", "packing order", ' stroke-dasharray="6 4"'), ("trend_output_order", "output order (shuffled)", ""))
             if pk[key]]
    n = max((len(pk[key]["docs_by_group"]) for key, _, _ in lines), default=1)
    top = max((max(pk[key]["docs_by_group"], default=0) for key, _, _ in lines), default=0) * 1.15 or 1.0
    for i in range(1, n + 1):
        p.xtick(p.x(i, 0.5, n + 0.5), str(i))
    for v in _nice_ticks(top):
        p.ytick(p.y(v, 0, top), f"{v:g}")  # from zero, so noise does not look like a trend
    for j, (key, label, dash) in enumerate(lines):
        t, color = pk[key], (GREY, BLUE)[key == "trend_output_order"]
        pts = [(p.x(i + 1, 0.5, n + 0.5), p.y(v, 0, top)) for i, v in enumerate(t["docs_by_group"])]
        p.parts.append(f'<polyline points="{" ".join(f"{_n(x)},{_n(y)}" for x, y in pts)}" fill="none" stroke="{color}" '
                       f'stroke-width="2"{dash}/>')
        p.parts += [f'<circle cx="{_n(x)}" cy="{_n(y)}" r="3" fill="{color}"/>' for x, y in pts]
        r = t["docs_correlation"]
        p.parts += [_line(p.x0 + 10, p.y0 + 14 + 16 * j, p.x0 + 34, p.y0 + 14 + 16 * j, color, f' stroke-width="2"{dash}'),
                    _text(p.x0 + 40, p.y0 + 18 + 16 * j, f"{label}: r = {r if r is None else round(r, 3)}", 10, "start")]
    return p.svg()


def panel_svgs(f: dict, labels: dict) -> list[str]:
    """The same charts, each its own <svg> (its panel of the 1200 x 800 canvas as the viewBox), so a
    page can set them side by side on a wide screen and one per row on a phone."""
    drawn = [(_lengths(f), 0, 0), (_strategies(f, labels), 1, 0)]
    if f.get("packing"):
        drawn += [(_fill(f), 0, 1), (_trend(f), 1, 1)]
    return [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" viewBox="{col * PANEL_W} {40 + row * PANEL_H} {PANEL_W} '
            f'{PANEL_H}" font-family="system-ui,sans-serif">{_rect(col * PANEL_W, 40 + row * PANEL_H, PANEL_W, PANEL_H, "#fff")}'
            f'{panel}</svg>' for panel, col, row in drawn]


def charts_svg(f: dict, labels: dict, title: str) -> str:
    """The four charts (the last two only for packed figures) as one <svg> element."""
    panels = [_lengths(f), _strategies(f, labels)]
    if f.get("packing"):
        panels += [_fill(f), _trend(f)]
    return (f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="charts" viewBox="0 0 {WIDTH} {HEIGHT}" '
            f'font-family="system-ui,sans-serif">{_rect(0, 0, WIDTH, HEIGHT, "#fff")}'
            f'{_text(WIDTH / 2, 22, title[:150], 12)}{"".join(panels)}</svg>')
