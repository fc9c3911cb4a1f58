"""``traceread hang RUN``: which ranks stopped the job, in which groups' collectives, on which line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from traceread.commands.common import check_writable, fail, resolve_format, ui, ui_options, write_output
from traceread.errors import EXIT_NO_TRACES, EXIT_OK, TraceReadError
from traceread.fmt import ranks_words
from traceread.textsafe import clean

#: Stuck groups and stack lines printed in text (all of them are in --format json).
TEXT_GROUPS = 12
TEXT_STACKS = 16


def _behind_text(b: dict[str, Any]) -> str:
    why = {"never_enqueued": "never enqueued it", "not_started": "enqueued, GPU never started it",
           "busy": "in another collective first", "no_dump": "no dump"}.get(b.get("why", ""), b.get("why", ""))
    at = f", at #{b['enqueued']}" if b.get("enqueued") is not None and b.get("why") == "never_enqueued" else ""
    return f"rank {b['rank']} ({why}{at})"


def _text(diag: Any) -> str:
    from traceread.textsafe import clean_data

    e = clean_data(diag.entry)  # stack frames, pg names, log lines: no terminal control survives
    culprits = e.get("culprits") or []
    groups = e.get("groups") or []
    lines = [clean(x) for x in diag.lines]
    lines.append("")
    if culprits or groups:
        if e.get("dumps"):
            lines.append(e["dumps"])
        if groups:
            lines.append(f"stuck groups ({len(groups)}):")
            for g in groups[:TEXT_GROUPS]:
                behind = "; ".join(_behind_text(b) for b in (g.get("behind") or [])[:6])
                more = len(g.get("behind") or []) - 6
                lines.append(
                    f"  pg {g['pg']} ({g.get('role')}{', ' + g['desc'] if g.get('desc') and g['desc'] != 'undefined' else ''})"
                    f" {g.get('op')} #{g.get('seq')} {g.get('sizes') or ''} {g.get('dtype') or ''}".rstrip()
                    + f": in it {ranks_words(g.get('waiting') or [])}"
                    + (f"; behind {behind}" + (f" +{more} more" if more > 0 else "") if behind else "")
                    + (f"; waits on {ranks_words(g['culprits'])}" if g.get("culprits") else "")
                    + (f" [{g['note']}]" if g.get("note") else ""))
            if len(groups) > TEXT_GROUPS:
                lines.append(f"  … {len(groups) - TEXT_GROUPS} more (--format json lists every group)")
        if culprits:
            lines.append("culprits   :")
            for c in culprits[:TEXT_GROUPS]:
                lines.append(f"  rank {c['rank']}: {c['why']}; {c.get('victims', 0)} rank(s) wait on it"
                             + (f"; at {c['stack']}" if c.get("stack") else "")
                             + (f"; last log line: {c['log']}" if c.get("log") else ""))
    else:
        seq = e.get("seq")
        lines.append(f"collective : {e.get('op')}" + (f" #{seq}" if seq is not None else "") + f"  (pg {e.get('pg')})")
        missing, waiting = e.get("missing_ranks") or [], e.get("waiting_ranks") or []
        lines.append(f"culprits   : {ranks_words(missing) + ' (never joined it)' if missing else 'none found'}")
        lines.append(f"waiting    : {ranks_words(waiting) + ' (inside it, for the culprits)' if waiting else 'none recorded'}")
    if e.get("mismatches"):
        lines.append("mismatches :")
        lines += [f"  - {m}" for m in e["mismatches"][:TEXT_GROUPS]]
    if e.get("stacks"):
        named = {str(c["rank"]) for c in culprits} | {str(r) for r in e.get("missing_ranks") or []}
        items = sorted(e["stacks"].items(), key=lambda kv: (kv[0] not in named, int(kv[0])))
        lines.append("stacks     :")
        lines += [f"  rank {r}: {where}" for r, where in items[:TEXT_STACKS]]
        if len(items) > TEXT_STACKS:
            lines.append(f"  … {len(items) - TEXT_STACKS} more (--format json)")
    lines.append("evidence   :")
    lines += [f"  - {x}" for x in e.get("evidence") or []]
    return "\n".join(lines)


def _failure(run_dir: Path) -> dict[str, Any] | None:
    """Why the job stopped, when it failed (a crash, a non-zero exit): it leads the hang diagnosis."""
    from traceread.analysis.hang.failure import diagnose_failure

    try:
        return diagnose_failure(run_dir)
    except Exception as exc:  # the hang diagnosis still stands
        click.echo(f"{clean(str(run_dir))}: failure diagnosis: {type(exc).__name__}: {clean(str(exc))}", err=True)
        return None


def _nccl_error(run_dir: Path) -> str | None:
    """The NCCL logs' first error diagnosis, for a folder with no hang evidence (a job that died)."""
    from traceread.analysis.hang.sources import load_sources

    try:
        nccl = load_sources(run_dir).nccl or {}
    except (TraceReadError, OSError):
        return None
    d = next((d for d in nccl.get("diagnoses") or [] if d.get("severity") == "error"), None)
    if d is None:
        return None
    first = f" [{d['first_line']}]" if d.get("first_line") else ""
    return f"{d['message']}{first}" + (f" CHANGE: {d['suggestion']}" if d.get("suggestion") else "")


