"""``traceread mcp`` driven by the official MCP client over stdio: a real server process, real protocol.

The client lists the tools, asks for the demo's report and gets the straggler back (rank 5, the same
answer as ``traceread report``), lists a run folder, explains a real gloo hang, diffs two runs, writes
a Perfetto timeline, and looks up a finding's meaning. A bad path is a tool error naming the path,
and the server answers the next call after it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp", reason="the mcp SDK is in the [test] extra")

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from traceread.commands import agent_tools

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "sample_traces" / "ddp_straggler_h100"
HANG = ROOT / "sample_traces" / "cpu_hang_gloo"


def _server(tmp: Path) -> StdioServerParameters:
    env = dict(os.environ, TRACEREAD_CACHE_DIR=str(tmp / "cache"), TRACEREAD_AGENT_OUT=str(tmp / "out"),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return StdioServerParameters(command=sys.executable, args=["-m", "traceread.cli", "mcp"], env=env, cwd=str(ROOT))


def _json(result: Any) -> Any:
    assert not result.is_error, result.content
    if result.structured_content is not None:
        sc = result.structured_content
        return sc.get("result", sc) if isinstance(sc, dict) and set(sc) == {"result"} else sc
    return json.loads(result.content[0].text)


def _session(tmp: Path, body: Any) -> Any:
    async def main() -> Any:
        async with Client(_server(tmp), read_timeout_seconds=600) as client:
            return await body(client)

    return anyio.run(main)


def test_client_lists_and_calls_every_tool(tmp_path: Path) -> None:
    timeline = tmp_path / "timeline.json.gz"

    async def body(client: Client) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out["tools"] = sorted(t.name for t in (await client.list_tools()).tools)
        out["report"] = _json(await client.call_tool("report", {"paths": [str(DEMO)]}))
        out["contents"] = _json(await client.call_tool("contents", {"path": str(HANG)}))
        out["hang"] = _json(await client.call_tool("hang", {"path": str(HANG)}))
        out["diff"] = _json(await client.call_tool("diff", {"a": str(DEMO), "b": str(DEMO)}))
        out["export"] = _json(await client.call_tool("export_timeline", {"paths": [str(DEMO)], "output": str(timeline)}))
        out["docs"] = _json(await client.call_tool("finding_docs", {"finding_id": "straggler"}))
        out["bad"] = await client.call_tool("report", {"paths": [str(tmp_path / "no-such-run")]})
        out["after_bad"] = _json(await client.call_tool("contents", {"path": str(DEMO)}))
        return out

    got = _session(tmp_path, body)
    assert got["tools"] == ["contents", "diff", "export_timeline", "finding_docs", "hang", "report", "skill"]

    rep = got["report"]  # the demo's straggler, as the CLI answers it
    assert rep["answer"].startswith("Rank 5 is a straggler"), rep["answer"]
    top = rep["findings"][0]
    assert (top["id"], top["rank"], top["category"]) == ("straggler", 5, "comm_wait")
    assert top["evidence"] and top["suggestions"]
    assert sum(f["impact_us_per_step"] for f in rep["findings"]) <= rep["step_us"] * 1.001 + 1
    assert rep["ledger"] and rep["layout"] and "truncated" not in rep

    listing = got["contents"]
    assert listing["hang_json"] and listing["exit_code"] == 1 and listing["world_size"] == 2
    assert listing["stacks"] == ["stacks/rank0.txt", "stacks/rank1.txt"]
    assert listing["flight_recorder"] == ["fr/rank0.json", "fr/rank1.json"]
    assert listing["trace_files"] == 2
    assert got["hang"]["hang"] is True and got["hang"]["culprits"][0]["rank"] == 1

    assert got["diff"]["answer"][0].startswith("No significant change in step time: +0 µs/step")
    assert timeline.is_file() and got["export"]["bytes"] == timeline.stat().st_size and got["export"]["ranks"] == list(range(8))
    assert "late" in got["docs"]["meaning"] and got["docs"]["page"].startswith("docs/report.md")

    bad = got["bad"]  # a tool error naming the path, not a crash; the next call is answered
    assert bad.is_error and "no-such-run: no such file or folder" in bad.content[0].text
    assert got["after_bad"]["trace_files"] == 8


def test_large_reply_is_bounded_with_a_pointer(tmp_path: Path) -> None:
    os.environ[agent_tools.OUT_ENV] = str(tmp_path / "out")
    try:
        small = agent_tools.report([str(DEMO)], max_bytes=3_000, use_cache=False)
    finally:
        del os.environ[agent_tools.OUT_ENV]
    assert len(json.dumps(small, default=str)) <= 3_000 or small["findings"] == small["findings"][:1]
    assert small["truncated"] and Path(small["full_json"]).is_file()
    full = json.loads(Path(small["full_json"]).read_text())
    assert full["schema"] == "traceread.report/1" and len(full["findings"]) >= len(small["findings"])
    assert small["answer"].startswith("Rank 5 is a straggler")  # the answer is never what gets cut


def test_every_documented_finding_has_a_skill_line() -> None:
    """SKILL.md's glossary and docs/report.md's findings table name the same finding ids."""
    text = (ROOT / "docs" / "report.md").read_text()
    section = text.split("## Findings: shares of the step ledger", 1)[1].split("\n## ", 1)[0]
    documented = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`"):
            documented |= {c.strip().strip("`") for c in cells[0].split(",")}
    assert documented <= set(agent_tools.glossary()), documented - set(agent_tools.glossary())
    with pytest.raises(Exception, match="no finding 'nope'"):
        agent_tools.finding_docs("nope")
    assert agent_tools.finding_docs("nccl_gdr_off")["meaning"].startswith("a diagnosis from NCCL")
