"""The `packer` command: parse, build a config, call one function, print."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import signal
import sys
import threading
import traceback
import warnings

import click

from packer._version import __version__
from packer.config import RECORD_FIELDS, BuildConfig, Job, choices, load_job, sources_from_options
from packer.encode.tokenizer import describe_specials
from packer.io import fs
from packer.io.fs import redact, redact_text
from packer.preprocess.executors import WorkerDied
from packer.store.manifest import REPORT

EXPECTED_ERRORS = (ValueError, OSError, WorkerDied)  # OSError: FileNotFoundError, PermissionError, disk full, ...
RESUME = "run the same command to resume"
_OS_FIXES = {  # errno -> what to do
    errno.ENOSPC: "free space there (or choose another --output), then " + RESUME,
    errno.EDQUOT: "free space or raise the quota (or choose another --output), then " + RESUME,
    errno.EROFS: "the filesystem is read-only: choose a writable location",
    errno.EACCES: "check the permissions of that path (or choose another)",
    errno.EPERM: "check the permissions of that path (or choose another)",
}


class _Terminated(KeyboardInterrupt):
    """SIGTERM (a batch scheduler, `kill`): stops the build the way Ctrl-C does."""


def _on_sigterm(*_):
    raise _Terminated()


def _os_error_line(e: OSError, output: str | None) -> str:
    """ "PATH: No space left on device (ENOSPC); free space there ..., then run the same command to resume"."""
    cause = e
    while cause.errno is None and isinstance(cause.__cause__, OSError):  # labelled by an executor: its cause has the errno
        cause = cause.__cause__
    if cause.errno is None:  # packer's own message ("input not found: ..."): it names the file and the fix
        return str(e)
    fix = _OS_FIXES.get(cause.errno, "fix that, then " + RESUME if output else "")
    fix = f"; {fix}" if fix else ""
    if cause is not e:  # "write_shard, shard 1: [Errno 28] No space left on device: 'PATH'": the label names the task
        return f"{e}{fix}"
    where = e.filename if e.filename is not None else output
    return f"{f'{where}: ' if where else ''}{e.strerror or e} ({errno.errorcode.get(e.errno, str(e.errno))}){fix}"


class _Group(click.Group):
    """Expected errors become one line on stderr and exit 1, not a traceback (with --debug: both).
    Ctrl-C and SIGTERM stop with one line too (exit 130 / 143): finished work is kept."""

    def main(self, args=None, *rest, standalone_mode: bool = True, **kwargs):
        """click's main; run as the process's own command (`packer ...`, `python -m packer ...`: no
        `args` given, standalone), the process ends once the command has (_end_process). Called with
        `args` (tests, CliRunner) or standalone_mode=False, click's main as it is."""
        if args is not None or rest or not standalone_mode:
            return super().main(args, *rest, standalone_mode=standalone_mode, **kwargs)
        try:
            super().main(standalone_mode=True, **kwargs)
            code = 0
        except SystemExit as e:  # standalone: click always ends with it, the command's exit status
            code = e.code
        _end_process(code)

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:  # `packer --bogus`: as a command's usage error below
            if type(e).__name__ == "NoArgsIsHelpError":  # plain `packer`: click prints the help
                raise
            click.echo(f"Error: {redact_text(e.format_message())} (see '{ctx.command_path} --help')", err=True)
            ctx.exit(e.exit_code)

    def invoke(self, ctx):
        previous = signal.signal(signal.SIGTERM, _on_sigterm) if _main_thread() else None
        try:
            with warnings.catch_warnings():  # a warning is one line too: "warning: ..."
                warnings.showwarning = lambda message, *_, **__: click.echo(f"warning: {redact_text(message)}", err=True)
                result = super().invoke(ctx)
                sys.stdout.flush()  # a reader that left (`| head`) is met here, not by the interpreter's exit
                return result
        except click.UsageError as e:  # a flag or argument the command cannot take: one line too, exit 2 (README)
            where = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
            click.echo(f"Error: {redact_text(e.format_message())}{where}", err=True)
            ctx.exit(e.exit_code)
        except BrokenPipeError:  # `packer inspect DS | head`: the reader has what it wanted; click's main
            raise  # quiets the streams and exits 1, the way it handles EPIPE, with no "Error:" line
        except EXPECTED_ERRORS as e:  # credentials in a URI are never printed (packer/io/fs.py)
            _traceback_if_debug(ctx)
            line = _os_error_line(e, ctx.meta.get("output")) if isinstance(e, OSError) else str(e)
            raise click.ClickException(redact_text(line)) from None
        except KeyboardInterrupt as e:
            _traceback_if_debug(ctx)
            click.echo(f"stopped ({'SIGTERM' if isinstance(e, _Terminated) else 'interrupted'}): finished work "
                       f"units are kept; {RESUME}", err=True)
            ctx.exit(143 if isinstance(e, _Terminated) else 130)
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)


