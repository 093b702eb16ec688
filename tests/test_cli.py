"""The CLI through click's runner: the happy path and clear one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner
from conftest import ROOT, SAMPLE_INPUTS, TOKENIZER, run_packer

from packer.cli import main


def _build(runner, out, *extra):
    return runner.invoke(
        main,
        ["build", *SAMPLE_INPUTS, "--tokenizer", TOKENIZER, "--context-length", "512",
         "--output", str(out), "--workers", "1", *extra],
    )


def test_build_prints_summary_then_verify_stats_inspect(tmp_path):
    runner = CliRunner()
    out = tmp_path / "ds"
    result = _build(runner, out)
    assert result.exit_code == 0, result.output
    assert "fill rate:" in result.output and "sequences of 512" in result.output
    assert "3,894 accepted of 3,894 read" in result.output

    again = _build(runner, out)
    assert again.exit_code == 0 and "already complete" in again.output

    verify = runner.invoke(main, ["verify", str(out)])
    assert verify.exit_code == 0 and verify.output.startswith("ok:")

    stats = runner.invoke(main, ["stats", str(out), "--json", str(tmp_path / "s.json")])
    assert stats.exit_code == 0, stats.output
    figures = json.loads((tmp_path / "s.json").read_text())
    assert 0.9 < figures["packing"]["fill_rate"] <= 1.0
    strategies = figures["strategies"]
    assert strategies["pad_to_context"]["padding_share"] > strategies["pack_ffd"]["padding_share"]

    inspect = runner.invoke(main, ["inspect", str(out), "--seq", "0"])
    assert inspect.exit_code == 0 and "document 0: tokens [0," in inspect.output
    raw = runner.invoke(main, ["inspect", str(out), "--seq", "0", "--raw"])
    assert raw.exit_code == 0 and raw.output.split("\n")[2].split()[0].isdigit()
    raw_manifest = runner.invoke(main, ["inspect", str(out), "--json"])
    assert raw_manifest.exit_code == 0 and json.loads(raw_manifest.output) == json.loads((out / "manifest.json").read_text())


def test_verify_fails_on_a_corrupted_shard(tmp_path):
    runner = CliRunner()
    out = tmp_path / "ds"
    assert _build(runner, out).exit_code == 0
    shard = next(out.glob("shard-*.arrow"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    result = runner.invoke(main, ["verify", str(out)])
    assert result.exit_code == 1
    assert "sha256 does not match" in result.output and shard.name in result.output


def test_bad_path_is_one_clear_line(tmp_path):
    result = CliRunner().invoke(
        main, ["build", str(tmp_path / "nope.jsonl"), "--tokenizer", TOKENIZER, "--output", str(tmp_path / "o")]
    )
    assert result.exit_code == 1
    assert "input not found" in result.output and "nope.jsonl" in result.output
    assert "Traceback" not in result.output


def test_bad_tokenizer_path(tmp_path):
    result = CliRunner().invoke(
        main, ["build", SAMPLE_INPUTS[0], "--tokenizer", str(tmp_path / "tok.json"), "--output", str(tmp_path / "o")]
    )
    assert result.exit_code == 1 and "tokenizer not found" in result.output


def test_bad_flag_value(tmp_path):
    result = CliRunner().invoke(
        main, ["build", SAMPLE_INPUTS[0], "--tokenizer", TOKENIZER, "--output", str(tmp_path), "--context-length", "0"]
    )
    assert result.exit_code == 2
    assert "--context-length" in result.output


def test_unknown_flag():
    result = CliRunner().invoke(main, ["build", "--frobnicate"])
    assert result.exit_code == 2 and "No such option" in result.output and "--frobnicate" in result.output


@pytest.mark.parametrize("args", [["build", "--frobnicate"], ["biuld"], ["--bogus"], ["build", "x.jsonl"],
                                  ["build", "x", "--tokenizer", "t", "-o", "o", "--context-length", "0"]])
def test_a_usage_error_is_one_line_and_exits_2(args):
    """Issue 35 item 8: what README says: one `Error:` line naming the command's --help, exit 2."""
    code, output = run_packer(args)
    lines = [line for line in output.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("Error: ") and "--help')" in lines[0], output


def test_a_context_that_trains_nothing_is_refused(tmp_path):
    """Context 1: every token is its document's first, labelled -100; refused, the minimum stated, by the CLI
    (a usage error) and by the config a pipeline file builds (one Error: line, exit 1)."""
    from packer.config import BuildConfig

    with pytest.raises(ValueError, match="context_length must be at least 2, got 1: .* nothing trains"):
        BuildConfig(context_length=1)
    assert BuildConfig(context_length=2).context_length == 2
    code, output = run_packer(["build", SAMPLE_INPUTS[0], "--tokenizer", TOKENIZER, "-o", str(tmp_path / "o"),
                               "--context-length", "1"])
    assert code == 2 and "1 is not in the range x>=2" in output and not (tmp_path / "o").exists(), output
    job = tmp_path / "job.toml"
    job.write_text(f'inputs = ["{SAMPLE_INPUTS[0]}"]\ntokenizer = "{TOKENIZER}"\noutput = "{tmp_path / "p"}"\n'
                   "[config]\ncontext_length = 1\n", encoding="utf-8")
    code, output = run_packer(["run", str(job)])
    assert code == 1 and output.strip().startswith("Error: ") and len(output.strip().splitlines()) == 1, output
    assert "context_length must be at least 2" in output


def test_run_rejects_unknown_pipeline_keys(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('inputs = ["a.jsonl"]\ntokenizer = "t.json"\noutput = "o"\n[config]\ncontext_lenght = 4\n')
    result = CliRunner().invoke(main, ["run", str(job)])
    assert result.exit_code == 1 and "context_lenght" in result.output


def test_a_build_with_no_sequence_says_so_instead_of_a_fill_rate(tmp_path):
    # was: a corpus with no "text" field (0 accepted), which now fails (test_a_build_that_accepts_nothing_fails);
    # a document longer than the context under --long-docs drop is accepted and still fills no sequence
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"text": "word " * 50}) + "\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["build", str(corpus), "--tokenizer", TOKENIZER, "--output", str(tmp_path / "o"),
                                       "--workers", "1", "--context-length", "8", "--long-docs", "drop"])
    assert "1 accepted of 1 read" in result.output and "fill rate: n/a (no sequences)" in result.output
    assert json.loads((tmp_path / "o" / "manifest.json").read_text())["totals"]["fill_rate"] is None


