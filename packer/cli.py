"""The `packer` command: parse, build a config, call one function, print."""

from __future__ import annotations

import dataclasses
import json
import sys
import warnings

import click

from packer import __version__
from packer.build.executors import WorkerDied
from packer.config import BuildConfig, Job, load_job
from packer.io.fs import redact, redact_text

EXPECTED_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, PermissionError, IsADirectoryError, WorkerDied)


class _Group(click.Group):
    """Expected errors become one line on stderr and exit 1, not a traceback."""

    def invoke(self, ctx):
        try:
            with warnings.catch_warnings():  # a warning is one line too: "warning: ..."
                warnings.showwarning = lambda message, *_, **__: click.echo(f"warning: {redact_text(message)}", err=True)
                return super().invoke(ctx)
        except EXPECTED_ERRORS as e:  # credentials in a URI are never printed (packer/io/fs.py)
            raise click.ClickException(redact_text(e)) from None
        except KeyboardInterrupt:
            click.echo("interrupted: finished work units are kept; run the same command again to resume", err=True)
            ctx.exit(130)


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="packer")
def main():
    """Tokenize text corpora, pack documents into fixed-length sequences (first-fit-decreasing),
    write verifiable shards, and measure what padding would have cost.

    Start with: packer run pipelines/sample.toml
    """


def _print_summary(manifest: dict, output: str):
    t, output = manifest["totals"], redact(output)
    if manifest.get("already_complete"):
        click.echo(f"{output}: dataset already complete; nothing to do (use --overwrite to rebuild)")
    skipped = sum(t["docs_skipped"].values())
    click.echo(
        f"documents: {t['docs_accepted']:,} accepted of {t['docs_read']:,} read"
        + (f" ({skipped:,} skipped: {t['docs_skipped']})" if skipped else "")
    )
    for ex in t.get("skip_examples", [])[:3]:
        click.echo(f"  skipped {ex['reason']}: {ex['where']}")
    for f in t.get("files_skipped", []):
        click.echo(f"  skipped file {f['path']}: {f['error']}")
    click.echo(f"tokens:    {t['tokens_out']:,} in {t['sequences']:,} sequences of {manifest['config']['context_length']}")
    click.echo(f"fill rate: {t['fill_rate']:.4f}")
    click.echo(f"shards:    {len(manifest['shards'])} in {output}")


def _run_job(job: Job, keep_work: bool, overwrite: bool):
    from packer.build.pipeline import build

    click.echo(f"config: {json.dumps(job.config.to_dict())}", err=True)
    manifest = build(job, keep_work=keep_work, overwrite=overwrite)
    _print_summary(manifest, job.output)


@main.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option("--tokenizer", required=True, help="Path of a tokenizer.json (HF tokenizers format).")
@click.option("--context-length", type=click.IntRange(min=1), default=2048, show_default=True, help="Tokens per packed sequence.")
@click.option("--output", "-o", required=True, help="Output directory for shards and manifest, or a URI (s3://, gs://, ...).")
@click.option("--workers", type=click.IntRange(min=0), default=0, help="Worker processes (default: all cores).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the bin shuffle.")
@click.option("--text-field", default="text", show_default=True, help="JSON field holding the document text.")
@click.option("--algorithm", type=click.Choice(["ffd", "bfd"]), default="ffd", show_default=True, help="Packing: first-fit or best-fit decreasing.")
@click.option("--long-docs", type=click.Choice(["split", "truncate", "drop"]), default="split", show_default=True, help="What to do with documents longer than the context.")
@click.option("--eos/--no-eos", default=True, show_default=True, help="Append the end-of-text token to each document.")
@click.option("--bos/--no-bos", default=False, show_default=True, help="Prepend the begin-of-text token to each document.")
@click.option("--eos-token", default=None, help="Name of the end-of-text token (default: found in the tokenizer).")
@click.option("--bos-token", default=None, help="Name of the begin-of-text token.")
@click.option("--format", type=click.Choice(["arrow", "memmap"]), default="arrow", show_default=True, help="Shard format: Arrow IPC, or flat .bin tokens + .idx index for np.memmap.")
@click.option("--shard-size", type=click.IntRange(min=1), default=BuildConfig.shard_size, show_default=True, help="Tokens per shard (100M uint16 tokens = 200 MB).")
@click.option("--pack-group", type=click.IntRange(min=1), default=None, help="Pack each N consecutive documents separately (bounded planning memory; costs a little fill rate). Default: all at once.")
@click.option("--text-split", type=click.Choice(["file", "blank-line"]), default="file", show_default=True, help=".txt inputs: one document per file, or documents separated by blank lines.")
@click.option("--strict", is_flag=True, help="Fail on the first bad record instead of skipping and counting it.")
@click.option("--on-file-error", type=click.Choice(["fail", "skip"]), default="fail", show_default=True, help="An unreadable or corrupt input file fails the run, or is skipped and reported.")
@click.option("--max-doc-bytes", type=click.IntRange(min=1), default=BuildConfig.max_doc_bytes, show_default=True, help="Larger records are skipped (reason too_large) without being read whole.")
@click.option("--keep-work", is_flag=True, help="Keep OUTPUT/_work (unit files, plan) after the build.")
@click.option("--overwrite", is_flag=True, help="Discard what OUTPUT holds (a complete dataset, or unfinished work from other settings) and start over.")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True, help="Run stages in local processes or as Ray tasks (same output bytes).")
@click.option("--ray-address", default=None, help="Ray cluster to use with --executor ray (default: $RAY_ADDRESS, a local cluster, else a new one).")
def build(inputs, tokenizer, output, workers, keep_work, overwrite, executor, ray_address, **config):
    """Tokenize INPUTS (JSONL[.gz|.zst], Parquet, .txt, Arrow / HF save_to_disk directories; files,
    directories, globs or pyarrow.fs URIs), pack them, and write shards to OUTPUT."""
    job = Job(inputs=inputs, tokenizer=tokenizer, output=output, workers=workers, config=BuildConfig(**config),
              executor=executor, ray_address=ray_address)
    _run_job(job, keep_work, overwrite)


