"""``traceread watch RUN``: the running job's step, step time, lag and captures, live."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click

from traceread.commands.common import ui, ui_options
from traceread.commands.fail import fail


def _fmt(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.1f} ms"


def _line(view: object) -> str:
    """The plain-text form (not a terminal): one line per refresh."""
    from traceread.collect.live import LiveView, sparkline

    assert isinstance(view, LiveView)
    ranks = " ".join(f"r{r.rank}:{r.step}/{_fmt(r.step_ms)}/lag {_fmt(r.lag_ms)}" for r in view.ranks)
    caps = ", ".join(f"#{c['id']} {c.get('kind')} {c.get('steps')}" for c in view.captures) or "none"
    return (f"step {view.job_step} | {_fmt(view.job_step_ms)}/step (baseline {_fmt(view.baseline_ms)}) "
            f"| trend {sparkline(view.trend_ms)} | {ranks} | captures: {caps}")


def _table(view: object, run_dir: Path) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from traceread.collect.live import LiveView, sparkline

    assert isinstance(view, LiveView)
    table = Table(title=f"traceread watch {run_dir}", expand=False)
    for col in ("rank", "step", "step time", "lag", "behind", "last capture"):
        table.add_column(col, justify="right" if col not in ("last capture",) else "left")
    for r in view.ranks[:64]:
        table.add_row(str(r.rank), str(r.step), _fmt(r.step_ms), _fmt(r.lag_ms),
                      str(r.behind_steps) if r.behind_steps else "", r.last_capture or "")
    more = f"  (+{len(view.ranks) - 64} ranks)" if len(view.ranks) > 64 else ""
    head = Text(f"job step {view.job_step}: {_fmt(view.job_step_ms)} per step, baseline {_fmt(view.baseline_ms)}{more}")
    trend = Text(f"trend ({view.trend_steps} step(s) per mark, max {_fmt(max(view.trend_ms) if view.trend_ms else None)}): "
                 f"{sparkline(view.trend_ms)}")
    caps = Text("captures: " + (", ".join(f"#{c['id']} {c.get('kind')} steps {c.get('steps')}" for c in view.captures)
                                or "none"))
    return Group(head, trend, table, caps)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--interval", default=1.0, show_default=True, type=click.FloatRange(min=0.1), metavar="SECONDS",
              help="Refresh period.")
@click.option("--once", is_flag=True, help="Print the current state once and exit.")
@ui_options
def watch(run_dir: Path, interval: float, once: bool) -> None:
    """Show a running collected job live: per rank its step, step time, lag behind the others, last
    capture; the job's step-time trend. Ends when the job ends. Plain lines when not on a terminal.

    \b
    Examples:
      traceread watch runs/exp1
      traceread watch /shared/runs/exp2 --interval 5 > watch.log
      traceread watch runs/exp1 --once
    """
    from traceread.collect import captures as cap
    from traceread.collect.live import LiveRun

    if not cap.host_dirs(run_dir):
        fail(f"{run_dir}: not a run folder of traceread collect (no inject/ folder)")
    live = LiveRun(run_dir)
    tty = sys.stdout.isatty() and not once and not ui().quiet
    if not tty:  # plain lines (with --quiet: only the closing line)
        while True:
            view = live.refresh()
            if not ui().quiet or once:
                click.echo(_line(view))
            if once or view.ended:
                break
            time.sleep(interval)
    else:
        from rich.console import Console
        from rich.live import Live

        console = Console(no_color=ui().color == "never" or None,
                          force_terminal=True if ui().color == "always" else None)
        view = live.refresh()
        with Live(_table(view, run_dir), console=console, refresh_per_second=max(1, int(1 / interval))) as screen:
            while not view.ended:
                time.sleep(interval)
                view = live.refresh()
                screen.update(_table(view, run_dir))
    if view.ended:
        click.echo(f"the job ended (exit code {view.exit_code}); captures: {len(view.captures)}")