def test_a_build_that_accepts_nothing_fails_with_its_skip_reasons(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"body": "no text field"}\n' * 3, encoding="utf-8")
    out = tmp_path / "o"
    result = CliRunner().invoke(main, ["build", str(corpus), "--tokenizer", TOKENIZER, "--output", str(out),
                                       "--workers", "1"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "no document accepted: 0 accepted of 3 read (3 skipped: {'missing_field': 3}); e.g." in result.output
    assert f"e.g. missing_field at {corpus}:1" in result.output and "--text-field" in result.output
    assert len(result.output.strip().splitlines()) <= 3  # the tokenize line, then the error in two lines
    assert not out.exists() or sorted(p.name for p in out.iterdir()) == []  # nothing that looks like a dataset
    fixed = CliRunner().invoke(main, ["build", str(corpus), "--tokenizer", TOKENIZER, "--output", str(out),
                                      "--workers", "1", "--text-field", "body"])
    assert fixed.exit_code == 0 and "3 accepted of 3 read" in fixed.output  # the fix needs no --overwrite


def test_max_skip_fraction_fails_a_build_that_skips_more(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "a document"}\n' * 97 + '{"text": ""}\n' * 3, encoding="utf-8")
    args = ["build", str(corpus), "--tokenizer", TOKENIZER, "--output", str(tmp_path / "o"), "--workers", "1"]
    result = CliRunner().invoke(main, [*args, "--max-skip-fraction", "0.01"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "3.00% of 100 documents read were skipped (3), over --max-skip-fraction 0.01: {'empty_text': 3}" in result.output
    assert not (tmp_path / "o" / "manifest.json").exists()
    ok = CliRunner().invoke(main, [*args, "--max-skip-fraction", "0.05"])
    assert ok.exit_code == 0 and "97 accepted of 100 read" in ok.output
    assert json.loads((tmp_path / "o" / "manifest.json").read_text())["config"]["max_skip_fraction"] == 0.05
    for bad in ("1", "-0.1"):
        assert CliRunner().invoke(main, [*args, "--max-skip-fraction", bad]).exit_code == 2


def test_progress_in_a_log_is_whole_lines_and_quiet_has_none(tmp_path, monkeypatch):
    from packer.io import progress

    monkeypatch.setattr(progress, "INTERVAL", 0.0)  # a line on every update
    result = _build(CliRunner(), tmp_path / "a", "--unit-bytes", "200000")  # stderr is not a terminal here
    assert result.exit_code == 0 and "\r" not in result.output
    lines = result.output.splitlines()
    tokenize = [line for line in lines if line.startswith("tokenize: ")]
    assert len(tokenize) > 3 and tokenize[-1].startswith("tokenize: 3.27MB of 3.27MB (100%), ")
    assert "docs/s" in tokenize[0] and any(line.startswith("write: ") and " tok/s" in line for line in lines)
    assert not any(line.startswith("config: ") for line in lines)  # only with --debug
    quiet = _build(CliRunner(), tmp_path / "b", "--quiet")
    assert quiet.exit_code == 0 and quiet.output.startswith("documents: 3,894 accepted of 3,894 read")
    assert not any(line.startswith(("tokenize", "write", "config")) for line in quiet.output.splitlines())
    debug = _build(CliRunner(), tmp_path / "c", "--debug")
    assert json.loads(debug.output.split("config: ", 1)[1].splitlines()[0])["context_length"] == 512


def test_debug_adds_the_traceback_to_the_one_line(tmp_path):
    args = ["build", str(tmp_path / "nope.jsonl"), "--tokenizer", TOKENIZER, "--output", str(tmp_path / "o")]
    plain = CliRunner().invoke(main, args)
    debug = CliRunner().invoke(main, [*args, "--debug"])
    assert plain.exit_code == debug.exit_code == 1 and "Traceback" not in plain.output
    assert "Traceback" in debug.output and "input not found" in debug.output.splitlines()[-1]
    assert "Traceback" in CliRunner().invoke(main, ["--debug", *args]).output  # before the command too


def test_a_full_disk_is_one_line_and_leaves_no_temporary_shard(tmp_path, monkeypatch):
    monkeypatch.setenv("PACKER_FAILPOINTS", "write:1=enospc")
    out = tmp_path / "ds"
    args = ["build", *SAMPLE_INPUTS, "--tokenizer", TOKENIZER, "--context-length", "512", "--output", str(out),
            "--shard-size", "50000", "--quiet"]
    for workers in ("1", "2"):
        result = CliRunner().invoke(main, [*args, "--workers", workers])
        assert result.exit_code == 1 and "Traceback" not in result.output, result.output
        assert result.output.strip().splitlines() == [
            f"Error: {out}: No space left on device (failpoint write:1) (ENOSPC); free space there (or choose "
            "another --output), then run the same command to resume"]
        assert not list(out.glob("shard-*.tmp*")) and not (out / "manifest.json").exists()
    monkeypatch.delenv("PACKER_FAILPOINTS")
    assert CliRunner().invoke(main, [*args, "--workers", "2"]).exit_code == 0
    assert CliRunner().invoke(main, ["verify", str(out)]).exit_code == 0


def test_a_full_disk_in_a_worker_is_one_line_with_the_fix(tmp_path):
    # a subprocess: the pool's forkserver keeps the environment of the first build in this process
    out = tmp_path / "ds"
    cmd = [sys.executable, "-m", "packer.cli", "build", *SAMPLE_INPUTS, "--tokenizer", TOKENIZER, "--output", str(out),
           "--context-length", "512", "--shard-size", "50000", "--workers", "2", "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PACKER_FAILPOINTS": "write-shard:2=enospc"}  # before its renames
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and result.stdout == "", result.stderr
    assert result.stderr.strip().splitlines() == [
        "Error: write_shard, shard 2: [Errno 28] No space left on device (failpoint write-shard:2); free space there "
        "(or choose another --output), then run the same command to resume"]
    assert not list(out.glob("shard-*.tmp*")) and not (out / "manifest.json").exists()


def test_sigterm_stops_with_one_line_and_the_same_command_resumes(tmp_path):
    out = tmp_path / "ds"
    cmd = [sys.executable, "-m", "packer.cli", "build", *SAMPLE_INPUTS, "--tokenizer", TOKENIZER, "--output", str(out),
           "--context-length", "512", "--workers", "1", "--unit-bytes", "200000"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PACKER_FAILPOINTS": "tokenize:2=term"}
    stopped = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert stopped.returncode == 143 and "Traceback" not in stopped.stderr, stopped.stderr
    assert stopped.stderr.strip().splitlines()[-1] == (
        "stopped (SIGTERM): finished work units are kept; run the same command to resume")
    assert len(list((out / "_work" / "units").glob("*.json"))) == 2 and not (out / "manifest.json").exists()
    del env["PACKER_FAILPOINTS"]
    resumed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0 and "3,894 accepted of 3,894 read" in resumed.stdout, resumed.stderr
    said = [line for line in resumed.stderr.splitlines() if line.startswith("tokenize: resumed: ")]
    n_units = len(list((out / "_work" / "units").glob("*.json"))) if (out / "_work").exists() else None
    assert len(said) == 1 and said[0].endswith(" units) done by an earlier run") and "(2 of " in said[0], resumed.stderr
    assert n_units is None or f"(2 of {n_units} units)" in said[0]
    assert "resumed:   an earlier run had tokenized 2 units and written 0 shards; this run did the rest" in resumed.stdout
    assert CliRunner().invoke(main, ["verify", str(out)]).exit_code == 0


def test_verify_quick_says_what_it_skips_and_inspect_refuses_a_swapped_tokenizer(tmp_path):
    runner = CliRunner()
    out = tmp_path / "ds"
    assert _build(runner, out).exit_code == 0
    full = runner.invoke(main, ["verify", str(out)])
    assert full.exit_code == 0 and "skipped" not in full.output
    quick = runner.invoke(main, ["verify", str(out), "--quick"])
    assert quick.exit_code == 0 and "skipped (--quick): shard sha256, block checksums, token ids below the vocabulary" in quick.output
    tok = out / "tokenizer.json"
    tok.write_text(tok.read_text(encoding="utf-8").replace('"<|endoftext|>"', '"<|endoftexx|>"', 1), encoding="utf-8")
    swapped = runner.invoke(main, ["inspect", str(out), "--seq", "0"])
    assert swapped.exit_code == 1 and "tokenizer.json" in swapped.output and "Traceback" not in swapped.output


def test_inspect_shows_untrained_spans_of_a_masked_dataset(tmp_path):
    import numpy as np
    from masked_data import build_masked

    from packer.store.dataset import open_dataset

    out = build_masked(tmp_path / "sft")
    ds = open_dataset(out)
    seq = max(range(len(ds)), key=lambda i: len(ds[i][1]))  # the row with the most documents
    tokens, offsets = ds[seq]
    mask = ds.mask_views([seq])[0]
    runner = CliRunner()
    raw = runner.invoke(main, ["inspect", str(out), "--seq", str(seq), "--raw"])
    assert raw.exit_code == 0, raw.output
    lines = raw.output.splitlines()
    assert lines[0] == f"sequence {seq}: {len(tokens)} tokens, {len(offsets) - 1} documents, {int(mask.sum())} trained"
    assert lines[1].startswith("legend: [untrained] loss mask 0")
    got_ids, got_mask = [], []  # the printed ids, and the mask read back from the brackets
    for line in lines[2:]:
        if line.startswith("──── document"):
            continue
        inside = False
        for word in line.split():
            inside = inside or word.startswith("[")
            got_ids.append(int(word.strip("[]")))
            got_mask.append(0 if inside else 1)
            inside = inside and not word.endswith("]")
    assert got_ids == tokens.tolist() and got_mask == mask.tolist() and 0 < sum(got_mask) < len(got_mask)

    text = runner.invoke(main, ["inspect", str(out), "--seq", str(seq)])
    assert text.exit_code == 0 and "\x1b[" not in text.output  # not a terminal: plain text
    assert text.output.count("──── document") == len(offsets) - 1 and "[" in text.output
    styled = runner.invoke(main, ["inspect", str(out), "--seq", str(seq)], color=True)
    assert "\x1b[2m[" in styled.output  # dim, on a terminal

    plain = tmp_path / "plain"
    assert _build(runner, plain).exit_code == 0
    unmasked = runner.invoke(main, ["inspect", str(plain), "--seq", "0", "--raw"])
    body = [line for line in unmasked.output.splitlines()[1:] if not line.startswith("──── document")]
    assert "legend" not in unmasked.output and "trained" not in unmasked.output
    assert all(np.array(line.split(), dtype=np.int64).size for line in body)  # ids only, no brackets


CHOICES_SCRIPT = """
import sys, types
from packer.preprocess.executors import EXECUTORS, InlineExecutor
from packer.store import formats
formats.FORMATS["rows"] = types.ModuleType("rows_format")
EXECUTORS["in-order"] = lambda job: InlineExecutor()
from packer.cli import main
main(sys.argv[1:])
"""


def test_format_and_executor_choices_come_from_their_tables():
    """`packer build --help` lists a format or executor registered in its table (one line there, none
    in config or the CLI) among the choices of --format and --executor."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", CHOICES_SCRIPT, "build", "--help"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    text = " ".join(done.stdout.split())
    from packer.store.formats import FORMATS

    assert f"[{'|'.join([*FORMATS, 'rows'])}]" in text and "[local|ray|in-order]" in text
    plain = CliRunner().invoke(main, ["build", "--help"])
    assert f"[{'|'.join(FORMATS)}]" in " ".join(plain.output.split()) and "rows" not in plain.output


def test_inspect_without_seq_is_a_readable_summary(tmp_path):
    runner = CliRunner()
    out = tmp_path / "ds"
    assert _build(runner, out, "--shard-size", "60000").exit_code == 0
    m = json.loads((out / "manifest.json").read_text())
    summary = runner.invoke(main, ["inspect", str(out)])
    assert summary.exit_code == 0 and not summary.output.lstrip().startswith("{")
    lines = summary.output.splitlines()
    topics = [line.split(":", 1)[0] for line in lines if not line.startswith(" ")]
    assert topics == ["dataset", "documents", "eos", "tokens", "tokenizer", "config", "shards"], summary.output
    t = m["totals"]
    assert lines[0].startswith(f"dataset:   {out}: {t['sequences']:,} sequences of 512 tokens, arrow, {len(m['shards'])} shards")
    assert lines[1] == f"documents: {t['docs_accepted']:,} accepted of {t['docs_read']:,} read"
    assert lines[2] == "eos:       0 documents hold the EOS id 0 inside them"  # text: EOS only as a last token
    assert lines[3] == f"tokens:    {t['tokens_out']:,} stored, fill rate {t['fill_rate']:.4f}"
    config = " ".join(line[11:] for line in lines if line.startswith(("config:", "           ")) and "=" in line)
    assert "context_length=512" in config and "algorithm=ffd" in config
    shards = [line for line in lines if ".arrow" in line]
    assert len(m["shards"]) > 5 and len(shards) == 5 and f"... and {len(m['shards']) - 5} more" in lines[-1]
    first = m["shards"][0]
    assert shards[0].split() == ["shards:", first["file"], f"{first['sequences']:,}", "sequences", f"{first['tokens']:,}",
                                 "tokens", f"{first['documents']:,}", "segments"]


def test_a_reader_that_leaves_early_ends_the_command_quietly(tmp_path):
    """`packer inspect DS | head`: no "Error: Broken pipe", no "Exception ignored", for a large output
    (written while the command runs) and a small one (written when it exits)."""
    out = tmp_path / "ds"
    assert _build(CliRunner(), out).exit_code == 0
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for args in (["--seq", "0", "--raw"], [], ["--json"]):
        read, write = os.pipe()
        os.close(read)  # the reader is gone before the first byte: every write meets EPIPE
        try:
            done = subprocess.run([sys.executable, "-m", "packer.cli", "inspect", str(out), *args], env=env,
                                  stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
        finally:
            os.close(write)
        assert done.stderr == "" and done.returncode == 1, (args, done.stderr)
    shell = subprocess.run(f"{sys.executable} -m packer.cli inspect {out} --seq 0 --raw | head -n 1", shell=True,
                           env=env, capture_output=True, text=True, timeout=120)
    assert shell.stdout.startswith("sequence 0: ") and shell.stderr == ""


def test_build_help_lists_every_option_in_its_section():
    from packer.cli import BUILD_HELP, build

    text = CliRunner().invoke(main, ["build", "--help"]).output
    titles = [line[:-1] for line in text.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert titles == [title for title, _ in BUILD_HELP], text  # every section, in order, and no "Other options"
    at = {title: text.index(f"\n{title}:\n") for title, _ in BUILD_HELP}
    ends = sorted(at.values())[1:] + [len(text)]
    body = {title: text[start:next(e for e in ends if e > start)] for title, start in at.items()}
    flags = [opt for p in build.params if p.param_type_name == "option" for opt in p.opts]
    assert len(flags) > 40
    for title, names in BUILD_HELP:
        for p in build.params:
            if p.name in names and p.param_type_name == "option":
                assert f"  {p.opts[-1]}" in body[title], (title, p.opts)
    assert all(text.count(f" {flag} ") + text.count(f" {flag},") + text.count(f" {flag}\n") >= 1 for flag in flags)


def test_progress_counts_only_this_runs_work_and_moves_before_the_first_update(monkeypatch, capsys):
    import time

    from packer.io import progress

    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(progress, "TICK", 3600.0)
    with progress.Progress("tokenize", 1_000_000, "B", mode="lines", before=600_000, before_note="3 of 5 units") as bar:
        clock[0] += 2.0
        bar.update(400_000)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "tokenize: resumed: 600kB of 1.00MB (3 of 5 units) done by an earlier run"
    assert lines[-1] == "tokenize: 1.00MB of 1.00MB (100%), 200kB/s, 2s"  # 400 kB in 2 s, not 1 MB in 2 s
    monkeypatch.undo()
    monkeypatch.setattr(progress, "TICK", 0.05)
    monkeypatch.setattr(progress, "FIRST", 0.1)
    with progress.Progress("write", 100, "tok", mode="lines"):
        time.sleep(0.5)  # no task finished yet
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("write: 0.00 tok of 100 tok (0%), "), lines  # the FIRST-second line


def test_inspect_seq_prints_nothing_before_its_error(tmp_path):
    """Issue 35 item 6: a swapped tokenizer.json refuses `inspect --seq` with the error alone, no partial
    sequence line before it."""
    out = tmp_path / "ds"
    code, log = run_packer(["build", SAMPLE_INPUTS[0], "--tokenizer", TOKENIZER, "-o", str(out), "--context-length",
                            "256", "--workers", "1"])
    assert code == 0, log
    code, shown = run_packer(["inspect", str(out), "--seq", "1"])
    assert code == 0 and shown.startswith("sequence 1: 256 tokens"), shown
    spec = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    spec["model"]["vocab"]["a token added later"] = len(spec["model"]["vocab"])
    (out / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    code, shown = run_packer(["inspect", str(out), "--seq", "1"])
    lines = [line for line in shown.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and lines[0].startswith("Error: ") and "tokenizer" in lines[0], shown


ENDS_IN_MAIN = """
import atexit, sys, threading, time
from pathlib import Path
out = Path(sys.argv[1])
atexit.register(lambda: (out / "atexit").write_text("ran"))
def late():
    time.sleep(0.3)
    (out / "thread").write_text("done")
threading.Thread(target=late).start()  # not a daemon: the interpreter's exit waits for it
sys.stdout.write("written before, not flushed\\n")
sys.argv = ["packer", *sys.argv[2:]]
from packer.cli import main
main()
print("after main")
"""


@pytest.mark.parametrize("argv, status", [(["--version"], 0), (["build", "--bogus"], 2),
                                          (["build", "missing.jsonl", "-o", "out", "--tokenizer", "t.json"], 1)])
def test_the_process_ends_in_main_as_the_interpreter_would_end_it(tmp_path, argv, status):
    """`packer ...` ends its process once the command is done (cli._end_process, without the interpreter's
    teardown): with the command's exit status, a non-daemon thread's work awaited, atexit handlers run,
    what was written to stdout flushed, and nothing after main() run."""
    done = subprocess.run([sys.executable, "-c", ENDS_IN_MAIN, str(tmp_path), *argv], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert done.returncode == status, done.stderr
    assert done.stdout.startswith("written before, not flushed\n") and "after main" not in done.stdout
    assert (tmp_path / "atexit").read_text() == "ran" and (tmp_path / "thread").read_text() == "done"
    assert ("packer, version" in done.stdout) == (status == 0) and bool(done.stderr.strip()) == (status != 0)
