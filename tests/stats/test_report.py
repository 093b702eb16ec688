"""The report: printed table, PNG charts (size and content), self-contained HTML, the mask
picture read back pixel by pixel, the no-matplotlib message, and `packer show-mask`. The page's SVG
charts: tests/stats/test_svg.py."""

from __future__ import annotations

import html
import json
import struct
import sys
import time

import pytest
from click.testing import CliRunner
from conftest import TOKENIZER

from packer.cli import main
from packer.stats import mask_image, report
from packer.stats.figures import corpus_stats
from packer.store.verify import verify_dataset

pytest.importorskip("matplotlib")  # in the dev extra, so CI runs these


def _png_size(path) -> tuple[int, int]:
    data = open(path, "rb").read(24)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def figures():
    return corpus_stats([3, 10, 5], 8, batch_size=2)


def test_table_holds_the_hand_figures(figures):
    text = report.format_table(figures)
    lines = {line.split("  ")[0]: line for line in text.splitlines()}
    assert lines["pad every document to the context"].split()[-4:] == ["4", "32", "43.75%", "0"]
    assert lines["pad to longest, length-sorted batches of 2"].split()[-4:] == ["4", "22", "18.18%", "0"]
    assert lines["truncate to the context"].split()[-5:] == ["3", "24", "33.33%", "2", "(11.11%)"]
    assert "fill 0.7500, 3 vs lower bound 3 (+0)" in lines["pack, first-fit decreasing"]
    assert "1 / 90%" not in text and "length p50 / p90 / p99 / max  5 / 9 / 10 / 10" in text
    assert "66.67% of documents" not in text and "33.33% of documents, 55.56% of tokens" in text
    assert "varlen saves 46.88%" in text


def test_png_has_the_expected_size(figures, tmp_path):
    path = tmp_path / "r.png"
    report.write_png(figures, path)
    w, h = (int(x * report.REPORT_DPI) for x in report.REPORT_INCHES)
    assert _png_size(path) == (w, h) and path.stat().st_size > 20_000


def test_html_is_self_contained(figures, tmp_path):
    path = tmp_path / "r.html"
    report.write_html(figures, path)
    page = path.read_text(encoding="utf-8")
    assert page.count("<svg xmlns=") == 4 and "<img" not in page  # one per chart
    assert "http://" not in page.replace("https://json-schema", "").replace('"http://www.w3.org/2000/svg"', "")
    assert "<td>pad every document to the context</td><td>4</td><td>32</td><td>43.75%</td>" in page
    assert "packer.stats/1" in page and page.count("<rect") > 10


def test_without_matplotlib_pngs_say_how_to_install_and_pages_keep_their_charts(figures, sample_dataset, tmp_path, monkeypatch):
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.colors", "matplotlib.patches"):
        monkeypatch.setitem(sys.modules, name, None)  # importing them now fails
    with pytest.raises(ValueError, match=r"pip install 'packer\[plot\]'"):
        report.write_png(figures, tmp_path / "r.png")
    report.write_html(figures, tmp_path / "r.html")  # the page's charts are packer's own SVG
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert page == report.html_page(figures) and "<svg xmlns=" in page and "43.75%" in page
    out = CliRunner().invoke(main, ["show-mask", str(sample_dataset), "--out", str(tmp_path / "m.png")])
    assert out.exit_code == 1 and "packer[plot]" in out.output and not (tmp_path / "m.png").exists()


def _pixel(image, query, key, context_length):
    """RGB at the centre of mask cell (query, key), the axes at mask_image.MASK_AXES of the picture."""
    left, bottom, width, height = mask_image.MASK_AXES
    h, w = image.shape[:2]
    x = int(w * (left + width * (key + 0.5) / context_length))
    y = int(h * (1 - bottom - height + height * (query + 0.5) / context_length))
    return tuple(round(float(c), 2) for c in image[y, x, :3])


def test_mask_picture_shows_the_mask(tmp_path):
    import matplotlib.image

    path = tmp_path / "m.png"
    mask_image.write_mask_png([0, 3, 5, 6], 8, path)
    w, h = (int(x * mask_image.MASK_DPI) for x in mask_image.MASK_INCHES)
    assert _png_size(path) == (w, h)
    image = matplotlib.image.imread(path)
    white, grey = (1.0, 1.0, 1.0), _pixel(image, 7, 7, 8)
    doc0, doc1, doc2 = _pixel(image, 2, 0, 8), _pixel(image, 4, 3, 8), _pixel(image, 5, 5, 8)
    assert len({doc0, doc1, doc2, white, grey}) == 5  # three documents, masked-out, padding
    assert _pixel(image, 0, 2, 8) == white  # causal: query 0 does not see key 2
    assert _pixel(image, 3, 2, 8) == white  # document 1 does not see document 0
    assert _pixel(image, 2, 2, 8) == doc0 and _pixel(image, 1, 0, 8) == doc0
    assert _pixel(image, 7, 0, 8) == grey and _pixel(image, 0, 7, 8) == grey


