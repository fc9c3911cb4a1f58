"""``traceread report``: analyse a run's traces and print/write the report.

Default: a summary on the terminal (answer first) and the full HTML report written beside the run
(``<folder>/traceread-report.html``, or in the current folder when the run folder is read-only).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from traceread.commands.common import (
    OutputError,
    check_writable,
    fail,
    is_stdout,
    open_in_browser,
    resolve_format,
    ui,
    ui_options,
    write_output,
)
from traceread.errors import EXIT_BAD_INPUT, EXIT_NO_TRACES
from traceread.options import EXECUTORS
from traceread.textsafe import clean

FORMATS = ("rich", "html", "text", "json", "csv")
DEFAULT_NAME = "traceread-report.html"
DEFAULT_CSV = "traceread-csv"
#: Extension of ``-o FILE`` -> format (csv writes a folder, named with --format csv).
SUFFIXES = {".html": "html", ".htm": "html", ".json": "json", ".txt": "text", ".text": "text"}


def default_html_path(paths: tuple[str, ...], name: str = DEFAULT_NAME) -> Path:
    """``<run folder>/traceread-report.html``; the current folder when the run folder is read-only."""
    first = Path(paths[0]) if paths else Path.cwd()
    folder = first if first.is_dir() else first.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        folder = Path.cwd()
    return folder / name


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


def _set_max_rank_bytes(text: str) -> None:
    """The reader's size guard, through the environment so spawned reader workers see it too; restored
    when the command ends (a command run in-process, as tests and notebooks do, leaves no limit behind)."""
    from traceread.read.inflate import parse_size, rank_bytes_limit

    try:
        limit = parse_size(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--max-rank-bytes") from None
    click.get_current_context().with_resource(rank_bytes_limit(limit))


@click.command("report", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", nargs=-1, required=True, metavar="PATHS...")
@click.option("-o", "--output", metavar="FILE|-",
              help="Write the report here; the format follows the extension (.html, .json, .txt) or --format; "
                   "- is stdout. With --format csv: a folder.")
@click.option("--format", "fmt", type=click.Choice(FORMATS),
              help="rich: terminal summary (+ HTML beside the run); html; text: plain summary; json: schema "
                   "traceread.report/1; csv: a folder with one CSV per table.")
@click.option("--open", "open_page", is_flag=True, help="Open the HTML report in the default browser.")
@click.option("--no-cache", is_flag=True,
              help="Re-parse and re-analyse every trace instead of using the caches (traceread cache shows them).")
@click.option("--params", type=float, metavar="N",
              help="Model parameters: the memory model (weights, gradients, optimizer state per GPU) and, with "
                   "--tokens-per-step, MFU = 6·N·tokens ÷ (peak × step time).")
@click.option("--tokens-per-step", type=float, metavar="D", help="Tokens per step for the whole job (with --params).")
@click.option("--n-layers", type=click.IntRange(min=1), metavar="L",
              help="Transformer layers: with --seq-len and --d-model adds attention's 12·L·s·d FLOPs per token to MFU.")
@click.option("--seq-len", type=click.IntRange(min=1), metavar="S", help="Sequence length (with --n-layers, --d-model).")
@click.option("--d-model", type=click.IntRange(min=1), metavar="D", help="Hidden size (with --n-layers, --seq-len).")
@click.option("--zero-stage", type=click.IntRange(0, 3), default=None, metavar="0-3",
              help="Memory model (with --params): ZeRO stage (default: 3 when the layout finds an FSDP group, else 0).")
@click.option("--param-dtype", type=click.Choice(["bf16", "fp16", "fp32"]), default="bf16", show_default=True,
              help="Memory model: dtype of the weights and gradients.")
@click.option("--optimizer", type=click.Choice(["adamw", "adam", "sgd-momentum", "sgd"]), default="adamw",
              show_default=True, help="Memory model: the optimizer whose fp32 state each parameter keeps (8, 8, 4, 0 bytes).")
@click.option("--master-weights", is_flag=True,
              help="Memory model: the optimizer also keeps an fp32 master copy of the weights (4 bytes per parameter).")
@click.option("--snapshot", "snapshots", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="A memory snapshot (torch.cuda.memory._dump_snapshot pickle) to read; repeatable. RUN/memory/ "
                   "and files named *snapshot*.pickle in PATHS are found without it.")
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
@ui_options
def report(paths: tuple[str, ...], output: str | None, fmt: str | None, no_cache: bool, params: float | None,
           tokens_per_step: float | None, n_layers: int | None, seq_len: int | None, d_model: int | None,
           device_spec: str | None, top: int, workers: int | None, no_html: bool, executor: str,
           ray_address: str | None, node_local: bool, storage_options: str | None, cycle: str,
           max_rank_bytes: str, zero_stage: int | None, param_dtype: str, optimizer: str, master_weights: bool,
           snapshots: tuple[str, ...], open_page: bool) -> None:
    """Say where each step's time goes, rank by rank, and what to change.

    PATHS are run folders (searched recursively), trace files (*.pt.trace.json[.gz]) or globs.

    \b
    Examples:
      traceread report runs/exp1                       # summary + runs/exp1/traceread-report.html
      traceread report runs/exp1 -o exp1.html          # HTML where you want it
      traceread report 'traces/rank*.json.gz' --format json -o report.json
      traceread report runs/exp1 --format json -o - | jq .findings   # JSON on stdout
      traceread report runs/exp1 --format csv -o exp1-tables      # one CSV per table
      traceread report runs/exp1 --open -q             # only the answer; the page in the browser
      traceread report runs/exp1 --format text --top 20
      traceread report runs/long --cycle all          # every profiling cycle + what grew over time
      traceread report tb_logs/ --cycle 2             # one cycle of a tensorboard_trace_handler folder
      traceread report runs/exp1 --params 7e9 --tokens-per-step 4194304
      traceread report runs/mem --params 7e9 --zero-stage 1    # memory: measured vs weights/grads/optimizer
      traceread report runs/exp1 --params 7e9 --tokens-per-step 4194304 \\
          --n-layers 32 --seq-len 4096 --d-model 4096      # MFU with the attention term
      traceread report s3://bucket/run7/ --executor ray --ray-address auto   # ranks as Ray tasks
      traceread report /nvme/run7 --executor ray --ray-address auto --node-local  # each node reads its own

    \b
    Exit codes: 0 report written (findings are not errors), 2 bad input (unreadable or
    inconsistent traces, e.g. two runs mixed, a path that does not exist, an output that cannot
    be written), 3 no trace file found under PATHS (a collected run that recorded none included).
    """
    from traceread.assemble.report import NothingUsableError, ReportOptions

    if tokens_per_step is not None and params is None:
        raise click.UsageError("--tokens-per-step needs --params (MFU = 6·N·tokens)")
    shape = (n_layers, seq_len, d_model)
    if any(v is not None for v in shape) and (None in shape or params is None):
        raise click.UsageError("--n-layers, --seq-len and --d-model go together, with --params and --tokens-per-step")
    u = ui()
    fmt = resolve_format("report", fmt, output, SUFFIXES, "rich", folder_formats=("csv",))
    if fmt == "csv" and is_stdout(output):
        raise OutputError("--format csv writes a folder of files; give -o FOLDER", "-")
    if open_page and (fmt not in ("rich", "html") or no_html or is_stdout(output)):
        raise click.UsageError("--open opens the HTML report: use it with the default format or -o FILE.html")
    check_writable(output, folder=fmt == "csv")
    if node_local and executor != "ray":
        raise click.UsageError("--node-local goes with --executor ray (the files are read where they are)")
    if executor == "ray" and importlib.util.find_spec("ray") is None:
        fail("--executor ray needs Ray: pip install 'traceread[ray]'")
    _set_max_rank_bytes(max_rank_bytes)
    opts = ReportOptions(use_cache=not no_cache, workers=workers, progress=sys.stderr.isatty() and not u.quiet,
                         params=params, tokens_per_step=tokens_per_step, n_layers=n_layers, seq_len=seq_len,
                         d_model=d_model, device_spec=Path(device_spec) if device_spec else None, cycle=cycle,
                         executor=executor, ray_address=ray_address, node_local=node_local,
                         storage_options=_storage_options(storage_options), zero_stage=zero_stage,
                         param_dtype=param_dtype, optimizer=optimizer, master_weights=master_weights,
                         snapshots=[Path(p) for p in snapshots])
    t0 = time.perf_counter()
    doc: Any
    try:
        from traceread.compare.captures import build_watched

        doc = build_watched(list(paths), opts)  # --cycle all, and a watched run's series and captures
    except ValueError as exc:  # reader.cycles.CycleChoiceError, imported only then (warm path stays light)
        from traceread.read.cycles import CycleChoiceError

        if not isinstance(exc, CycleChoiceError):
            raise
        fail(str(exc))
    except NothingUsableError as exc:
        fail(str(exc), EXIT_BAD_INPUT if exc.bad_input else EXIT_NO_TRACES)
    src = doc.get("source") or {}
    u.detail(f"analysed {len(doc.get('ranks') or [])} rank(s) of {src.get('files', '?')} trace file(s) in "
             f"{time.perf_counter() - t0:.2f} s (cache: {'off' if no_cache else _cache_dir(opts)})")
    title = f"traceread report — {', '.join(paths)[:120]}"

    if fmt == "csv":
        from traceread.render.tables import write_csv

        folder = Path(output) if output else default_html_path(paths, DEFAULT_CSV)
        try:
            written = write_csv(doc, folder)
        except OSError as exc:
            raise OutputError(f"cannot write ({exc.strerror or exc})", str(folder)) from None
        u.note(f"CSV tables: {folder}/ ({', '.join(p.name for p in written)})")
        return
    if fmt == "json":
        from traceread.render import json_report

        write_output(output, json_report.to_json(doc) + "\n")
        if output and not is_stdout(output):
            u.note(f"JSON report: {output}")
        return
    from traceread.render import terminal

    if fmt == "text":
        write_output(output, terminal.render_text(doc, top=top, quiet=u.quiet, verbose=u.verbose))
        if output and not is_stdout(output):
            u.note(f"text report: {output}")
        return
    if fmt == "html" and is_stdout(output):
        from traceread.render import html as html_mod

        write_output(output, html_mod.render_html(doc, title=title))
        return

    html_path: Path | None = None
    if fmt == "html" or (not no_html and not is_stdout(output)):
        html_path = _write_page(doc, Path(output) if output else None, paths, title)
    terminal.render_to(doc, sys.stdout, color=u.color, top=top, quiet=u.quiet, verbose=u.verbose,
                       html_path=None if u.quiet or html_path is None else str(html_path))
    if open_page and html_path is not None and not open_in_browser(html_path):
        u.note(f"could not start a browser; open {html_path} yourself")


def _cache_dir(opts: Any) -> str:
    from traceread.engine.caches import cache_root

    return str(cache_root(opts.cache_dir))


def _write_page(doc: Any, output: Path | None, paths: tuple[str, ...], title: str) -> Path:
    """The HTML page at ``output``, else beside the run (the current folder when that is read-only)."""
    from traceread.render import html as html_mod

    path = output or default_html_path(paths)
    try:
        html_mod.write_html(doc, path, title=title)
        return path
    except OSError as exc:
        if output is not None or path.parent.resolve() == Path.cwd().resolve():
            raise OutputError(f"cannot write ({exc.strerror}); choose a file with -o", str(path)) from None
        fallback = Path.cwd() / DEFAULT_NAME
        ui().note(f"traceread: {clean(str(path))}: cannot write ({exc.strerror}); writing {clean(str(fallback))} instead")
    try:
        html_mod.write_html(doc, fallback, title=title)
    except OSError as exc2:
        raise OutputError(f"cannot write ({exc2.strerror}); choose a file with -o", str(fallback)) from None
    return fallback