def _end_process(code):
    """End the process with exit status `code` as the interpreter's exit does (threads joined, atexit
    handlers run, stdout and stderr flushed), but without its teardown, which frees every module and
    object one by one: 50-55 ms of a 0.5 s tiny build (numpy, pyarrow, the tokenizer and its ranks;
    2026-12-06). Files are written and closed by then (atomic writes), so nothing is lost with it."""
    if code is not None and not isinstance(code, int):  # sys.exit("message"): printed, status 1
        print(code, file=sys.stderr)
        code = 1
    threading._shutdown()  # what the interpreter's exit does first: non-daemon threads joined, pools ended
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that left, a closed stream: as the interpreter ignores it
            pass
    os._exit(code or 0)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()  # signal handlers can only be set there


def _traceback_if_debug(ctx):
    if ctx.meta.get("debug"):
        click.echo(traceback.format_exc().rstrip(), err=True)


def _set_debug(ctx, _param, value):
    if value:
        ctx.meta["debug"] = True  # meta is shared by the group's and the command's contexts


DEBUG = click.option("--debug", is_flag=True, expose_value=False, is_eager=True, callback=_set_debug,
                     help="On an error, print the traceback too; print the build's config JSON first.")


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="packer")
@DEBUG
def main():
    """Tokenize text corpora, pack documents into fixed-length sequences (first-fit-decreasing),
    write verifiable shards, and measure what padding would have cost.

    Start with: packer run pipelines/sample.toml
    """


def _print_summary(manifest: dict, output: str):
    t, location, output = manifest["totals"], output, redact(output)
    if manifest.get("already_complete"):
        click.echo(f"{output}: dataset already complete; nothing to do (use --overwrite to rebuild)")
    if manifest.get("resumed"):
        r = manifest["resumed"]
        click.echo(f"resumed:   an earlier run had tokenized {r['units']:,} units and written {r['shards']:,} shards; "
                   "this run did the rest")
    skipped = sum(t["docs_skipped"].values())
    click.echo(
        f"documents: {t['docs_accepted']:,} accepted of {t['docs_read']:,} read"
        + (f" ({skipped:,} skipped: {t['docs_skipped']})" if skipped else "")
    )
    if t["docs_skipped"].get("too_large"):
        click.echo(f"  too_large: {t['docs_skipped']['too_large']:,} documents over --max-doc-bytes "
                   f"{manifest['config']['max_doc_bytes']:,}; raise the limit with --max-doc-bytes N")
    for ex in t.get("skip_examples", [])[:3]:
        click.echo(f"  skipped {ex['reason']}: {ex['where']}")
    for f in t.get("files_skipped", []):
        click.echo(f"  skipped file {f['path']}: {f['error']}")
    shipped = manifest.get("tokenizer", {})
    if "shipped_truncation" in shipped or "shipped_padding" in shipped:
        on = [f"truncation at {shipped['shipped_truncation']} tokens"] if "shipped_truncation" in shipped else []
        on += ["padding"] if shipped.get("shipped_padding") else []
        click.echo(f"tokenizer: its file turns on {' and '.join(on)}; packer turned them off (every token kept, none added)")
    if "encode_engine" in shipped:
        engine = shipped["encode_engine"]
        click.echo(f"engine:    {engine['name']} ({engine['reason']})")
    if "specials" in shipped:  # written only when a tokenizer config file chose eos/bos/pad
        click.echo(f"tokenizer: {describe_specials(shipped['specials'])}")
    click.echo(f"tokens:    {t['tokens_out']:,} in {t['sequences']:,} sequences of {manifest['config']['context_length']}")
    click.echo(f"fill rate: {t['fill_rate']:.4f}" if t["fill_rate"] is not None else "fill rate: n/a (no sequences)")
    click.echo(f"shards:    {len(manifest['shards'])} in {output}")
    for s in manifest.get("sources") or ():  # a build with named sources: one line each
        skipped = sum(s["docs_skipped"].values())
        click.echo(f"  source {s['name']}: {s['documents']:,} documents, {s['tokens']:,} tokens, rows "
                   f"[{s['sequences'][0]:,}, {s['sequences'][1]:,})" + (f", {skipped:,} skipped" if skipped else ""))
    if t["docs_accepted"]:
        click.echo(f"report:    {redact(fs.location(location) / REPORT)} (packer stats {output} prints the table)")