def test_show_mask_command(sample_dataset, tmp_path):
    runner = CliRunner()
    out = runner.invoke(main, ["show-mask", str(sample_dataset), "--seq", "3", "--out", str(tmp_path / "m.png")])
    assert out.exit_code == 0, out.output
    assert _png_size(tmp_path / "m.png") == (800, 800)
    bad = runner.invoke(main, ["show-mask", str(sample_dataset), "--seq", "100000", "--out", str(tmp_path / "x.png")])
    assert bad.exit_code != 0 and "out of range" in bad.output and not (tmp_path / "x.png").exists()
    from packer.store.dataset import open_dataset

    ds = open_dataset(sample_dataset)
    counts = [len(ds[i][1]) - 1 for i in range(min(len(ds), 64))]
    picked = runner.invoke(main, ["show-mask", str(sample_dataset), "--out", str(tmp_path / "p.png")])
    assert picked.exit_code == 0, picked.output
    seq = int(picked.output.split(": sequence ")[1].split(" ")[0])
    several = sorted(c for c in counts if c >= 2)
    assert len(several) > 4 and counts[0] == 1  # row 0 would show one document
    quarter = len(several) // 4
    assert several[quarter] <= counts[seq] <= several[-1 - quarter] and f"({counts[seq]} documents" in picked.output


def test_stats_command_writes_plot_and_html(sample_dataset, tmp_path):
    out = CliRunner().invoke(main, ["stats", str(sample_dataset), "--plot", str(tmp_path / "s.png"),
                                    "--html", str(tmp_path / "s.html")])
    assert out.exit_code == 0, out.output
    assert _png_size(tmp_path / "s.png") == (1200, 800)
    page = (tmp_path / "s.html").read_text(encoding="utf-8")
    assert "<svg xmlns=" in page and "<dt>dataset directory</dt>" in page and "tokenizer.json (vocab" in page


def test_run_writes_the_report_beside_the_shards(tmp_path):
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(f'{{"text": "{"word " * (5 + 37 * k % 300)}"}}\n' for k in range(60)), encoding="utf-8")
    job = tmp_path / "job.toml"
    job.write_text(f'inputs = ["{corpus}"]\ntokenizer = "{TOKENIZER}"\noutput = "{tmp_path / "out"}"\n'
                   "workers = 1\n[config]\ncontext_length = 256\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["run", str(job)])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert "report:" in result.output and "<svg xmlns=" in page and "pack, first-fit decreasing" in page
    # the header names the build's engine and its date, both read from the manifest (so verify redraws it)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text(encoding="utf-8"))
    engine = manifest["tokenizer"]["encode_engine"]
    built = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(manifest["created_unix"]))
    assert f"<dt>encode engine</dt><dd>{engine['name']} {engine['check']} (" in page
    assert f"<dt>built</dt><dd>{built}</dd>" in page
    verify_dataset(tmp_path / "out")  # the page is the one its stats.json and manifest give


MEASURE = """<script>
const W = document.documentElement.clientWidth, out = [];
for (const el of document.querySelectorAll('table, svg, figure, .scroll, dl, h1, h2, p, pre, details')) {
  if (el.closest('.scroll') && el.tagName === 'TABLE') continue;  // a wide table scrolls inside its box
  const r = el.getBoundingClientRect();
  if (r.left < -1 || r.right > W + 1) out.push(el.tagName + ' ' + Math.round(r.left) + '..' + Math.round(r.right));
}
const lefts = [...document.querySelectorAll('figure')].map(f => Math.round(f.getBoundingClientRect().left));
(window.parent || window).document.body.setAttribute('data-measured', JSON.stringify({W, page: document.documentElement.scrollWidth,
  overflow: out, columns: new Set(lefts).size, charts: lefts.length,
  scrollers: [...document.querySelectorAll('.scroll')].filter(s => s.scrollWidth > s.clientWidth).length}));
</script>"""


def _chromium():
    import shutil

    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        if found := shutil.which(name):
            return found
    pytest.skip("no headless Chromium here (Debian/Ubuntu: apt-get install chromium); the page is checked in a real "
                "browser only where one is installed")


def test_report_opens_on_a_phone_and_a_desktop_in_a_real_browser(sample_dataset, tmp_path):
    """report.html in headless Chromium at 1280 and 390 px wide: screenshots of both, no table or chart
    wider than the screen (wide tables scroll in their own box), one chart per row on the phone."""
    import json
    import subprocess

    chromium = _chromium()
    page = (sample_dataset / "report.html").read_text(encoding="utf-8")
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in page
    probe = tmp_path / "report.html"
    probe.write_text(page.replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--allow-file-access-from-files"]
    measured = {}
    for width in (1280, 390):
        shot = tmp_path / f"report-{width}.png"
        done = subprocess.run([chromium, *flags, f"--window-size={width},2400", "--screenshot=" + str(shot),
                               (sample_dataset / "report.html").as_uri()], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and _png_size(shot) == (width, 2400), done.stderr[-2000:]
        # measured in a frame exactly `width` CSS pixels wide (headless windows are at least 500 px wide)
        host = tmp_path / f"host-{width}.html"
        host.write_text(f'<!doctype html><body style="margin:0"><iframe src="{probe.name}" style="border:0;width:{width}px;'
                        'height:2400px"></iframe></body>', encoding="utf-8")
        done = subprocess.run([chromium, *flags, "--window-size=1400,2400", "--dump-dom", host.as_uri()],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and 'data-measured="' in done.stdout, done.stderr[-2000:]
        measured[width] = json.loads(html.unescape(done.stdout.split('data-measured="', 1)[1].split('"', 1)[0]))
    for width, m in measured.items():
        assert m["W"] == width and m["page"] <= width, m  # the page itself never scrolls sideways
        assert m["overflow"] == [], m
        assert m["charts"] == 4, m
    assert measured[390]["columns"] == 1 and measured[1280]["columns"] == 2, measured
    assert measured[390]["scrollers"] >= 1  # the strategy table is wider than a phone: it scrolls, whole
    assert "dataset directory" in page and "tokenizer.json (vocab" in page and "context length" in page
