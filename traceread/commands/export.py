"""``traceread export PATHS -o OUT.json[.gz]``: every rank in one Perfetto / chrome://tracing file,
on one clock, with a track marking the report's findings. The work is in :mod:`traceread.export`."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from traceread.commands.common import OutputError, check_writable, fail, is_stdout, resolve_format, ui, ui_options
from traceread.errors import EXIT_BAD_INPUT, EXIT_NO_TRACES


@contextmanager
def _progress(enabled: bool, total: int) -> Iterator[Callable[[str], None]]:
    """A progress bar on stderr while ranks are written (nothing when stderr is not a terminal)."""
    if not enabled:
        yield lambda _d: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(TextColumn("writing"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("", total=total)
        yield lambda d: bar.update(task, advance=1, description=d)


@click.command("export", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", nargs=-1, required=True, metavar="PATHS...")
@click.option("-o", "--output", required=True, metavar="FILE|-",
              help="The merged trace: .json, or .json.gz (gzip; Perfetto opens both); - is stdout (plain JSON).")
@click.option("--steps", "steps_text", metavar="A:B", help="Only these steps (inclusive; A:, :B or one step N).")
@click.option("--ranks", "ranks_text", metavar="LIST", help="Only these ranks, e.g. 0,3-5.")
@click.option("--no-host", is_flag=True, help="GPU streams only (no CPU threads, no launch arrows): a much smaller file.")
@click.option("--no-cache", is_flag=True, help="Re-parse every trace instead of using the parse and summary caches.")
@click.option("-j", "--workers", type=click.IntRange(1, 256), default=None,
              help="Worker processes for reading ranks (default: one per CPU).")
@ui_options
def export(paths: tuple[str, ...], output: str, steps_text: str | None, ranks_text: str | None, no_host: bool,
           no_cache: bool, workers: int | None) -> None:
    """Merge every rank's trace into one timeline for https://ui.perfetto.dev or chrome://tracing.

    Each rank becomes one process "rank N (host, device)" holding its CPU threads and GPU
    streams, moved onto one clock with the offsets the report estimates (residual uncertainty in
    the file's otherData). A "traceread findings" process marks where each finding happens:
    a straggler's late arrivals and the waits they cause, pipeline bubbles per stage, host-bound
    GPU gaps, slow steps, the hang point.

    \b
    Examples:
      traceread export runs/exp1 -o exp1.json.gz
      traceread export runs/exp1 -o step12.json --steps 12:12 --ranks 0,5
      traceread export runs/big -o big.json.gz --no-host --steps 100:101 --ranks 0-7
      traceread export runs/exp1 -o - --ranks 0 | gzip > r0.json.gz

    \b
    Exit codes: 0 written, 2 bad input (unreadable traces, bad --steps/--ranks), 3 no trace found.
    """
    resolve_format("export", None, output, {".json": "json", ".json.gz": "json.gz"}, "json")
    check_writable(output)
    u = ui()
    from traceread.assemble.report import NothingUsableError, ReportOptions
    from traceread.compare.captures import build_watched
    from traceread.export import ExportOptions, export_trace
    from traceread.export.selection import parse_ranks, parse_steps
    from traceread.fmt import nbytes

    try:
        ranks = parse_ranks(ranks_text)
        steps = parse_steps(steps_text)
    except ValueError as exc:
        raise click.UsageError(f"--ranks/--steps: {exc}") from None
    try:
        doc = build_watched(list(paths), ReportOptions(use_cache=not no_cache, workers=workers,
                                                       progress=sys.stderr.isatty() and not u.quiet))
    except NothingUsableError as exc:
        fail(str(exc), EXIT_BAD_INPUT if exc.bad_input else EXIT_NO_TRACES)
    known = {int(e["rank"]) for e in doc.get("ranks") or []}
    if not known:
        fail(f"no readable trace under {', '.join(paths)} (nothing to put on a timeline)", EXIT_NO_TRACES)
    if ranks is not None and not ranks & known:
        fail(f"--ranks {ranks_text}: none of these ranks is in the traces "
             f"(ranks {min(known, default=0)}-{max(known, default=0)})")
    n = len(ranks & known) if ranks is not None else len(known)
    to_stdout = is_stdout(output)
    target = Path(output)
    if to_stdout:  # written to a temporary file first (bounded memory), then streamed out
        import tempfile

        fd, tmp = tempfile.mkstemp(prefix="traceread-export-", suffix=".json")
        os.close(fd)
        target = Path(tmp)
    try:
        with _progress(sys.stderr.isatty() and not u.quiet, n) as step:
            res = export_trace(doc, target, ExportOptions(ranks=ranks, steps=steps, gpu_only=no_host,
                                                          use_cache=not no_cache), progress=step)
        if to_stdout:
            with open(target, "rb") as fh:
                sys.stdout.flush()
                shutil.copyfileobj(fh, sys.stdout.buffer, 1 << 20)
                sys.stdout.buffer.flush()
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):
            raise
        raise OutputError(f"cannot write ({exc.strerror or exc})", output) from None
    finally:
        if to_stdout:
            target.unlink(missing_ok=True)
    for w in res.warnings:
        u.note(f"traceread: {w}")
    u.note(f"wrote {'stdout' if to_stdout else res.path}: {nbytes(res.bytes_written)}, {res.events} events, "
           f"{len(res.ranks)} rank(s), {res.findings_slices} findings marks — open it in https://ui.perfetto.dev")
