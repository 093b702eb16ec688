"""Are builds byte-identical to another revision's? Builds the same jobs with REV (a git worktree)
and with this checkout, then compares every output file; manifest.json minus its timestamps.

    python benchmarks/compare_builds.py --ref 6ab1c36        # exit 1 on any difference
    python benchmarks/compare_builds.py --ref main --cases sft-chat,sft-prompt   # only those cases

Against revisions before the streamed planner (2026-12-01), the `jsonl-drop` cases (the ones with
--pack-group) differ by design: grouped plans shuffle bins by buckets (packer/preprocess/plan_groups.py).

Cases: the sample job (context 2048) and the test corpora (sample JSONL, the same as Parquet,
gzip JSONL and blank-line .txt; context 1024, small shards so there are several), each as
arrow and memmap at 1 and 2 workers, plus bfd, truncate and drop (with --pack-group) variants, two named
sources, and the fine-tuning kinds (chat, prompt-completion, auto) on sample_data's records. Prints one row per case.

report.html is compared as what check_report accepts (the page its stats.json and manifest give,
either layout), stats.json byte for byte. Against a REV before block checksums (2026-12-03), the new build's shard-*.sums files are listed as added
and its manifest and ownership record compared without them (the `checksums_*` keys, format_version 2);
every file, checksums included, is also compared between this checkout's builds at 1 and 2 workers.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_data"
VOLATILE = ("created_unix", "build_seconds")
# Files a newer build writes that REV did not (they are listed, not compared): report.html is written
# by `packer build` too since the restructure (before, only `packer run` wrote it); an arrow build writes
# state.json and dataset_info.json for datasets.load_from_disk since its shards became IPC streams.
# .packer-owned.json is packer's record of the files it wrote (packer/preprocess/owned.py), since 2026-12.
ADDED = {"report.html", "state.json", "dataset_info.json", ".packer-owned.json"}


def _corpora(d: Path) -> dict[str, list[str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [json.loads(line)["text"] for p in ("prose.jsonl", "code.jsonl") for line in open(SAMPLE / p, encoding="utf-8")]
    pq.write_table(pa.table({"text": texts}), d / "sample.parquet", row_group_size=500)
    with gzip.open(d / "sample.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in texts[:800])
    (d / "paras.txt").write_text("\n\n".join(t.replace("\n\n", "\n") for t in texts[:600]), encoding="utf-8")
    return {
        "jsonl": [str(SAMPLE / "prose.jsonl"), str(SAMPLE / "code.jsonl")],
        "parquet+gz": [str(d / "sample.parquet"), str(d / "sample.jsonl.gz")],
        "txt": [str(d / "paras.txt")],
    }


def _cases(corpora):
    yield "sample-job", corpora["jsonl"], ["--context-length", "2048"]
    for name, inputs in corpora.items():
        extra = ["--text-split", "blank-line"] if name == "txt" else []
        yield name, inputs, ["--context-length", "1024", "--shard-size", "200000", *extra]
    yield "jsonl-bfd", corpora["jsonl"], ["--context-length", "1024", "--algorithm", "bfd"]
    yield "jsonl-truncate", corpora["jsonl"], ["--context-length", "512", "--long-docs", "truncate", "--no-eos"]
    yield "jsonl-drop", corpora["jsonl"], ["--context-length", "512", "--long-docs", "drop", "--pack-group", "500"]
    prose, code = corpora["jsonl"]
    yield "sources", [], ["--source", f"prose={prose}", "--source", f"code={code}", "--context-length", "1024"]
    sft = [str(SAMPLE / "chat.jsonl"), str(SAMPLE / "prompt_completion.jsonl")]
    yield "sft-auto", sft, ["--context-length", "1024", "--input-kind", "auto", "--long-prompts", "drop"]
    yield "sft-chat", sft[:1], ["--context-length", "512", "--input-kind", "chat", "--train-roles", "assistant"]
    yield "sft-prompt", sft[1:], ["--context-length", "256", "--input-kind", "prompt-completion"]


def _build(code_root: Path, inputs, args, out: Path):
    env = {**os.environ, "PYTHONPATH": str(code_root)}
    cmd = [sys.executable, "-c", "from packer.cli import main; main()", "build", *inputs,
           "--tokenizer", str(SAMPLE / "tokenizer.json"), "--output", str(out), *args]
    done = subprocess.run(cmd, env=env, cwd=code_root, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"build failed with {code_root}: {' '.join(args)}\n{done.stderr[-2000:]}")


def _files(out: Path) -> dict[str, bytes]:
    found = {}
    for p in sorted(out.rglob("*")):
        if p.is_file() and p.name != ".packer.lock":
            data = p.read_bytes()
            if p.name == "manifest.json":
                m = json.loads(data)
                for k in VOLATILE:
                    m.pop(k, None)
                m.get("tokenizer", {}).pop("encode_engine", None)  # which engine ran (since 2026-12-03): same ids
                data = json.dumps(m, sort_keys=True).encode()
            elif p.name == "report.html":  # its layout changed on 2026-12-05 (a header, phone layout): compared as
                sys.path.insert(0, str(ROOT))  # "the page its stats.json and manifest give", checked by this
                from packer.stats.report import check_report  # checkout (a page of before: as it was then drawn)

                check_report(out)
                data = b"the page of its stats.json (packer.stats.report.check_report)"
            elif p.name == ".packer-owned.json":  # without what differs run to run: modification times,
                m = json.loads(data)  # and the manifest's hash (its volatile keys; compared above without them)
                m.get("files", {}).pop("manifest.json", None)
                m.get("files", {}).pop("report.html", None)  # its hash: the page is compared by check_report above
                for entry in m.get("files", {}).values():
                    entry.pop("mtime_ns", None)
                data = json.dumps(m, sort_keys=True).encode()
            found[str(p.relative_to(out))] = data
    return found


SUMS = ".sums"  # packer/store/checksums.py


def _without_checksums(files: dict[str, bytes]) -> dict[str, bytes]:
    """A build's files as a packer before block checksums would have written them (the shards are the same
    bytes; the manifest and the ownership record name the .sums files and the format version)."""
    out = {k: v for k, v in files.items() if not k.endswith(SUMS)}
    if "manifest.json" in out:
        m = json.loads(out["manifest.json"])
        m["format_version"] = 1
        for entry in m.get("shards", []):
            entry.pop("checksums_file", None)
            entry.pop("checksums_sha256", None)
        out["manifest.json"] = json.dumps(m, sort_keys=True).encode()
    if ".packer-owned.json" in out:
        m = json.loads(out[".packer-owned.json"])
        m["files"] = {k: v for k, v in m.get("files", {}).items() if not k.endswith(SUMS)}
        out[".packer-owned.json"] = json.dumps(m, sort_keys=True).encode()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", required=True, help="git revision to compare against")
    ap.add_argument("--cases", default=None, help="comma-separated case names to run (default: all)")
    ap.add_argument("--smoke", action="store_true", help="the smallest run (seconds; tests/test_benchmarks.py runs it)")
    a = ap.parse_args()
    if a.smoke:
        a.cases = a.cases or "sample-job"
    wanted = set(a.cases.split(",")) if a.cases else None
    tmp = Path(tempfile.mkdtemp(prefix="packer-compare-"))
    ref = tmp / "ref"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(ref), a.ref], check=True, capture_output=True)
    failed = 0
    try:
        corpora = _corpora(tmp)
        print(f"{'case':<18} {'format':<8} {'workers':>7} {'files':>5}  result")
        for name, inputs, args in _cases(corpora):
            if wanted is not None and name not in wanted:
                continue
            for fmt in ("arrow", "memmap"):
                one_worker = None
                for workers in (1, 2):
                    outs = []
                    for label, code in (("ref", ref), ("new", ROOT)):
                        out = tmp / f"{name}-{fmt}-{workers}-{label}"
                        _build(code, inputs, [*args, "--format", fmt, "--workers", str(workers)], out)
                        outs.append(_files(out))
                    old, new = outs
                    across = [] if one_worker is None else sorted(k for k in set(one_worker) | set(new)
                                                                  if one_worker.get(k) != new.get(k))
                    one_worker = one_worker or new
                    added = sorted(k for k in ADDED if k in new and k not in old)
                    if not any(k.endswith(SUMS) for k in old):  # REV before block checksums
                        added += sorted(k for k in new if k.endswith(SUMS))
                        new = _without_checksums(new)
                    diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k) and k not in added)
                    diff += [f"{k} (1 vs 2 workers)" for k in across]
                    failed += bool(diff)
                    result = "identical" if not diff else "DIFFER: " + ", ".join(diff)
                    shown = sorted({k if not k.endswith(SUMS) else f"shard-*{SUMS}" for k in added})
                    print(f"{name:<18} {fmt:<8} {workers:>7} {len(old):>5}  {result}" + (f" (+ {', '.join(shown)})" if added else ""))
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(ref)], capture_output=True)
    print(f"{'all identical' if not failed else f'{failed} cases differ'} (ref {a.ref})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