@main.command()
@click.argument("pipeline", type=click.Path(dir_okay=False))
@click.option("--workers", type=click.IntRange(min=0), default=None, help="Override the job's worker count.")
@click.option("--keep-work", is_flag=True, help="Keep OUTPUT/_work after the build.")
@click.option("--overwrite", is_flag=True, help="Replace a complete dataset already in the output.")
@click.option("--executor", type=click.Choice(["local", "ray"]), default=None, help="Override the job's executor.")
@click.option("--ray-address", default=None, help="Override the job's Ray address.")
def run(pipeline, workers, keep_work, overwrite, executor, ray_address):
    """Run the job described in a PIPELINE TOML file (e.g. pipelines/sample.toml)."""
    job = load_job(pipeline)
    overrides = {"workers": workers, "executor": executor, "ray_address": ray_address}
    job = dataclasses.replace(job, **{k: v for k, v in overrides.items() if v is not None})
    if executor == "local":
        job = dataclasses.replace(job, ray_address=None)
    _run_job(job, keep_work, overwrite)
    _write_report(job.output)


def _write_report(output: str):
    """OUTPUT/report.html from the build's stats.json (charts when matplotlib is installed)."""
    import tempfile

    from packer.io import fs
    from packer.stats import report
    from packer.stats.figures import SCHEMA_ID

    stats_path = fs.location(output) / "stats.json"
    if not stats_path.is_file():
        return
    figures = json.loads(stats_path.read_text(encoding="utf-8"))
    if figures.get("schema") == SCHEMA_ID:  # a dataset built by an older version has no such stats
        page = fs.location(output) / "report.html"
        if isinstance(page, fs.RemotePath):
            with tempfile.TemporaryDirectory() as d:
                report.write_html(figures, f"{d}/report.html")
                fs.upload(f"{d}/report.html", page)
        else:
            report.write_html(figures, page)
        click.echo(f"report:    {redact(page)} (packer stats {redact(output)} prints the table)")