_CONFIG_FIELDS = {f.name: f for f in (*dataclasses.fields(BuildConfig), *dataclasses.fields(Job))}  # once, not per option


def _option(name: str, *, prefix: str = "", **overrides):
    """A click option for config field `name` (BuildConfig or Job): its flag, type, default, choices
    and help all come from packer/config.py, the one home of every choice list and default."""
    spec = _CONFIG_FIELDS[name]
    flag = "--" + name.replace("_", "-")
    kwargs = {"default": spec.default, "help": prefix + spec.metadata["help"], "show_default": spec.default is not None}
    if isinstance(spec.default, bool) or spec.type == "bool | None":  # --bos/--no-bos; unset: None
        flag = f"{flag}/--no-{name.replace('_', '-')}"
    elif (allowed := choices(name)) is not None:  # a table's names (formats, executors) read from the table
        kwargs["type"] = click.Choice(allowed)
    elif spec.type == "float | None":  # a share (max_skip_fraction): [minimum, 1)
        kwargs["type"] = click.FloatRange(min=spec.metadata["minimum"], max=1, max_open=True)
    elif spec.metadata.get("minimum") is not None:
        kwargs["type"] = click.IntRange(min=spec.metadata["minimum"])
    elif isinstance(spec.default, int):
        kwargs["type"] = int
    return click.option(flag, name, **{**kwargs, **overrides})


def _options(*names, **kwargs):
    def decorate(fn):
        for name in reversed(names):
            fn = _option(name, **kwargs)(fn)
        return fn

    return decorate


def _run_job(job: Job, keep_work: bool, overwrite: bool, quiet: bool):
    from packer.preprocess.pipeline import build

    ctx = click.get_current_context()
    ctx.meta["output"] = fs.redact(job.output)  # an OSError without a file name happened writing there
    if ctx.meta.get("debug") and not quiet:
        click.echo(f"config: {json.dumps(job.config.to_dict())}", err=True)
    manifest = build(job, keep_work=keep_work, overwrite=overwrite, progress="off" if quiet else "auto")
    _print_summary(manifest, job.output)


BUILD_FIELDS = tuple(f.name for f in dataclasses.fields(BuildConfig))
BUILD_HELP = (  # `packer build --help` in sections, by parameter name; a name missing here lands in "Other options"
    ("Inputs", ("source_paths", "source_fields", "source_splits", "text_field", "text_split", "on_file_error",
                "strict", "max_doc_bytes", "max_skip_fraction")),
    ("Records (fine-tuning data)", ("input_kind", "prompt_field", "completion_field", "messages_field", "ids_field",
                                    "labels_field", "loss_mask_field", "chat_template", "train_roles", "long_prompts",
                                    "store_roles", "role_names")),
    ("Tokenizer", ("tokenizer", "encode_engine", "eos", "bos", "eos_token", "bos_token")),
    ("Packing", ("context_length", "algorithm", "long_docs", "seed", "pack_group", "plan_memory")),
    ("Output", ("output", "format", "shard_size", "overwrite", "keep_work")),
    ("Execution", ("workers", "executor", "ray_address", "unit_bytes", "quiet", "debug", "help")),
)


