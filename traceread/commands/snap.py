"""``traceread snap RUN``: record the next K steps of a running collected job, on every rank, now."""

from __future__ import annotations

import time
from pathlib import Path

import click

from traceread.commands.common import ui, ui_options
from traceread.commands.fail import fail
from traceread.errors import EXIT_NO_TRACES


def _ranks(value: str | None) -> list[int] | None:
    if value is None or value.strip() in ("", "all", "*"):
        return None
    try:
        return sorted({int(r) for r in value.split(",") if r.strip()})
    except ValueError:
        raise click.BadParameter(f"{value!r}: use 'all' or a comma list such as 0,3") from None


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--steps", "k", default=10, show_default=True, type=click.IntRange(1, 200), help="Steps to record (K).")
@click.option("--ranks", default=None, help="Ranks to record: 'all' (default) or e.g. 0,3.")
@click.option("--dump", is_flag=True,
              help="Also take stacks + Flight Recorder of every rank now (done by the job's launcher).")
@click.option("--timeout", default=300.0, show_default=True, type=click.FloatRange(min=0.0), metavar="SECONDS",
              help="Give up waiting for the traces after this long (exit code 3); 0: do not wait.")
@click.option("--lead", default=1.0, show_default=True, type=click.FloatRange(min=0.0), metavar="SECONDS",
              help="Time every rank gets to read the request before the first recorded step (more on slow "
                   "shared file systems).")
@ui_options
def snap(run_dir: Path, k: int, ranks: str | None, dump: bool, timeout: float, lead: float) -> None:
    """Record the next K optimizer steps of the running job collected into RUN_DIR, on every rank.

    Works from another terminal or another host that sees the run folder: it writes a request into
    RUN/inject/capture.request, which each rank reads in its optimizer-step hook; every rank records
    the SAME steps, into RUN/captures/capture{N}/. Prints where, then waits until every rank wrote its
    trace (or said why not).

    \b
    Examples:
      traceread snap runs/exp1                      # the next 10 steps of every rank
      traceread snap runs/exp1 --steps 30 --ranks 0,7 --dump
      traceread snap /shared/runs/exp2 --timeout 0  # ask and return at once
      traceread report runs/exp1                    # the capture is reported against the first window
    """
    from traceread.collect import captures as cap
    from traceread.collect.runinfo import iso, read_json

    hosts = cap.host_dirs(run_dir)
    if not hosts:
        fail(f"{run_dir}: not a run folder of traceread collect (no inject/ folder)")
    if all((h / "run.json").exists() for h in hosts):
        fail(f"{run_dir}: the job has ended (run.json is written); there are no steps left to record")
    wanted = _ranks(ranks)
    state = read_json(hosts[0] / "watch.json") or {}
    nb = state.get("not_before_step")
    not_before = nb if isinstance(nb, int) else 0
    base = state.get("baseline_step_ms")
    step_s = base / 1e3 if isinstance(base, (int, float)) else None
    if step_s is None:
        step_s = _step_time(hosts)
    cid = cap.allocate(hosts)
    first = cap.start_step(hosts, step_s, lead, not_before=not_before)
    steps = [first, first + k - 1]
    now = time.time_ns()
    trigger = {"id": cid, "kind": "on_demand", "detected_at_step": None, "since_step": None,
               "ranks": wanted or [], "baseline_step_ms": state.get("baseline_step_ms"), "observed_step_ms": None,
               "factor": None, "steps": steps, "wall_time": iso(now), "requested_by": "snap", "stacks": None,
               "fr": None, "note": "asked with traceread snap"}
    current = max((s for h in hosts for s, _ in cap.current_steps(h).values()), default=0)
    trigger["detected_at_step"] = trigger["since_step"] = current
    for host in hosts:
        cap.write_trigger(host, cid, trigger)
        cap.write_request(host, cap.make_request(cid, first, k, "on_demand", "snap", wanted, dump))
    folders = [cap.capture_dir(h, cid) for h in hosts]
    click.echo(f"capture {cid}: steps {steps[0]}-{steps[1]} (job now at step {current}) -> "
               + ", ".join(str(f) for f in folders))
    if timeout <= 0:
        return
    expect = {h: [r for r in cap.known_ranks(h) if wanted is None or r in wanted] for h in hosts}
    deadline = time.monotonic() + timeout
    while True:
        outcomes = {h: cap.rank_outcomes(h, cid) for h in hosts}
        waiting = sorted(r for h in hosts for r in expect[h] if r not in outcomes[h])
        if not waiting:
            break
        ended = all((h / "run.json").exists() for h in hosts)
        if ended or time.monotonic() > deadline:
            why = "the job ended" if ended else f"no answer within {timeout:g} s"
            fail(f"{folders[0]}: {why}; no trace yet from rank(s) {','.join(map(str, waiting))}", EXIT_NO_TRACES)
        time.sleep(0.2)
    done = {r: o for h in hosts for r, o in outcomes[h].items()}
    recorded = sorted(r for r, o in done.items() if o.get("state") == "recorded")
    for r, o in sorted(done.items()):
        if o.get("state") != "recorded":
            ui().note(f"  rank {r}: {o.get('state')}: {o.get('reason')}")
    if not recorded:
        fail(f"{folders[0]}: no rank recorded the steps", EXIT_NO_TRACES)
    click.echo(f"recorded by rank(s) {','.join(map(str, recorded))}: {len(recorded)} trace(s) in "
               + ", ".join(str(f) for f in folders))


def _step_time(hosts: list[Path]) -> float | None:
    """Recent step time from the series, for a run without watch.json (the watch was off)."""
    from traceread.collect.captures import read_series

    for host in hosts:
        for path in sorted((host / "progress").glob("rank*.steps"))[:1]:
            pts = read_series(path)[-20:]
            if len(pts) >= 2 and pts[-1][0] > pts[0][0]:
                return (pts[-1][1] - pts[0][1]) / 1e9 / (pts[-1][0] - pts[0][0])
    return None
