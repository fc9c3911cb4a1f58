"""The ``traceread`` command: a click group whose subcommands live one per module in ``commands/``.

Subcommands are imported only when invoked, so ``traceread --help`` stays fast and the report side
never imports the collect side (which needs torch).
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from traceread import __version__
from traceread.commands.fail import error_line
from traceread.errors import EXIT_BAD_INPUT, TraceReadError
from traceread.textsafe import clean_lines

# name -> (module, attribute, one-line help shown by `traceread --help`)
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "report": ("traceread.commands.report", "report", "Analyse traces and say where each step's time goes."),
    "collect": ("traceread.commands.collect", "collect", "Run a training command and collect traces, logs and hang dumps."),
    "snap": ("traceread.commands.snap", "snap", "Record the next K steps of a running collected job, every rank."),
    "watch": ("traceread.commands.watch", "watch", "Show a running collected job live: step times, lag, captures."),
    "hang": ("traceread.commands.hang", "hang", "Explain why a collected run hung (Flight Recorder, stacks, logs)."),
    "diff": ("traceread.commands.diff", "diff", "Compare two runs: what got slower after a change."),
    "simulate": ("traceread.commands.simulate", "simulate", "Write simulated multi-rank GPU traces with exact ground truth."),
    "export": ("traceread.commands.export", "export",
               "Merge every rank into one Perfetto timeline on one clock, findings marked."),
    "cache": ("traceread.commands.cache", "cache", "Show or clear the parse/summary/document cache (size-bounded)."),
    "mcp": ("traceread.commands.mcp", "mcp", "Serve traceread's tools to an agent (Model Context Protocol, stdio)."),
}


class PipeClosed(Exception):
    """The reader of stdout went away (``traceread report | head``): not an error of ours."""


class LazyGroup(click.Group):
    """A click group that imports a subcommand's module only when that subcommand runs."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in SUBCOMMANDS:
            return None
        module_name, attr, _ = SUBCOMMANDS[cmd_name]
        module = importlib.import_module(module_name)
        return getattr(module, attr)

    def invoke(self, ctx: click.Context) -> object:
        # click turns EPIPE into exit code 1; a closed pipe is the reader's choice, so it is ours to end quietly
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise PipeClosed() from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_text) for name, (_, _, help_text) in SUBCOMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="traceread")
def cli() -> None:
    """Find where each step of a multi-GPU training job spends its time.

    \b
    Examples:
      traceread report sample_traces/ddp_straggler_h100
      traceread report runs/exp1 --format json -o report.json
      traceread collect -o runs/exp1 -- torchrun --nproc-per-node 8 train.py
      traceread hang runs/exp1
      traceread export runs/exp1 -o exp1.json.gz     # one timeline for ui.perfetto.dev
      traceread cache info

    \b
    Every command: -o - writes to stdout; -q/--quiet, -v/--verbose, --no-color; exit codes
    0 done, 2 bad input (a path that does not exist, an output that cannot be written),
    3 nothing to analyse.
    Python: import traceread; traceread.analyze("runs/exp1")  (docs/api.md)
    """


def _stdout_gone() -> None:
    """stdout's reader closed the pipe: point stdout at /dev/null so the interpreter's last flush
    cannot fail again, and end with 0 (``traceread report | head`` is a success)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    sys.exit(0)


def main() -> None:
    """Console entry point: user-input errors become one line on stderr, never a traceback."""
    from traceread.engine.memory import quiet_allocator

    quiet_allocator()  # before polars loads (engine.memory does not import it)
    try:
        code = cli.main(standalone_mode=False)
        sys.stdout.flush()
    except (PipeClosed, BrokenPipeError):
        _stdout_gone()
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        # may quote a file name; click declares ``message`` Final, yet show() prints exactly it
        exc.message = clean_lines(exc.message)  # type: ignore[misc]
        exc.show()
        sys.exit(EXIT_BAD_INPUT if exc.exit_code == 1 else exc.exit_code)
    except TraceReadError as exc:
        click.echo(error_line(str(exc)), err=True)
        sys.exit(EXIT_BAD_INPUT)
    except SystemExit:
        raise
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
