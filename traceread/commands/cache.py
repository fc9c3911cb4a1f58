"""``traceread cache [info|clear|limit SIZE]``: what the parse, summary and document caches hold.

The cache (``~/.cache/traceread`` or ``$TRACEREAD_CACHE_DIR``) is bounded: after each report the
least recently used entries are removed while it is over its bound (4 GiB by default;
``$TRACEREAD_CACHE_MAX`` or ``traceread cache limit``). See :mod:`traceread.engine.caches`.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from traceread.commands.common import ui, ui_options

KINDS = (("parse", "parsed traces (parquet tables)"), ("summary", "rank summaries"), ("document", "report documents"))


def _root(cache_dir: str | None) -> Path:
    from traceread.engine.caches import cache_root

    return cache_root(cache_dir)


def _bound_text(root: Path) -> str:
    import os

    from traceread.engine.caches import MAX_ENV, max_bytes
    from traceread.fmt import ibytes

    bound = max_bytes(root)
    origin = f"${MAX_ENV}" if os.environ.get(MAX_ENV) is not None else (
        "traceread cache limit" if (root / "max-size").exists() else "default")
    return ("no bound" if bound is None else ibytes(bound)) + f" ({origin})"


@click.group("cache", invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--cache-dir", metavar="DIR", default=None,
              help="The cache folder (default: $TRACEREAD_CACHE_DIR, else ~/.cache/traceread).")
@ui_options
@click.pass_context
def cache(ctx: click.Context, cache_dir: str | None) -> None:
    """Show (info, the default), clear, or bound the cache of parsed traces, summaries and documents.

    Reports reuse it when a trace is unchanged (same path, size and modification time, same
    traceread). It is bounded: when it grows over its limit, the entries used least recently are
    removed after the next report.

    \b
    Examples:
      traceread cache                 # where it is, what it holds, its bound
      traceread cache clear
      traceread cache limit 10GiB     # remembered in the cache folder; TRACEREAD_CACHE_MAX=... wins
      traceread cache limit off
    """
    ctx.obj = _root(cache_dir)
    if ctx.invoked_subcommand is None:
        ctx.invoke(info)


@cache.command("info")
@ui_options
@click.pass_obj
def info(root: Path) -> None:
    """Where the cache is, what it holds, and its bound."""
    from traceread.engine.caches import entries
    from traceread.fmt import ibytes

    found = entries(root)
    total = sum(e.bytes for e in found)
    click.echo(f"cache: {root}" + ("" if root.is_dir() else " (not created yet)"))
    click.echo(f"size:  {ibytes(total)} in {len(found)} entries; bound {_bound_text(root)}")
    for kind, words in KINDS:
        sel = [e for e in found if e.kind == kind]
        click.echo(f"  {kind:<9} {len(sel):>6}  {ibytes(sum(e.bytes for e in sel)):>10}  {words}")
    if found:
        oldest = min(e.last_used for e in found)
        days = (time.time() - oldest) / 86400
        click.echo(f"least recently used entry: {days:.1f} day(s) ago")
    if ui().verbose:
        for e in sorted(found, key=lambda e: -e.last_used):
            used = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_used))
            click.echo(f"  {e.kind:<9} {ibytes(e.bytes):>10}  {used}  {e.path.name}")


@cache.command("clear")
@ui_options
@click.pass_obj
def clear(root: Path) -> None:
    """Remove every entry (reports re-read their traces once)."""
    from traceread.engine.caches import clear as clear_all
    from traceread.fmt import ibytes

    removed, freed = clear_all(root)
    ui().note(f"removed {removed} entries ({ibytes(freed)}) from {root}")


@cache.command("limit")
@click.argument("size")
@ui_options
@click.pass_obj
def limit(root: Path, size: str) -> None:
    """Set the bound (e.g. 10GiB, 500MB; off: no bound) and apply it now."""
    from traceread.engine.caches import evict, set_max_bytes
    from traceread.fmt import ibytes
    from traceread.read.inflate import parse_size

    if size.strip().lower() in ("0", "off", "none", "unlimited"):
        value = None
    else:
        try:
            value = parse_size(size)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="SIZE") from None
    try:
        set_max_bytes(root, value)
    except OSError as exc:
        from traceread.commands.common import OutputError

        raise OutputError(f"cannot write ({exc.strerror or exc})", str(root)) from None
    removed, freed = evict(root)
    ui().note(f"cache bound: {_bound_text(root)}" + (f"; removed {removed} entries ({ibytes(freed)})" if removed else ""))