class _Sectioned(click.Command):
    """A command whose --help lists its options in titled sections (`sections`: (title, parameter names))."""

    def __init__(self, *args, sections=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.sections = sections

    def format_options(self, ctx, formatter):
        help_option = self.get_help_option(ctx)
        rows = {"help" if p is help_option else p.name: record for p in self.get_params(ctx)
                if isinstance(p, click.Option) and (record := p.get_help_record(ctx))}
        placed = {name for _, names in self.sections for name in names}
        other = ("Other options", tuple(name for name in rows if name not in placed))
        for title, names in (*self.sections, other):
            if records := [rows[name] for name in names if name in rows]:
                with formatter.section(title):
                    formatter.write_dl(records)
KEEP_WORK = click.option("--keep-work", is_flag=True, help="Keep OUTPUT/_work (unit files, plan) after the build.")
OVERWRITE = click.option("--overwrite", is_flag=True, help="Discard what OUTPUT holds (a complete dataset, or "
                         "unfinished work from other settings) and start over.")
QUIET = click.option("--quiet", "-q", is_flag=True, help="No progress (a bar on a terminal, a line every few seconds "
                     "in a log); the final summary is still printed. The config JSON is printed only with --debug.")


@main.command(cls=_Sectioned, sections=BUILD_HELP)
@click.argument("inputs", nargs=-1)
@click.option("--source", "source_paths", multiple=True, metavar="NAME=PATH", help="Name a source instead of "
              "INPUTS (repeat it; several paths for one name allowed): its segments are tagged, the manifest and "
              "stats count it apart, and PackedDataset(path, weights=...) blends the sources (docs/mixtures.md).")
@click.option("--source-field", "source_fields", multiple=True, metavar="NAME=FIELD",
              help="The text field of one source's records (default: --text-field).")
@click.option("--source-split", "source_splits", multiple=True, metavar="NAME=SPLIT",
              help=f"--text-split for one source's .txt files ({' or '.join(choices('text_split'))}).")
@click.option("--tokenizer", required=True, help="A tokenizer.json (HF tokenizers format), a directory holding one, "
              "or a hub name already in the local HF cache.")
@click.option("--output", "-o", required=True, help="Output directory for shards and manifest, or a URI (s3://, gs://, ...).")
@_options(*BUILD_FIELDS)
@_options("workers", "executor", "ray_address")
@KEEP_WORK
@OVERWRITE
@QUIET
@DEBUG
def build(inputs, source_paths, source_fields, source_splits, tokenizer, output, workers, keep_work, overwrite, quiet,
          executor, ray_address, **config):
    """Tokenize INPUTS (JSONL[.gz|.zst], Parquet, .txt, Arrow / HF save_to_disk directories; files,
    directories, globs or pyarrow.fs URIs), or the named sources (--source NAME=PATH), pack them, and
    write shards, stats.json and report.html to OUTPUT."""
    sources = sources_from_options(source_paths, source_fields, source_splits)
    if not inputs and not sources:
        raise click.UsageError("give INPUTS, or name sources with --source NAME=PATH")
    job = Job(inputs=inputs, sources=sources, tokenizer=tokenizer, output=output, workers=workers,
              config=BuildConfig(**config), executor=executor, ray_address=ray_address)
    _run_job(job, keep_work, overwrite, quiet)


@main.command()
@click.argument("pipeline", type=click.Path(dir_okay=False))
@_options("workers", "executor", "ray_address", default=None, show_default=False, prefix="Override the job's value. ")
@KEEP_WORK
@OVERWRITE
@QUIET
@DEBUG
def run(pipeline, workers, keep_work, overwrite, quiet, executor, ray_address):
    """Run the job described in a PIPELINE TOML file (e.g. pipelines/sample.toml): the same build,
    with the same outputs, as `packer build` with those settings."""
    job = load_job(pipeline)
    if executor is not None and executor != job.executor:  # the file's ray_address was for its own executor
        job = dataclasses.replace(job, executor=executor, ray_address=None)
    overrides = {"workers": workers, "ray_address": ray_address}
    job = dataclasses.replace(job, **{k: v for k, v in overrides.items() if v is not None})
    _run_job(job, keep_work, overwrite, quiet)


CORPUS_FIELDS = ("text_field", "text_split", "max_doc_bytes", "eos", "bos", "eos_token", "bos_token", "algorithm", "seed",
                 "encode_engine", *RECORD_FIELDS)


MIXTURE = (
    click.option("--weights", default=None, metavar="NAME=W,...", help="Mixture of one DATASET's named sources, e.g. "
                 "web=0.7,code=0.3: print each source's share, repetition and epochs (not the padding figures); "
                 "with --mix, the weights of its sources."),
    click.option("--mix", multiple=True, metavar="NAME=PATH[:WEIGHT]", help="Mixture of several built datasets "
                 "(repeat it), as PackedDataset({NAME: PATH, ...}): each one source, or its named sources, "
                 "e.g. --mix web=out/web:0.7 --mix code=out/code:0.3."),
    click.option("--mix-by", type=click.Choice(("sequences", "tokens")), default="sequences", show_default=True,
                 help="Mixture: weights are shares of sequences or of tokens (PackedDataset's mix_by)."),
    click.option("--num-samples", type=click.IntRange(min=1), default=None, help="Mixture: sequences in one blended "
                 "epoch (PackedDataset's num_samples; default: every source's rows together)."),
    click.option("--budget-tokens", type=click.IntRange(min=1), default=None, help="Mixture: a training budget in "
                 "stored tokens; adds each source's sequences, tokens and epochs in it."),
)


def _mixture_options(fn):
    for option in reversed(MIXTURE):
        fn = option(fn)
    return fn


def _print_mixture(inputs, weights, mix, mix_by, num_samples, budget_tokens, json_path, plot_path, html_path):
    """`packer stats DATASET --weights ...` / `packer stats --mix ...`: the mixture report alone."""
    from packer.stats import mixture, report

    if not mix:
        if len(inputs) != 1:
            raise click.UsageError("--weights weighs the named sources of one built DATASET; give exactly one")
        sources, weight_of = mixture.dataset_sources(inputs[0]), mixture.parse_weights(weights)
    else:
        if inputs:
            raise click.UsageError("--mix names every dataset (NAME=PATH[:WEIGHT]); drop the INPUTS")
        paths, weight_of = mixture.parse_mix(mix)
        sources = mixture.datasets_as_sources(paths)
        weight_of.update(mixture.parse_weights(weights) if weights else {})
        weight_of = weight_of or None  # none given: in proportion to the rows, as PackedDataset
    m = mixture.mixture(sources, weight_of, mix_by=mix_by, num_samples=num_samples, budget_tokens=budget_tokens)
    click.echo(report.format_mixture(m))
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump(m, f, indent=2)
    if plot_path:
        report.mixture_figure(m).savefig(plot_path, format="png")
    if html_path:
        with open(html_path, "w", encoding="utf-8") as f:
            f.write(report.mixture_html(m))


@main.command()
@DEBUG
@click.argument("inputs", nargs=-1)
@click.option("--tokenizer", default=None, help="Raw corpus: the tokenizer to count tokens with (as for build).")
@_option("context_length", default=None, show_default=False, prefix="Raw corpus: ")
@_options(*CORPUS_FIELDS, prefix="Raw corpus: ")
@click.option("--batch-size", type=click.IntRange(min=1), default=8, show_default=True, help="B of the pad-to-longest strategies.")
@click.option("--sample", type=click.IntRange(min=1), default=None, help="Raw corpus: measure a seeded sample of this many documents.")
@click.option("--online", is_flag=True, help="Raw corpus: also report the fill rate online packing (packer.data.OnlinePackedDataset) would reach.")
@click.option("--buffer-docs", type=click.IntRange(min=1), default=10_000, show_default=True, help="With --online: documents per packing buffer.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the figures as JSON (schema: packer/stats/stats_schema.json).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Write the charts as a PNG (needs packer[plot]).")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), help="Write a self-contained HTML report.")
@click.option("--cost", default=None, metavar="PER_TOKEN,PER_PAIR", help="Built dataset: the step-balance table's "
              "cost model, a token and an entry of each document's L^2 (default: an 8B dense model, 4.8e10,786432).")