@click.command("hang")
@click.argument("run_dir", metavar="PATH", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default=None,
              help="text: one line per culprit, the stuck groups, then the evidence; json: the HangEntry of the "
                   "report schema (culprits[] and groups[] included).")
@click.option("-o", "--output", metavar="FILE|-", help="Write it here (.txt or .json, or --format); - is stdout (the default).")
@click.option("-j", "--workers", type=int, default=None,
              help="Processes reading Flight Recorder dumps (default: one per CPU for many dumps).")
@ui_options
@click.pass_context
def hang(ctx: click.Context, run_dir: Path, fmt: str, output: str | None, workers: int | None) -> None:
    """Explain why a job hung: every rank that stopped it (GPU stopped, host elsewhere, no dump, a
    collective skipped or issued out of order, a mismatch), every stuck process group with the ranks
    waiting in it, and the Python line and last log line of each culprit.

    PATH is a run folder of `traceread collect`, any folder holding Flight Recorder dumps (flat,
    nested, any file names: they are recognised by content; pickle or JSON, NCCL or gloo recorder,
    torch 2.4-2.13), or one dump file. Also read when present: stack dumps (faulthandler / py-spy),
    NCCL and launcher logs (watchdog timeouts), torchelastic error files, the collector's hang.json.
    Exit code 0 when a diagnosis is printed, 3 when there is no hang evidence, 2 on unreadable input.

    \b
    Examples:
      traceread hang runs/exp1
      traceread hang /scratch/fr_dumps/            # torch's _dump_0 ... _dump_4095
      traceread hang runs/exp1 --format json | jq '.culprits[] | {rank, why, summary}'
      traceread hang runs/exp1 -o hang.json
    """
    from traceread.analysis.hang.diagnose import diagnose

    fmt = resolve_format("hang", fmt, output, {".json": "json", ".txt": "text", ".text": "text"}, "text")
    check_writable(output)
    if not run_dir.exists():
        fail(f"{run_dir}: no such file or folder")
        return
    try:
        diag = diagnose(run_dir, workers)
    except TraceReadError as exc:
        fail(str(exc))
    failure = _failure(run_dir)
    if failure is not None and diag is not None and not failure.get("first"):
        diag.entry["failure"] = failure  # type: ignore[typeddict-item]  # every error echoes the hang: it leads
        failure = None
    if failure is not None:  # the job died: why leads, the hang evidence (if any) follows
        lead = "\n".join(clean(x) for x in failure.get("lines") or [])
        if diag is None:
            write_output(output, json.dumps({"failure": failure}, indent=1) + "\n" if fmt == "json" else lead + "\n")
            ctx.exit(EXIT_OK)
            return
        diag.entry["failure"] = failure  # type: ignore[typeddict-item]
        text = lead + "\n\n" + _text(diag) if fmt != "json" else ""
        write_output(output, json.dumps(diag.entry, indent=1) + "\n" if fmt == "json" else text + "\n")
        ctx.exit(EXIT_OK)
        return
    if diag is None:
        click.echo(f"{clean(str(run_dir))}: no hang evidence (no Flight Recorder dump with an unfinished collective, "
                   "stack dump, hang.json, watchdog timeout or timeout error file)", err=True)
        failed = _nccl_error(run_dir)
        if failed:
            click.echo(f"but the NCCL logs report an error (the job failed rather than hung): {clean(failed)}")
        ctx.exit(EXIT_NO_TRACES)
        return
    write_output(output, json.dumps(diag.entry, indent=1) + "\n" if fmt == "json" else _text(diag) + "\n")
    if output and output != "-":
        ui().note(f"hang diagnosis: {output}")
    ctx.exit(EXIT_OK)