@main.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option("--tokenizer", default=None, help="Raw corpus: path of a tokenizer.json to count tokens with.")
@click.option("--context-length", type=click.IntRange(min=1), default=None, help="Raw corpus: tokens per sequence.")
@click.option("--batch-size", type=click.IntRange(min=1), default=8, show_default=True, help="B of the pad-to-longest strategies.")
@click.option("--sample", type=click.IntRange(min=1), default=None, help="Raw corpus: measure a seeded sample of this many documents.")
@click.option("--seed", type=int, default=0, show_default=True, help="Raw corpus: seed of the sample and of the bin shuffle.")
@click.option("--algorithm", type=click.Choice(["ffd", "bfd"]), default="ffd", show_default=True, help="Raw corpus: packing whose composition is shown.")
@click.option("--text-field", default="text", show_default=True, help="Raw corpus: JSON field holding the document text.")
@click.option("--eos/--no-eos", default=True, show_default=True, help="Raw corpus: count an end-of-text token per document, as build does.")
@click.option("--online", is_flag=True, help="Raw corpus: also report the fill rate online packing (packer.data.OnlinePackedDataset) would reach.")
@click.option("--buffer-docs", type=click.IntRange(min=1), default=10_000, show_default=True, help="With --online: documents per packing buffer.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the figures as JSON (schema: packer/stats/stats_schema.json).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Write the charts as a PNG (needs packer[plot]).")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), help="Write a self-contained HTML report.")
def stats(inputs, tokenizer, context_length, batch_size, sample, seed, algorithm, text_field, eos, online, buffer_docs,
          json_path, plot_path, html_path):
    """Padding waste of batching strategies and what packing saves: of a raw corpus
    (INPUT... --tokenizer PATH --context-length N) or of a built dataset (one DIR)."""
    from packer.io import fs
    from packer.stats import figures as st
    from packer.stats import report
    from packer.stats.corpus import corpus_lengths

    if len(inputs) == 1 and (fs.location(inputs[0]) / "manifest.json").is_file():
        if tokenizer or context_length or sample or online:
            raise ValueError(f"{redact(inputs[0])} is a built dataset: its tokenizer and context length come from its manifest; drop --tokenizer/--context-length/--sample/--online")
        from packer.store.dataset import open_dataset

        figures = st.dataset_stats(open_dataset(inputs[0]), batch_size=batch_size)
    else:
        if not tokenizer or not context_length:
            raise ValueError("a raw corpus needs --tokenizer PATH and --context-length N (or give one built dataset directory)")
        lengths, sampled = corpus_lengths(inputs, tokenizer, text_field=text_field, eos=eos, sample=sample, seed=seed)
        figures = st.corpus_stats(lengths, context_length, batch_size=batch_size, seed=seed, algorithm=algorithm,
                                  sample=sampled, inputs=inputs)
        if online:
            from packer.train.online import online_fill_rate

            figures["online"] = online_fill_rate(lengths, context_length, buffer_docs, algorithm)
    click.echo(report.format_table(figures))
    if "online" in figures:
        o = figures["online"]
        click.echo(f"online packing, {o['buffer_docs']:,}-document buffers: {o['sequences']:,} sequences, "
                   f"fill {o['fill_rate']:.4f} (padding {o['padding_share']:.2%}), lower bound {o['lower_bound_rows']:,}")
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=2)
    if plot_path:
        report.write_png(figures, plot_path)
    if html_path:
        report.write_html(figures, html_path)


@main.command("show-mask")
@click.argument("dataset")
@click.option("--seq", type=int, default=0, show_default=True, help="Index of the packed sequence.")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False), help="PNG file to write.")
def show_mask(dataset, seq, out_path):
    """Draw the block-causal attention mask of one packed sequence, documents outlined, as a PNG."""
    from packer.stats.report import write_mask_png
    from packer.store.dataset import open_dataset

    ds = open_dataset(dataset)
    if not 0 <= seq < len(ds):
        raise click.BadParameter(f"--seq {seq} is out of range: the dataset has {len(ds)} sequences (0..{len(ds) - 1})")
    _, offsets = ds[seq]
    write_mask_png(offsets, int(ds.manifest["config"]["context_length"]), out_path,
                   title=f"{redact(dataset)} sequence {seq}: {len(offsets) - 1} documents, {int(offsets[-1])} tokens")
    click.echo(f"wrote {out_path}")


@main.command()
@click.argument("dataset")
@click.option("--seq", type=int, default=None, help="Show this packed sequence, decoded, with document boundaries marked.")
@click.option("--raw", is_flag=True, help="With --seq: print token ids instead of text.")
def inspect(dataset, seq, raw):
    """Show a dataset's manifest summary, or one packed sequence (DATASET: a directory or a URI)."""
    from packer.store.dataset import open_dataset

    ds = open_dataset(dataset)
    m = ds.manifest
    if seq is None:
        click.echo(json.dumps({k: m[k] for k in ("format_version", "tool", "config", "tokenizer", "totals")}, indent=2))
        click.echo(f"shards: {', '.join(s['file'] for s in m['shards'])}")
        return
    if not 0 <= seq < len(ds):
        raise click.BadParameter(f"--seq {seq} is out of range: the dataset has {len(ds)} sequences (0..{len(ds) - 1})")
    tokens, offsets = ds[seq]
    click.echo(f"sequence {seq}: {len(tokens)} tokens, {len(offsets) - 1} documents")
    tok = None
    if not raw:
        from packer.build.tokenize import load_tokenizer

        tok = load_tokenizer(str(ds.path / "tokenizer.json"))
    for d, (a, b) in enumerate(zip(offsets[:-1], offsets[1:])):
        piece = tokens[a:b]
        click.secho(f"──── document {d}: tokens [{a}, {b}) ────", fg="cyan")
        click.echo(" ".join(map(str, piece.tolist())) if raw else tok.decode(piece.tolist(), skip_special_tokens=False))


@main.command()
@click.argument("dataset")
@click.option("--quick", is_flag=True, help="Skip checksums.")
def verify(dataset, quick):
    """Check shards against the manifest: present, checksums, offsets, counts. Exit 1 on any problem.
    DATASET is a directory or a URI (s3://, gs://, file://, ...)."""
    from packer.store.verify import verify_dataset

    totals = verify_dataset(dataset, checksums=not quick)
    click.echo(f"ok: {totals['sequences']:,} sequences, {totals['tokens']:,} tokens, {totals['documents']:,} segments")


if __name__ == "__main__":
    sys.exit(main())