@click.option("--model-params", type=float, default=None, help="Built dataset: the step-balance cost of a dense "
              "model of this many parameters, with --model-d and --model-layers (packer.data.CostModel.for_model).")
@click.option("--model-d", type=click.IntRange(min=1), default=None, help="With --model-params: its d_model.")
@click.option("--model-layers", type=click.IntRange(min=1), default=None, help="With --model-params: its layers.")
@_mixture_options
def stats(inputs, tokenizer, context_length, batch_size, sample, online, buffer_docs, json_path, plot_path, html_path,
          cost, model_params, model_d, model_layers, weights, mix, mix_by, num_samples, budget_tokens, **corpus):
    """Padding waste of batching strategies and what packing saves: of a raw corpus
    (INPUT... --tokenizer PATH --context-length N) or of a built dataset (one DIR, with its step-balance
    table). With --weights or --mix: the effective mixture of a blend instead (docs/mixtures.md)."""
    from packer.stats.step_balance import cost_model

    balance_cost = cost_model(cost=cost, n_params=model_params, d_model=model_d, n_layers=model_layers)
    if weights or mix:
        if balance_cost is not None:
            raise click.UsageError("--cost/--model-* set a built dataset's step-balance table; a mixture has none")
        return _print_mixture(inputs, weights, mix, mix_by, num_samples, budget_tokens, json_path, plot_path, html_path)
    if not inputs:
        raise click.UsageError("give INPUT... (a raw corpus) or one built DATASET, or --mix NAME=PATH:WEIGHT")
    from packer.preprocess.corpus import measure
    from packer.stats import report

    config = BuildConfig(context_length=context_length, **corpus) if context_length else None
    figures = measure(inputs, tokenizer=tokenizer, config=config, batch_size=batch_size, sample=sample, online=online,
                      buffer_docs=buffer_docs, cost=balance_cost)
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
        build = None
        if figures["source"]["kind"] == "dataset":  # one built DATASET: its header names the build, as its report.html
            from packer.store.manifest import read_manifest

            build = report.page_build(read_manifest(fs.location(inputs[0])))
        report.write_html(figures, html_path, build)


