"""``traceread hang RUN``: which rank hung the job, in which collective, on which line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from traceread.commands.common import check_writable, fail, resolve_format, ui, ui_options, write_output
from traceread.errors import EXIT_NO_TRACES, EXIT_OK, TraceReadError
from traceread.textsafe import clean


def _ranks(ranks: list[int]) -> str:
    """``rank 0`` / ``ranks 0-3, 7``: a list of ranks never reads as a count."""
    from traceread.fmt import rank_list

    return f"rank{'s' if len(ranks) != 1 else ''} {rank_list(ranks)}"


def _text(diag: Any) -> str:
    from traceread.textsafe import clean_data

    e = clean_data(diag.entry)  # stack frames, pg names, log lines: no terminal control survives
    lines = [clean(diag.headline), ""]
    seq = e.get("seq")
    lines.append(f"collective : {e.get('op')}" + (f" #{seq}" if seq is not None else "") + f"  (pg {e.get('pg')})")
    missing, waiting = e.get("missing_ranks") or [], e.get("waiting_ranks") or []
    lines.append(f"culprits   : {_ranks(missing) + ' (never joined it)' if missing else 'none found'}")
    lines.append(f"waiting    : {_ranks(waiting) + ' (inside it, for the culprits)' if waiting else 'none recorded'}")
    if e.get("mismatches"):
        lines.append("mismatches :")
        lines += [f"  - {m}" for m in e["mismatches"]]
    if e.get("stacks"):
        lines.append("stacks     :")
        lines += [f"  rank {r}: {where}" for r, where in sorted(e["stacks"].items(), key=lambda kv: int(kv[0]))]
    lines.append("evidence   :")
    lines += [f"  - {x}" for x in e.get("evidence") or []]
    return "\n".join(lines)


@click.command("hang")
@click.argument("run_dir", metavar="RUN", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default=None,
              help="text: the answer then the evidence; json: the HangEntry of the report schema.")
@click.option("-o", "--output", metavar="FILE|-", help="Write it here (.txt or .json, or --format); - is stdout (the default).")
@ui_options
@click.pass_context
def hang(ctx: click.Context, run_dir: Path, fmt: str, output: str | None) -> None:
    """Explain why a collected run hung: the rank that never joined collective #N, the ranks waiting
    in it, mismatched collectives, and the Python line each rank is stuck on.

    Reads RUN/fr (Flight Recorder dumps), RUN/stacks (faulthandler / py-spy), RUN/nccl and
    launcher logs (watchdog timeouts), RUN/errors (torchelastic error files) and RUN/hang.json,
    whichever exist. Exit code 0 when a diagnosis is printed, 3 when the folder holds no hang
    evidence, 2 on unreadable input.

    \b
    Examples:
      traceread hang runs/exp1
      traceread hang runs/exp1 --format json | jq .missing_ranks
      traceread hang runs/exp1 -o hang.json
    """
    from traceread.analysis.hang.diagnose import diagnose

    fmt = resolve_format("hang", fmt, output, {".json": "json", ".txt": "text", ".text": "text"}, "text")
    check_writable(output)
    if not run_dir.exists():
        fail(f"{run_dir}: no such file or folder")
        return
    try:
        diag = diagnose(run_dir)
    except TraceReadError as exc:
        fail(str(exc))
    if diag is None:
        click.echo(f"{clean(str(run_dir))}: no hang evidence (no Flight Recorder dump, stack dump, hang.json, watchdog timeout "
                   "or timeout error file)", err=True)
        ctx.exit(EXIT_NO_TRACES)
        return
    write_output(output, json.dumps(diag.entry, indent=1) + "\n" if fmt == "json" else _text(diag) + "\n")
    if output and output != "-":
        ui().note(f"hang diagnosis: {output}")
    ctx.exit(EXIT_OK)
