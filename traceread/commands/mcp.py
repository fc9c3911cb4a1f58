"""``traceread mcp``: the Model Context Protocol server on stdio, for agents.

An agent asked "why is my job slow" with a run folder at hand calls these tools instead of scraping
the terminal text: structured replies within a size bound (:mod:`traceread.commands.agent_tools`),
bad input as a tool error naming the problem (the server keeps running), the CLI's engine and caches.
Built on the official ``mcp`` SDK, an optional dependency (``pip install 'traceread[mcp]'``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

import click

from traceread.commands import agent_tools
from traceread.commands.common import fail
from traceread.errors import TraceReadError

INSTRUCTIONS = ("traceread explains why a multi-GPU PyTorch job is slow or hung from its traces, NCCL logs and "
                "Flight Recorder dumps. Start with `contents` on an unknown folder, then `report`; `hang` for "
                "dumps and stalls; `diff` for two runs. Quote `answer` and `change` as they are; every finding "
                "is a share of the step (never sums past it); `full_json` holds what a reply left out.")


def _as_tool_error(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Input the user got wrong (a path, an option, a folder without traces) becomes a ToolError with
    traceread's one-line message; the server stays up for the next call."""
    from mcp.server.mcpserver.exceptions import ToolError

    @wraps(fn)
    def call(*args: Any, **kw: Any) -> Any:
        try:
            return fn(*args, **kw)
        except (TraceReadError, ValueError, OSError) as exc:
            raise ToolError(str(exc)) from None

    return call


def build_server() -> Any:
    """The server with every tool registered (no transport started)."""
    from mcp.server.mcpserver import MCPServer

    from traceread import __version__

    server = MCPServer(name="traceread", version=__version__, instructions=INSTRUCTIONS)

    @server.tool(description="Where the time of a multi-GPU job goes: the ANSWER (biggest loss, counted once), "
                             "what to change, every finding with evidence, the step ledger and the parallel layout. "
                             "paths: run folders, trace files or globs.")
    @_as_tool_error
    def report(paths: list[str], workers: int | None = None, use_cache: bool = True, cycle: str | None = None,
               params: float | None = None, tokens_per_step: int | None = None,
               max_bytes: int = agent_tools.MAX_REPLY_BYTES) -> dict[str, Any]:
        return agent_tools.report(paths, max_bytes=max_bytes, workers=workers, use_cache=use_cache, cycle=cycle,
                                  params=params, tokens_per_step=tokens_per_step)

    @server.tool(description="Why a job hung: the ranks that stopped it (GPU stopped, host elsewhere, skipped or "
                             "reordered collective…) first, then every stuck process group. path: a run folder or "
                             "a folder of Flight Recorder dumps.")
    @_as_tool_error
    def hang(path: str, max_bytes: int = agent_tools.MAX_REPLY_BYTES) -> dict[str, Any]:
        return agent_tools.hang(path, max_bytes=max_bytes)

    @server.tool(description="What changed from run a to run b: step time, breakdown, findings that appeared or "
                             "vanished; only changes beyond noise.")
    @_as_tool_error
    def diff(a: str, b: str, max_bytes: int = agent_tools.MAX_REPLY_BYTES) -> dict[str, Any]:
        return agent_tools.diff(a, b, max_bytes=max_bytes)

    @server.tool(description="What a folder holds before analysis: trace files, profiling cycles, watch captures, "
                             "NCCL logs, Flight Recorder dumps, stacks, error files, run.json facts.")
    @_as_tool_error
    def contents(path: str) -> dict[str, Any]:
        return agent_tools.contents(path)

    @server.tool(description="Write one Perfetto timeline of every rank on one clock with the findings marked; "
                             "output: a .json or .json.gz path. Open it at ui.perfetto.dev.")
    @_as_tool_error
    def export_timeline(paths: list[str], output: str) -> dict[str, Any]:
        return agent_tools.export_timeline(paths, output)

    @server.tool(description="What a finding id (e.g. straggler, pipeline_bubble, nccl_gdr_off) means and where "
                             "its definition is documented.")
    @_as_tool_error
    def finding_docs(finding_id: str) -> dict[str, Any]:
        return agent_tools.finding_docs(finding_id)

    @server.tool(description="The traceread skill: which tool answers which question and how to read the answer.")
    def skill() -> str:
        return agent_tools.skill_text()

    return server


@click.command("mcp")
@click.option("--skill", "show_skill", is_flag=True, help="Print the agent skill file (SKILL.md) and exit.")
def mcp(show_skill: bool) -> None:
    """Serve traceread's tools to an agent over the Model Context Protocol (stdio).

    Tools: report, hang, diff, contents, export_timeline, finding_docs, skill. Replies are JSON
    within a size bound; what a reply leaves out is written to a file named in `full_json`.
    Needs the `mcp` package: pip install 'traceread[mcp]'. See docs/agents.md.

    \b
    Examples:
      traceread mcp                       # started by the agent client, speaks on stdin/stdout
      claude mcp add traceread -- traceread mcp
      traceread mcp --skill > ~/.claude/skills/traceread/SKILL.md
    """
    if show_skill:
        click.echo(agent_tools.skill_text(), nl=False)
        return
    try:
        server = build_server()
    except ImportError:
        fail("traceread mcp needs the mcp package: pip install 'traceread[mcp]'")
        return
    server.run("stdio")