PICK_AMONG = 64  # show-mask without --seq looks at this many rows for a typical one


@main.command("show-mask")
@DEBUG
@click.argument("dataset")
@click.option("--seq", type=int, default=None, help="Index of the packed sequence (default: among the first "
              f"{PICK_AMONG}, the first nearest the median number of documents, of rows with 2 or more).")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False), help="PNG file to write.")
@click.option("--policy", default=None, metavar="ROLE=global|none|N,...", help="Draw the hybrid mask of a role "
              "policy instead (a build with --store-roles), cells coloured by the key's role, e.g. "
              "system=global,user=64 ('*=N': every other role's window; docs/role_masks.md).")
def show_mask(dataset, seq, out_path, policy):
    """Draw the block-causal attention mask of one packed sequence, documents outlined, as a PNG of
    800 x 800 pixels at any context length (a pixel covers a block of positions; pale where only some
    of its pairs attend), with the documents' lengths below."""
    from packer.stats.mask_image import pick_row, write_mask_png, write_role_mask_png
    from packer.store.dataset import open_dataset

    ds = open_dataset(dataset)
    if seq is None:
        if not len(ds):
            raise click.BadParameter(f"{redact(dataset)} has no sequences to draw", param_hint="DATASET")
        import numpy as np

        seq = pick_row(np.diff(ds.get_many(range(min(len(ds), PICK_AMONG))).offset_starts) - 1)
    if not 0 <= seq < len(ds):
        raise click.BadParameter(f"--seq {seq} is out of range: the dataset has {len(ds)} sequences (0..{len(ds) - 1})")
    _, offsets = ds[seq]
    context = int(ds.manifest["config"]["context_length"])
    title = f"{redact(dataset)} sequence {seq}: {len(offsets) - 1} documents, {int(offsets[-1])} tokens"
    if policy is None:
        write_mask_png(offsets, context, out_path, title=title)
    else:
        from packer.masks import RolePolicy

        if not ds.has_role_ids:
            raise click.BadParameter(f"{redact(dataset)} stores no role ids; build it with --input-kind chat "
                                     "--store-roles, or drop --policy", param_hint="--policy")
        try:
            rule = RolePolicy.parse(policy)
            rule.key_windows(ds.roles)  # a role the table lacks: one line naming it
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--policy") from None
        write_role_mask_png(offsets, ds.role_views([seq])[0], rule, ds.roles, context, out_path, title=title)
    click.echo(f"wrote {out_path}: sequence {seq} ({len(offsets) - 1} documents, {int(offsets[-1]):,} tokens)")


