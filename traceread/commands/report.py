"""``traceread report``: analyse a run's traces and print/write the report.

Default: a summary on the terminal (answer first) and the full HTML report written beside the run
(``<folder>/traceread-report.html``, or in the current folder when the run folder is read-only).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from traceread.commands.fail import fail
from traceread.errors import EXIT_BAD_INPUT, EXIT_NO_TRACES
from traceread.options import EXECUTORS
from traceread.textsafe import clean

FORMATS = ("rich", "html", "text", "json")
DEFAULT_NAME = "traceread-report.html"


def default_html_path(paths: tuple[str, ...]) -> Path:
    """``<run folder>/traceread-report.html``; the current folder when the run folder is read-only."""
    first = Path(paths[0]) if paths else Path.cwd()
    folder = first if first.is_dir() else first.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        folder = Path.cwd()
    return folder / DEFAULT_NAME


def _storage_options(text: str | None) -> dict[str, Any]:
    """--storage-options JSON, else $TRACEREAD_STORAGE_OPTIONS (see traceread.read.remote)."""
    text = text or os.environ.get("TRACEREAD_STORAGE_OPTIONS")
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON ({exc})", param_hint="--storage-options") from None
    if not isinstance(value, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--storage-options")
    return value


def _infer_format(fmt: str | None, output: str | None) -> str:
    if fmt:
        return fmt
    if output:
        suffix = Path(output).suffix.lower()
        return {".json": "json", ".txt": "text", ".text": "text"}.get(suffix, "html")
    return "rich"


def _set_max_rank_bytes(text: str) -> None:
    """The reader's size guard, through the environment so spawned reader workers see it too."""
    from traceread.read.inflate import MAX_RANK_BYTES_ENV, parse_size

    try:
        os.environ[MAX_RANK_BYTES_ENV] = str(parse_size(text))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--max-rank-bytes") from None


def _unwritable(path: Path, exc: OSError) -> click.ClickException:
    return click.ClickException(f"{clean(str(path))}: cannot write ({exc.strerror}); choose a file with -o")


@click.command("report", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", nargs=-1, required=True, metavar="PATHS...")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True, allow_dash=True),
              help="Write the report here (format from --format or the file extension: .html, .json, .txt); - for stdout.")
@click.option("--format", "fmt", type=click.Choice(FORMATS),
              help="rich: terminal summary (+ HTML beside the run); html; text: plain summary; json: schema traceread.report/1.")
@click.option("--no-cache", is_flag=True,
              help="Re-parse and re-analyse every trace instead of using the parse and summary caches.")
@click.option("--params", type=float, metavar="N", help="Model parameters, for MFU = 6·N·tokens ÷ (peak × step time).")
@click.option("--tokens-per-step", type=float, metavar="D", help="Tokens per step for the whole job (with --params).")
@click.option("--n-layers", type=click.IntRange(min=1), metavar="L",
              help="Transformer layers: with --seq-len and --d-model adds attention's 12·L·s·d FLOPs per token to MFU.")
@click.option("--seq-len", type=click.IntRange(min=1), metavar="S", help="Sequence length (with --n-layers, --d-model).")
@click.option("--d-model", type=click.IntRange(min=1), metavar="D", help="Hidden size (with --n-layers, --seq-len).")
@click.option("--device-spec", type=click.Path(exists=True, dir_okay=False),
              help="JSON/TOML file with peak FLOP/s and bandwidth for GPUs the built-in table lacks.")
@click.option("--top", type=click.IntRange(1, 1000), default=10, show_default=True,
              help="Rows per table in the terminal summary (findings, ranks, collectives).")
@click.option("-j", "--workers", type=click.IntRange(1, 256), default=None,
              help="Worker processes for reading ranks (default: one per CPU).")
@click.option("--cycle", "cycle", default="latest", show_default=True, metavar="N|RUN:N|all|latest",
              help="Folders with several profiling cycles (or runs): which to analyse. latest = the latest "
                   "complete cycle that is not warm-up; all = every cycle of the latest run, plus the drift "
                   "table (docs/cycles.md).")
@click.option("--no-html", is_flag=True, help="With the default (rich) format: do not write the HTML file.")
@click.option("--executor", type=click.Choice(EXECUTORS), default="local", show_default=True,
              help="Where each rank is read and summarised: local worker processes, or Ray tasks (pip install 'traceread[ray]').")
@click.option("--ray-address", metavar="ADDR", default=None,
              help="Ray cluster to use with --executor ray (default: $RAY_ADDRESS, else a local Ray).")
@click.option("--node-local", is_flag=True,
              help="With --executor ray: PATHS are on each node's own disk; list them on every node and read "
                   "each rank on the node that holds it (docs/engine.md).")
@click.option("--max-rank-bytes", "max_rank_bytes", metavar="SIZE", default="16GiB", show_default=True,
              help="Refuse a rank whose uncompressed JSON is larger (a decompression bomb, not a trace), e.g. 64GiB.")
@click.option("--storage-options", metavar="JSON", default=None,
              help='fsspec options for s3:// gs:// az:// https:// PATHS, e.g. \'{"endpoint_url": "http://minio:9000"}\' '
                   "(default: $TRACEREAD_STORAGE_OPTIONS).")
