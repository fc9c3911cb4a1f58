"""``traceread diff A B``: what changed between two runs (baseline A, candidate B).

The comparison and its definitions are :mod:`traceread.compare.diff`; the text view is
:mod:`traceread.render.diff_view`.
"""

from __future__ import annotations

import sys

import click

from traceread.commands.common import check_writable, fail, is_stdout, resolve_format, ui, ui_options, write_output
from traceread.compare.diff import diff_reports
from traceread.errors import EXIT_BAD_INPUT, EXIT_NO_TRACES
from traceread.render.diff_view import render_diff
from traceread.render.textfit import output_width, use_color


def split_cycle(arg: str) -> tuple[str, str | None]:
    """``RUN@3`` / ``RUN@2:3`` -> (``RUN``, cycle); a path that exists as written is never split."""
    from pathlib import Path as _P

    if "@" not in arg or _P(arg).exists():
        return arg, None
    path, _, cycle = arg.rpartition("@")
    return (path, cycle) if path and cycle else (arg, None)


@click.command("diff", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("a", type=click.Path())
@click.argument("b", type=click.Path(), required=False)
@click.option("--format", "fmt", type=click.Choice(("text", "json")), default=None,
              help="text (default) or json (schema traceread.diff/1); -o FILE picks it from the extension.")
@click.option("-o", "--output", metavar="FILE|-", help="Write here (.txt or .json) instead of stdout; - is stdout.")
@click.option("--top", type=click.IntRange(1, 1000), default=15, show_default=True, help="Kernel/collective rows.")
@click.option("--no-cache", is_flag=True, help="Re-parse every trace instead of using the parse cache.")
@click.option("--cycles", metavar="N,M", help="Compare two profiling cycles of the one run A (e.g. 1,3; RUN:N works too).")
@ui_options
def diff(a: str, b: str | None, fmt: str, output: str | None, top: int, no_cache: bool, cycles: str | None) -> None:
    """Compare two runs (A = baseline, B = candidate): step time, breakdown, kernels, collectives.

    A and B are run folders, trace files or globs, as for `traceread report`; `RUN@N` is cycle N of a
    folder holding several profiling cycles (`RUN@R:N`: run R's cycle N), and `--cycles N,M` compares
    two cycles of the one folder A. Without a cycle, a multi-cycle folder stands for its latest cycle.

    \b
    Examples:
      traceread diff runs/before runs/after
      traceread diff runs/before/rank0.pt.trace.json.gz runs/after/rank0.pt.trace.json.gz
      traceread diff runs/before runs/after --format json -o diff.json
      traceread diff runs/long --cycles 1,3          # first vs third profiling cycle of one run
      traceread diff runs/long@1 runs/long@3         # the same

    \b
    Exit codes: 0 compared, 2 bad input, 3 no trace found in A or B.
    """
    from dataclasses import replace

    fmt = resolve_format("diff", fmt, output, {".json": "json", ".txt": "text", ".text": "text"}, "text")
    check_writable(output)

    import orjson

    from traceread.assemble.report import NothingUsableError, ReportOptions, build_report
    from traceread.read.cycles import CycleChoiceError
    from traceread.render.json_report import _jsonable

    ca: str | None
    cb: str | None
    if cycles:
        parts = [c.strip() for c in cycles.split(",")]
        if b is not None or len(parts) != 2 or not all(parts):
            raise click.UsageError("--cycles takes two cycles of the one folder A, e.g. traceread diff RUN --cycles 1,3")
        (pa, ca), (pb, cb) = (a, parts[0]), (a, parts[1])
    elif b is None:
        raise click.UsageError("give two runs A B, RUN@N RUN@M, or one folder with --cycles N,M")
    else:
        (pa, ca), (pb, cb) = split_cycle(a), split_cycle(b)
    opts = ReportOptions(use_cache=not no_cache, progress=sys.stderr.isatty() and not ui().quiet)
    try:
        ra = build_report([pa], replace(opts, cycle=ca))
        rb = build_report([pb], replace(opts, cycle=cb))
    except CycleChoiceError as exc:
        fail(str(exc))
    except NothingUsableError as exc:
        fail(str(exc), EXIT_BAD_INPUT if exc.bad_input else EXIT_NO_TRACES)
    d = diff_reports(ra, rb, top=top)
    if fmt == "json":
        text = orjson.dumps(_jsonable(d), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode() + "\n"
    elif output and not is_stdout(output):
        text = render_diff(d)
    else:
        text = render_diff(d, plain=not use_color(sys.stdout, ui().color), width=output_width(sys.stdout))
    write_output(output, text)
    if output and not is_stdout(output):
        ui().note(f"diff: {output}")
