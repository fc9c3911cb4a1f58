"""``traceread hang RUN``: which rank hung the job, in which collective, on which line."""

from __future__ import annotations

import json
from pathlib import Path

import click

from traceread.commands.fail import fail
from traceread.errors import EXIT_NO_TRACES, EXIT_OK, TraceReadError
from traceread.textsafe import clean


def _text(diag) -> str:
    from traceread.textsafe import clean_data

    e = clean_data(diag.entry)  # stack frames, pg names, log lines: no terminal control survives
    lines = [clean(diag.headline), ""]
    seq = e.get("seq")
    lines.append(f"collective : {e.get('op')}" + (f" #{seq}" if seq is not None else "") + f"  (pg {e.get('pg')})")
    lines.append(f"culprits   : {', '.join(map(str, e.get('missing_ranks') or [])) or '-'}   (never joined)")
    lines.append(f"waiting    : {', '.join(map(str, e.get('waiting_ranks') or [])) or '-'}")
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
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="text: the answer then the evidence; json: the HangEntry of the report schema.")
@click.pass_context
def hang(ctx: click.Context, run_dir: Path, fmt: str) -> None:
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
    """
    from traceread.analysis.hang.diagnose import diagnose

    try:
        diag = diagnose(run_dir)
    except TraceReadError as exc:
        fail(str(exc))
    if diag is None:
        click.echo(f"{clean(str(run_dir))}: no hang evidence (no Flight Recorder dump, stack dump, hang.json, watchdog timeout "
                   "or timeout error file)", err=True)
        ctx.exit(EXIT_NO_TRACES)
        return
    if fmt == "json":
        click.echo(json.dumps(diag.entry, indent=1))
    else:
        click.echo(_text(diag))
    ctx.exit(EXIT_OK)
