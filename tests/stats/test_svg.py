"""The report page's SVG charts: bars read back against the figures, the same text without matplotlib,
old pages (a matplotlib PNG) still verified, and a build that imports no matplotlib (nor pandas)."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from conftest import ROOT, TOKENIZER

from packer.stats import report
from packer.stats.figures import corpus_stats
from packer.stats.svg import charts_svg

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def figures():
    return corpus_stats([3, 10, 5, 700, 40, 41, 2, 9000], 64, batch_size=2)


def _panels(f):
    root = ET.fromstring(charts_svg(f, report.LABELS, "title"))
    return root, root.findall(f"{SVG}g")


def _bars(panel, color):
    return [r for r in panel.findall(f"{SVG}rect") if r.get("fill") == color]


def test_length_bars_are_the_histogram(figures):
    _, (lengths, *_) = _panels(figures)
    counts = [c for c in figures["lengths"]["histogram"]["counts"] if c]
    heights = [float(r.get("height")) for r in _bars(lengths, "#47a")]
    assert len(heights) == len(counts) == 7  # one bar per non-empty bin, in order
    unit = heights[0] / counts[0]
    assert all(abs(h - c * unit) < 0.1 for h, c in zip(heights, counts))
    xs = [float(r.get("x")) for r in _bars(lengths, "#47a")]
    assert xs == sorted(xs) and "context 64" in ET.tostring(lengths, encoding="unicode")


def test_strategy_bars_follow_the_padding_shares(figures):
    _, (_, strategies, *_) = _panels(figures)
    bars = [r for r in strategies.findall(f"{SVG}rect") if r.get("fill") in ("#4a4", "#c44")]
    keys = list(figures["strategies"])
    shares = [figures["strategies"][k]["padding_share"] for k in keys]
    assert len(bars) == len(shares) == 6
    widths = [float(r.get("width")) for r in bars]
    k = max(range(6), key=shares.__getitem__)
    assert all(abs(w - s / shares[k] * widths[k]) < 0.15 for w, s in zip(widths, shares))
    assert [r.get("fill") for r in bars] == ["#4a4" if k.startswith("pack") else "#c44" for k in keys]
    text = ET.tostring(strategies, encoding="unicode")
    assert all(label.format(B=2) in text for label in report.LABELS.values())


def test_fill_and_trend_only_for_packed_figures(figures):
    root, panels = _panels(figures)
    assert len(panels) == 4 and root.get("viewBox") == "0 0 1200 800"
    fill, trend = panels[2], panels[3]
    assert sum(figures["packing"]["fill_histogram"]["counts"]) > 0 and _bars(fill, "#4a4")
    points = trend.find(f"{SVG}polyline").get("points").split()
    assert len(points) == len(figures["packing"]["trend_output_order"]["docs_by_group"])
    unpacked = {k: v for k, v in figures.items() if k != "packing"}
    assert len(_panels(unpacked)[1]) == 2


def test_the_page_is_the_same_without_matplotlib(figures, monkeypatch):
    page = report.html_page(figures)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    assert report.html_page(figures) == page and "<svg xmlns=" in page and "<img" not in page


def test_a_page_with_the_old_png_still_verifies_and_an_edit_does_not(figures, tmp_path):
    import json

    (tmp_path / "stats.json").write_text(json.dumps(figures), encoding="utf-8")
    page = report.html_page(json.loads((tmp_path / "stats.json").read_text()))
    (tmp_path / "report.html").write_text(page, encoding="utf-8")
    report.check_report(tmp_path)
    then = report._page_before_header(figures)  # the page before 2026-12-05: no header, one chart
    png = base64.b64encode(b"\x89PNG any bytes").decode()
    old = re.sub(r"<svg xmlns=.*?</svg>", f'<img alt="charts" src="data:image/png;base64,{png}">', then, flags=re.S)
    hint = re.sub(r"<svg xmlns=.*?</svg>", "<p><em>pictures need matplotlib, which is not installed: pip install "
                  "&#x27;packer[plot]&#x27;</em></p>", then, flags=re.S)
    for ok in (then, old, hint):
        (tmp_path / "report.html").write_text(ok, encoding="utf-8")
        report.check_report(tmp_path)
    for bad in (old.replace("<h2>Summary", "<h2>Summary!", 1), page.replace("<rect", "<rect ", 1), page + " ",
                then.replace("<rect", "<rect ", 1), page.replace("<td>", "<td> ", 1)):
        assert bad not in (page, old, then)
        (tmp_path / "report.html").write_text(bad, encoding="utf-8")
        with pytest.raises(ValueError, match="not the page this dataset's stats.json gives"):
            report.check_report(tmp_path)


def test_a_build_imports_neither_matplotlib_nor_pandas(tmp_path):
    """The page's charts are packer's SVG; the Arrow writer builds arrays without pa.array's pandas check."""
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(f'{{"text": "{"word " * (5 + k)}"}}\n' for k in range(40)), encoding="utf-8")
    code = ("import sys; from packer.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print('matplotlib' in sys.modules, 'pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, "build", str(corpus), "--tokenizer", TOKENIZER, "-o",
                          str(tmp_path / "out"), "--workers", "1", "--quiet"], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False False"
    assert "<svg xmlns=" in (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