@main.command()
@DEBUG
@click.argument("dataset")
@click.option("--seq", type=int, default=None, help="Show this packed sequence, decoded, with document boundaries marked.")
@click.option("--raw", is_flag=True, help="With --seq: print token ids instead of text.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole manifest.json as JSON instead of the summary.")
def inspect(dataset, seq, raw, as_json):
    """Summarize a dataset (counts, fill, config, files), or show one packed sequence (DATASET: a
    directory or a URI). With a loss mask (fine-tuning data) untrained spans print in [brackets], dim
    on a terminal; with role ids (--store-roles) each run of one role opens with its name, <user>."""
    from packer.store.dataset import open_dataset

    ds = open_dataset(dataset)
    m = ds.manifest
    if as_json:
        click.echo(json.dumps(m, indent=2))
        return
    if seq is None:
        _print_dataset(m, dataset)
        return
    if not 0 <= seq < len(ds):
        raise click.BadParameter(f"--seq {seq} is out of range: the dataset has {len(ds)} sequences (0..{len(ds) - 1})")
    # Everything that can fail (the row, its mask, the tokenizer, each decode) runs before the first line
    # is printed: an error is the only output, never after a partial result (issue 35).
    tokens, offsets = ds[seq]
    mask = ds.mask_views([seq])[0] if ds.has_loss_mask else None
    roles = ds.role_views([seq])[0] if getattr(ds, "has_role_ids", False) else None
    tok = None
    if not raw:
        from packer.encode.tokenizer import load_tokenizer
        from packer.store.manifest import tokenizer_file

        tok = load_tokenizer(str(tokenizer_file(ds.path, ds.manifest) or ds.path / "tokenizer.json"))
    trained = "" if mask is None else f", {int(mask.sum())} trained"
    lines = [f"sequence {seq}: {len(tokens)} tokens, {len(offsets) - 1} documents{trained}"]
    if mask is not None:
        lines.append("legend: " + click.style("[untrained]", dim=True) + " loss mask 0 (context, never a target); "
                     "the rest trained")
    if roles is not None:
        lines.append("roles: " + click.style("<role>", fg="magenta") + " opens each run of one role (manifest "
                     "\"roles\": " + ", ".join(f"{name} {i}" for name, i in ds.roles.items()) + ")")
    names = {i: name for name, i in (ds.roles or {}).items()}
    for d, (a, b) in enumerate(zip(offsets[:-1], offsets[1:])):
        lines.append(click.style(f"──── document {d}: tokens [{a}, {b}) ────", fg="cyan"))
        row_mask = mask[a:b] if mask is not None else None
        spans = _mask_spans(tokens[a:b], row_mask, roles[a:b] if roles is not None else None)
        shown, last = [], None
        for ids, is_trained, role in spans:
            if role is not None and role != last:
                shown.append(click.style(f"<{names.get(role, role)}>", fg="magenta"))
            last = role
            shown.append(_show_span(ids, is_trained, tok))
        lines.append(("" if tok else " ").join(shown))
    click.echo("\n".join(lines))


SHOWN_SHARDS = 5  # `packer inspect DIR` lists this many shards; --json lists them all


