"""Every script in benchmarks/ runs: each one's smallest mode (`--smoke`, seconds long), so a benchmark
cannot rot unseen (bench_stream.py crashed on main on a manifest check: its shard copies kept the
original checksums file). A new script is picked up by the glob and must have --smoke too.

The default run takes the quick ones (35-50 s together on 2 busy shared cores); the ones whose
smallest run still builds several datasets, starts Ray, imports TRL or compiles attention are
marked slow (`pytest -m slow tests/test_benchmarks.py`: all pass, 9 minutes there). benchmarks/gpu_check.sh needs a GPU and
is not run here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

BENCHMARKS = ROOT / "benchmarks"
SLOW = {  # smallest run over ~10 s on 2 shared cores, or needing a git worktree (compare_builds)
    "bench_binpack.py", "bench_blend.py", "bench_cores.py", "bench_engines.py", "bench_executors.py",
    "bench_huge_doc.py", "bench_loader.py", "bench_online.py", "bench_parquet.py", "bench_role_mask.py",
    "bench_sft_labels.py", "bench_tokenize.py", "bench_train.py", "bench_balance.py", "compare_builds.py",
    "corruption_matrix.py",
}
EXTRA = {"compare_builds.py": ["--ref", "HEAD"],  # against this checkout's own HEAD: identical builds
         "bench_pipeline_split.py": ["--markdown", "--json", "{tmp}/rows.json"]}  # docs/engines.md's table, its rows


def _scripts():
    for path in sorted(BENCHMARKS.glob("*.py")):
        marks = [pytest.mark.slow] if path.name in SLOW else []
        yield pytest.param(path, id=path.stem, marks=marks)


@pytest.mark.parametrize("script", _scripts())
def test_benchmark_smoke_run(script, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # TMPDIR left as is: Ray's socket paths must stay under 108 bytes
    extra = [a.format(tmp=tmp_path) for a in EXTRA.get(script.name, [])]
    done = subprocess.run([sys.executable, str(script), "--smoke", *extra], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{script.name} --smoke exited {done.returncode}:\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert len(done.stdout.strip().splitlines()) >= 3, done.stdout  # its header and a table
    if script.name == "bench_pipeline_split.py":  # every --json row is a --markdown line, hf's row among them
        rows = json.loads((tmp_path / "rows.json").read_text())["rows"]
        assert {r["engine"] for r in rows} == {"tiktoken", "hf"}, rows
        assert all(f"| {r['corpus']} | {r['tokenizer']} | {r['engine']} | {r['workers']} | {r['build/batch_fast']:.2f} |"
                   in done.stdout for r in rows), done.stdout


def test_every_benchmark_has_a_smoke_mode():
    """Cheap, in the default run: each script's --help offers --smoke (the slow ones' runs are marked)."""
    for path in sorted(BENCHMARKS.glob("*.py")):
        assert '"--smoke"' in path.read_text(encoding="utf-8"), f"{path.name}: add a --smoke mode (the smallest run)"
