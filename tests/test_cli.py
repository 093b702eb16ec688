"""The CLI through click's runner: the happy path and clear one-line errors."""

from __future__ import annotations

import json

from click.testing import CliRunner
from conftest import SAMPLE_INPUTS, TOKENIZER

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
    summary = runner.invoke(main, ["inspect", str(out)])
    assert summary.exit_code == 0 and '"format_version": 1' in summary.output


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


def test_run_rejects_unknown_pipeline_keys(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('inputs = ["a.jsonl"]\ntokenizer = "t.json"\noutput = "o"\n[config]\ncontext_lenght = 4\n')
    result = CliRunner().invoke(main, ["run", str(job)])
    assert result.exit_code == 1 and "context_lenght" in result.output


def test_a_build_with_no_sequence_says_so_instead_of_a_fill_rate(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"body": "no text field"}\n', encoding="utf-8")
    result = CliRunner().invoke(main, ["build", str(corpus), "--tokenizer", TOKENIZER, "--output", str(tmp_path / "o"),
                                       "--workers", "1"])
    assert "0 accepted of 1 read" in result.output and "fill rate: n/a (no sequences)" in result.output
    assert json.loads((tmp_path / "o" / "manifest.json").read_text())["totals"]["fill_rate"] is None