def _print_dataset(m: dict, dataset: str):
    """`packer inspect DIR`: what a person asks of a dataset first, one topic a line.

    dataset:   out/sample: 370 sequences of 2048 tokens, arrow, 1 shard (format 2, packer 0.1.0, 2026-12-05 20:17 UTC)
    documents: 3,894 accepted of 3,894 read
    tokens:    756,934 stored, fill rate 0.9989
    tokenizer: sample_data/tokenizer.json (vocab 16,384, sha256 2efd84ee02aa), engine tiktoken
    config:    context_length=2048 algorithm=ffd long_docs=split seed=0 ...
    shards:    shard-00000.arrow  370 sequences  756,934 tokens  3,894 segments
    """
    import datetime
    import textwrap

    t, config, tok = m["totals"], m["config"], m.get("tokenizer", {})
    when = (datetime.datetime.fromtimestamp(m["created_unix"], datetime.timezone.utc).strftime(", %Y-%m-%d %H:%M UTC")
            if "created_unix" in m else "")
    n_shards = len(m["shards"])
    click.echo(f"dataset:   {redact(dataset)}: {t['sequences']:,} sequences of {config['context_length']:,} tokens, "
               f"{config.get('format', 'arrow')}, {n_shards} shard{'s' * (n_shards != 1)} (format {m['format_version']}, "
               f"{m['tool']['name']} {m['tool']['version']}{when})")
    skipped = sum(t["docs_skipped"].values())
    click.echo(f"documents: {t['docs_accepted']:,} accepted of {t['docs_read']:,} read"
               + (f", {skipped:,} skipped ({', '.join(f'{k} {v:,}' for k, v in t['docs_skipped'].items())})" if skipped else ""))
    if "docs_inner_eos" in t:  # builds since 2026-12: what a trainer finding boundaries from EOS would cut
        click.echo(f"eos:       {t['docs_inner_eos']:,} documents hold the EOS id {config.get('eos_id')} inside them"
                   + (" (a trainer taking EOS as a document end cuts them there)" if t["docs_inner_eos"] else ""))
    fill = f"{t['fill_rate']:.4f}" if t.get("fill_rate") is not None else "n/a (no sequences)"
    click.echo(f"tokens:    {t['tokens_out']:,} stored, fill rate {fill}"
               + (f", {t['trained_tokens']:,} trained" if "trained_tokens" in t else ""))
    engine = f", engine {tok['encode_engine']['name']}" if "encode_engine" in tok else ""
    click.echo(f"tokenizer: {tok.get('path', '?')} (vocab {tok.get('vocab_size', 0):,}, sha256 {str(tok.get('sha256', '?'))[:12]})"
               + engine)
    if "roles" in m:
        click.echo("roles:     " + ", ".join(f"{name} {i}" for name, i in m["roles"].items()))
    for s in m.get("sources") or ():
        click.echo(f"source:    {s['name']}: {s['documents']:,} documents, {s['tokens']:,} tokens")
    pairs = " ".join(f"{k}={v}" for k, v in config.items() if v is not None)
    click.echo(textwrap.fill(pairs, width=110, initial_indent="config:    ", subsequent_indent=" " * 11,
                             break_on_hyphens=False))
    for i, s in enumerate(m["shards"][:SHOWN_SHARDS]):
        click.echo(f"{'shards:' if i == 0 else '':<11}{s['file']}  {s['sequences']:,} sequences  {s['tokens']:,} tokens"
                   f"  {s['documents']:,} segments")
    if n_shards > SHOWN_SHARDS:
        click.echo(f"{'':<11}... and {n_shards - SHOWN_SHARDS:,} more (packer inspect {redact(dataset)} --json lists them)")


def _mask_spans(tokens, mask, roles=None) -> list[tuple]:
    """(token ids, trained, role id or None) runs of a document, cut where the mask or the role
    changes: mask [0 0 1 1 1 0] -> ids [0, 2), [2, 5), [5, 6) (no mask: all trained)."""
    import numpy as np

    changes = [np.diff(x.astype(np.int16)) != 0 for x in (mask, roles) if x is not None]
    cuts = np.flatnonzero(np.logical_or.reduce(changes)) + 1 if changes else np.zeros(0, np.int64)
    runs = zip(np.split(tokens, cuts), np.split(np.arange(len(tokens)), cuts))
    return [(ids, True if mask is None else bool(mask[at[0]]), None if roles is None else int(roles[at[0]]))
            for ids, at in runs]


def _show_span(ids, trained: bool, tok) -> str:
    """One run decoded (token ids when tok is None); an untrained run in brackets, dim."""
    text = tok.decode(ids.tolist(), skip_special_tokens=False) if tok is not None else " ".join(map(str, ids.tolist()))
    return text if trained else click.style(f"[{text}]", dim=True)


@main.command()
@DEBUG
@click.argument("dataset")
@click.option("--quick", is_flag=True, help="Skip the sha256, the block checksums and the token-id scan.")
def verify(dataset, quick):
    """Check shards against the manifest: present, checksums, offsets, counts. Exit 1 on any problem.
    DATASET is a directory or a URI (s3://, gs://, file://, ...)."""
    from packer.stats.report import check_report
    from packer.store.verify import verify_generation

    checked = verify_generation(dataset, checksums=not quick)  # reads the manifest once: one generation throughout
    check_report(checked.root, checked.manifest)  # mid-publish of an --overwrite: the old page, in _work/previous/
    totals = checked.totals
    skipped = f"; skipped (--quick): {', '.join(totals['skipped'])}" if totals["skipped"] else ""
    click.echo(f"ok: {totals['sequences']:,} sequences, {totals['tokens']:,} tokens, {totals['documents']:,} segments{skipped}")


if __name__ == "__main__":
    sys.exit(main())