def report(paths: tuple[str, ...], output: str | None, fmt: str | None, no_cache: bool, params: float | None,
           tokens_per_step: float | None, n_layers: int | None, seq_len: int | None, d_model: int | None,
           device_spec: str | None, top: int, workers: int | None, no_html: bool, executor: str,
           ray_address: str | None, node_local: bool, storage_options: str | None, cycle: str,
           max_rank_bytes: str) -> None:
    """Say where each step's time goes, rank by rank, and what to change.

    PATHS are run folders (searched recursively), trace files (*.pt.trace.json[.gz]) or globs.

    \b
    Examples:
      traceread report runs/exp1                       # summary + runs/exp1/traceread-report.html
      traceread report runs/exp1 -o exp1.html          # HTML where you want it
      traceread report 'traces/rank*.json.gz' --format json -o report.json
      traceread report runs/exp1 --format json -o - | jq .findings   # JSON on stdout
      traceread report runs/exp1 --format text --top 20
      traceread report runs/long --cycle all          # every profiling cycle + what grew over time
      traceread report tb_logs/ --cycle 2             # one cycle of a tensorboard_trace_handler folder
      traceread report runs/exp1 --params 7e9 --tokens-per-step 4194304
      traceread report runs/exp1 --params 7e9 --tokens-per-step 4194304 \\
          --n-layers 32 --seq-len 4096 --d-model 4096      # MFU with the attention term
      traceread report s3://bucket/run7/ --executor ray --ray-address auto   # ranks as Ray tasks
      traceread report /nvme/run7 --executor ray --ray-address auto --node-local  # each node reads its own

    \b
    Exit codes: 0 report written (findings are not errors), 2 bad input (unreadable or
    inconsistent traces, e.g. two runs mixed, or a path that does not exist), 3 no trace file
    found under PATHS.
    """
    from traceread.build.report import NothingUsableError, ReportOptions, build_report

    if (params is None) != (tokens_per_step is None):
        raise click.UsageError("--params and --tokens-per-step go together (MFU needs both)")
    shape = (n_layers, seq_len, d_model)
    if any(v is not None for v in shape) and (None in shape or params is None):
        raise click.UsageError("--n-layers, --seq-len and --d-model go together, with --params and --tokens-per-step")
    fmt = _infer_format(fmt, output)
    if node_local and executor != "ray":
        raise click.UsageError("--node-local goes with --executor ray (the files are read where they are)")
    if executor == "ray" and importlib.util.find_spec("ray") is None:
        fail("--executor ray needs Ray: pip install 'traceread[ray]'")
    _set_max_rank_bytes(max_rank_bytes)
    opts = ReportOptions(use_cache=not no_cache, workers=workers, progress=sys.stderr.isatty(), params=params,
                         tokens_per_step=tokens_per_step, n_layers=n_layers, seq_len=seq_len, d_model=d_model,
                         device_spec=Path(device_spec) if device_spec else None, cycle=cycle, executor=executor,
                         ray_address=ray_address, node_local=node_local,
                         storage_options=_storage_options(storage_options))
    try:
        if cycle.strip().lower() == "all":
            from traceread.compare.cycles import build_all_cycles

            doc = build_all_cycles(list(paths), opts)
        else:
            doc = build_report(list(paths), opts)
    except ValueError as exc:  # reader.cycles.CycleChoiceError, imported only then (warm path stays light)
        from traceread.read.cycles import CycleChoiceError

        if not isinstance(exc, CycleChoiceError):
            raise
        fail(str(exc))
    except NothingUsableError as exc:
        fail(str(exc), EXIT_BAD_INPUT if exc.bad_input else EXIT_NO_TRACES)

    if output == "-":  # stdout: the document only, nothing else on it
        from traceread.render import html as html_mod
        from traceread.render import json_report, terminal

        text = (json_report.to_json(doc) + "\n" if fmt == "json" else terminal.render_text(doc, top=top)
                if fmt == "text" else html_mod.render_html(doc, title=f"traceread report — {', '.join(paths)[:120]}"))
        click.echo(text, nl=False)
        return
    if fmt == "json":
        from traceread.render import json_report

        text = json_report.to_json(doc)
        if output:
            Path(output).write_text(text + "\n", encoding="utf-8")
            click.echo(f"JSON report: {output}", err=True)
        else:
            click.echo(text)
        return
    from traceread.render import terminal

    if fmt == "text":
        out = terminal.render_text(doc, top=top)
        if output:
            Path(output).write_text(out, encoding="utf-8")
            click.echo(f"text report: {output}", err=True)
        else:
            click.echo(out, nl=False)
        return

    from rich.console import Console

    from traceread.render import html as html_mod

    html_path: Path | None = None
    if fmt == "html" or not no_html:
        html_path = Path(output) if output else default_html_path(paths)
        try:
            html_mod.write_html(doc, html_path, title=f"traceread report — {', '.join(paths)[:120]}")
        except OSError as exc:
            if output or html_path.parent.resolve() == Path.cwd().resolve():
                raise _unwritable(html_path, exc) from exc
            fallback = Path.cwd() / DEFAULT_NAME
            click.echo(f"traceread: {clean(str(html_path))}: cannot write ({exc.strerror}); "
                       f"writing {clean(str(fallback))} instead", err=True)
            html_path = fallback
            try:
                html_mod.write_html(doc, html_path)
            except OSError as exc2:
                raise _unwritable(html_path, exc2) from exc2
    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        # Piped into a log or `less`: rich would fall back to 80 columns and squash the tables.
        console = Console(highlight=False, width=140)
    terminal.render(doc, console, top=top, html_path=str(html_path) if html_path else None)
