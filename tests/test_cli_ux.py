"""What a daily user of the CLI expects (issue 27): ``-o -`` is stdout for every command, formats follow
the extension or are refused, bad paths and unwritable outputs are one line and exit 2, ``| head``
exits 0, ``-q``/``-v``/``--color``/``--no-color``/``--open``, CSV tables, terminal views laid out for
their width, units that scale, names shortened, hang lines in words. The real CLI in a subprocess,
on the samples."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from traceread.fmt import elide_templates, ms, nbytes, short_name

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
DDP = SAMPLES / "ddp_straggler_h100"
HANG = SAMPLES / "cpu_hang_gloo"
CPU_STRAGGLER = SAMPLES / "cpu_straggler_gloo"


def tr(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
       timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``traceread ARGS`` as a user runs it (a real process; colour and width as in a pipe)."""
    full = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "NO_COLOR")}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "traceread", *args], capture_output=True, text=True, env=full,
                          cwd=cwd, timeout=timeout)


def one_error_line(res: subprocess.CompletedProcess[str]) -> str:
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("traceread: error: "), res.stderr
    assert "Traceback" not in res.stderr
    return lines[0]


# ---------------------------------------------------------------------------------------- outputs


@pytest.mark.slow
def test_dash_is_stdout_for_every_command(tmp_path: Path) -> None:
    res = tr("report", str(DDP), "--format", "json", "-o", "-", cwd=tmp_path)
    assert res.returncode == 0 and json.loads(res.stdout)["schema"] == "traceread.report/1"
    res = tr("report", str(DDP), "-o", "-", "--format", "text", cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.startswith("traceread report — 8 rank(s)")
    res = tr("export", str(DDP), "-o", "-", "--ranks", "0", "--steps", "11", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["traceEvents"] and "wrote stdout" in res.stderr
    res = tr("diff", str(DDP), str(DDP), "-o", "-", "--format", "json", cwd=tmp_path)
    assert res.returncode == 0 and json.loads(res.stdout)["schema"] == "traceread.diff/1"
    res = tr("hang", str(HANG), "-o", "-", "--format", "json", cwd=tmp_path)
    assert res.returncode == 0 and json.loads(res.stdout)["missing_ranks"] == [1]
    assert not (tmp_path / "-").exists()  # no file named "-" anywhere


@pytest.mark.slow
def test_format_follows_the_extension_or_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    res = tr("report", str(DDP), "-o", str(out), "-q")
    assert res.returncode == 0 and json.loads(out.read_text())["schema"] == "traceread.report/1"
    d = tmp_path / "d.json"
    assert tr("diff", str(DDP), str(DDP), "-o", str(d)).returncode == 0 and json.loads(d.read_text())["verdict"] == "same"
    for args, words in (
        (("report", str(DDP), "-o", str(tmp_path / "x.csv")), "cannot write .csv"),
        (("report", str(DDP), "-o", str(tmp_path / "x.json"), "--format", "html"), "does not match the .json"),
        (("export", str(DDP), "-o", str(tmp_path / "x.csv")), "traceread export cannot write .csv"),
        (("diff", str(DDP), str(DDP), "-o", str(tmp_path / "x.html")), "traceread diff cannot write .html"),
        (("hang", str(HANG), "-o", str(tmp_path / "x.parquet")), "cannot write .parquet"),
        (("report", str(DDP), "--format", "csv", "-o", "-"), "writes a folder"),
    ):
        res = tr(*args)
        assert res.returncode == 2, (args, res.stderr)
        assert words in one_error_line(res), res.stderr
    assert not (tmp_path / "x.csv").exists()  # refused before anything was written


@pytest.mark.slow
def test_bad_paths_and_unwritable_outputs_are_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    cases = [
        ("report", str(tmp_path / "missing")),
        ("report", str(DDP), "-o", "/missing/dir/r.html"),
        ("report", str(DDP), "-o", str(tmp_path / "afile" / "r.html")),
        ("report", str(DDP), "--format", "html", "-o", str(tmp_path / "adir")),
        ("export", str(DDP), "-o", "/missing/dir/t.json.gz"),
        ("export", str(tmp_path / "missing"), "-o", str(tmp_path / "t.json")),
        ("diff", str(DDP), str(tmp_path / "missing")),
        ("diff", str(DDP), str(DDP), "-o", "/missing/dir/d.txt"),
        ("hang", str(tmp_path / "missing")),
        ("report", str(DDP), "--format", "csv", "-o", str(tmp_path / "afile")),
    ]
    for args in cases:
        res = tr(*args)
        assert res.returncode == 2, (args, res.returncode, res.stderr)
        one_error_line(res)


@pytest.mark.slow
@pytest.mark.parametrize("args", [("report", str(DDP), "--no-html", "--top", "50"),
                                  ("report", str(DDP), "--format", "json", "-o", "-"),
                                  ("export", str(DDP), "-o", "-")])
def test_a_closed_pipe_ends_quietly_with_0(args: tuple[str, ...], tmp_path: Path) -> None:
    """``traceread report | head``: the reader leaving is not an error (exit 0, nothing on stderr)."""
    cmd = " ".join([sys.executable, "-m", "traceread", *args]) + " | head -c 10 > /dev/null"
    res = subprocess.run(["bash", "-c", "set -o pipefail; " + cmd + "; echo rc=${PIPESTATUS[0]}"], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path, env={**os.environ, "COLUMNS": "300"})
    assert "rc=0" in res.stdout, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and "Exception ignored" not in res.stderr and "Broken pipe" not in res.stderr


@pytest.mark.slow
def test_csv_is_a_folder_of_one_csv_per_table(tmp_path: Path) -> None:
    folder = tmp_path / "tables"
    res = tr("report", str(DDP), "--format", "csv", "-o", str(folder))
    assert res.returncode == 0, res.stderr
    names = sorted(p.name for p in folder.iterdir())
    assert {"findings.csv", "ranks.csv", "steps.csv", "ledger.csv", "kernels.csv", "collectives.csv"} <= set(names)
    doc = json.loads(tr("report", str(DDP), "--format", "json", "-o", "-").stdout)
    with open(folder / "ranks.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["rank"]) for r in rows] == [r["rank"] for r in doc["ranks"]]
    steps = doc["ranks"][5]["steps"]
    assert float(rows[5]["step_us"]) == pytest.approx(sum(s["duration_us"] for s in steps) / len(steps))
    with open(folder / "ledger.csv", newline="") as fh:
        ledger = list(csv.DictReader(fh))
    assert sum(float(r["us"]) for r in ledger) == pytest.approx(doc["ledger"]["step_us"], rel=1e-9)
    with open(folder / "findings.csv", newline="") as fh:
        found = list(csv.DictReader(fh))
    assert [f["id"] for f in found] == [f["id"] for f in doc["findings"]]
    assert json.loads(found[0]["evidence"]) == doc["findings"][0]["evidence"]  # nested: JSON text


# ---------------------------------------------------------------------------------------- verbosity, colour, --open


@pytest.mark.slow
def test_quiet_verbose_and_colour(tmp_path: Path) -> None:
    res = tr("report", str(DDP), "--no-html", "-q")
    assert res.returncode == 0 and res.stderr == ""
    assert re.match(r"ANSWER: .*\nCHANGE: ", res.stdout, re.S) and "Findings" not in res.stdout
    res = tr("report", str(DDP), "--no-html", "-v")
    assert re.search(r"analysed 8 rank\(s\) of 8 trace file\(s\) in [0-9.]+ s \(cache: ", res.stderr)
    assert "\x1b[" not in tr("report", str(DDP), "--no-html").stdout  # a pipe: no colour
    assert "\x1b[1;31mANSWER: \x1b[0m" in tr("report", str(DDP), "--no-html", "--color", "always").stdout
    assert "\x1b[" not in tr("report", str(DDP), "--no-html", "--color", "always", "--no-color").stdout
    assert "\x1b[" not in tr("report", str(DDP), "--no-html", env={"NO_COLOR": "1"}).stdout
    assert "\x1b[" in tr("diff", str(DDP), str(DDP), "--color", "always").stdout
    assert "\x1b[" not in tr("diff", str(DDP), str(DDP), "--no-color").stdout


def _wait_for_file(path: Path, guard_s: float = 120.0) -> None:
    """Until ``path`` exists (the rendezvous); ``guard_s`` only stops a broken run from hanging."""
    import time

    give_up = time.monotonic() + guard_s
    while not path.exists():
        assert time.monotonic() < give_up, f"{path} never appeared"
        time.sleep(0.05)


@pytest.mark.slow
def test_open_starts_the_default_browser_on_the_page(tmp_path: Path) -> None:
    """$BROWSER is what Python's webbrowser (and so --open) starts: a script records what it got."""
    seen = tmp_path / "seen.txt"
    browser = tmp_path / "browser.sh"
    # written whole, then renamed: the file exists only once it says everything (no half-written read)
    browser.write_text(f'#!/bin/sh\necho "$1" > {seen}.part && mv {seen}.part {seen}\n')
    browser.chmod(0o755)
    page = tmp_path / "r.html"
    res = tr("report", str(DDP), "-o", str(page), "--open", "-q", env={"BROWSER": f"{browser} %s"})
    assert res.returncode == 0, res.stderr
    _wait_for_file(seen)  # Python's webbrowser waits for a $BROWSER command, but a platform may not
    assert seen.read_text().strip() == page.resolve().as_uri()
    res = tr("report", str(DDP), "--format", "json", "-o", "-", "--open")
    assert res.returncode == 2 and "--open" in res.stderr


# ---------------------------------------------------------------------------------------- the terminal view


@pytest.mark.slow
@pytest.mark.parametrize("width", [80, 100, 140])
def test_laid_out_for_the_width_without_padding_or_truncation(width: int) -> None:
    res = tr("report", str(DDP), "--no-html", env={"COLUMNS": str(width)})
    assert res.returncode == 0
    lines = res.stdout.splitlines()
    assert max(len(ln) for ln in lines) <= width
    assert not any(ln != ln.rstrip() for ln in lines)  # no padding
    assert "…" not in res.stdout.split("Per rank")[1]  # numbers never cut to "42.…"
    doc = json.loads(tr("report", str(DDP), "--format", "json", "-o", "-").stdout)
    table = res.stdout.split("Per rank — mean per step")[1].split("Collectives")[0]
    for r in doc["ranks"]:  # every rank's mean step is there in full
        mean = sum(s["duration_us"] for s in r["steps"]) / len(r["steps"])
        assert ms(mean) in table
    rows = [ln for ln in table.splitlines() if re.match(r"\s+\d+\s+\d", ln)]
    if width >= 110:
        assert len(rows) == 8  # one line a rank
    else:
        assert len(rows) == 8 and "MFU" in table and "49.0%" in table  # folded: a second line under each


@pytest.mark.slow
def test_cpu_ranks_per_step_not_totals() -> None:
    """CPU-only ranks (gloo): each step's compute + comm + idle is exactly that step, and the table
    shows means per step beside the step time (rank 1 sleeps 150 ms every step in this sample)."""
    doc = json.loads(tr("report", str(CPU_STRAGGLER), "--format", "json", "-o", "-").stdout)
    for r in doc["ranks"]:
        for s in r["steps"]:
            assert s["cpu_compute_us"] + s["cpu_comm_us"] + s["cpu_idle_us"] == pytest.approx(s["duration_us"], abs=1e-6)
            assert 0 <= s["cpu_exposed_comm_us"] <= s["cpu_comm_us"] + 1e-9
    r1 = next(r for r in doc["ranks"] if r["rank"] == 1)
    assert all(s["cpu_idle_us"] > 150_000 for s in r1["steps"])
    text = tr("report", str(CPU_STRAGGLER), "--no-html").stdout
    assert "total" not in text.split("Per rank")[1].split("Collectives")[0]
    assert "mean per step (CPU" in text


def test_units_scale_and_names_keep_their_core() -> None:
    assert [ms(v) for v in (None, 0, 0.2, 740, 999.6, 12_345, 40_258_500)] == \
        ["n/a", "0 µs", "<1 µs", "740 µs", "1.0 ms", "12.3 ms", "40.26 s"]
    assert [nbytes(v) for v in (512, 2.5e6, 402.7e6, 3.1e9, 2e12)] == ["512 B", "2.5 MB", "402.7 MB", "3.1 GB", "2.0 TB"]
    long = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
            "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)")
    assert short_name(long) == "at::native::vectorized_elementwise_kernel<…>"
    assert short_name("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == \
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
    huge = "void cutlass::Kernel<" + ", ".join(f"cutlass::gemm::Shape<{i}, {i}>" for i in range(60)) + ">(Params)"
    assert len(huge) > 900 and short_name(huge) == "cutlass::Kernel<…>"
    title = f"Kernel {huge} loses 3 ms per step"
    assert elide_templates(title) == "Kernel void cutlass::Kernel<…>(Params) loses 3 ms per step"
    assert short_name("a < b and c > d") == "a < b and c > d"  # comparisons are not templates


def test_long_names_shortened_in_terminal_and_html_full_in_json(tmp_path: Path) -> None:
    from report_fixture import full_report

    from traceread.assemble.findings import assemble
    from traceread.render import html, json_report, terminal

    doc = full_report()
    name = "void flash::flash_fwd_kernel<" + ", ".join(f"Flash_fwd_traits<{i}, 128, 64>" for i in range(40)) + ">(Params)"
    doc["collectives"][0]["name"] = name
    doc["kernels"][0]["name"] = name
    doc["findings"] = assemble.build_findings(doc)
    doc["findings"][0]["title"] = f"{name} takes too long"
    text = terminal.render_text(doc, width=100)
    assert name not in text and "flash_fwd_kernel<…>" in text
    page = html.render_html(doc)
    assert "flash::flash_fwd_kernel&lt;…&gt;(Params) takes too long" in page  # the title, elided
    assert f'title="{name}'.replace("<", "&lt;").replace(">", "&gt;") in page  # the full name on hover
    assert name in json_report.to_json(doc)


@pytest.mark.slow
def test_hang_in_words_and_no_nccl_advice_for_gloo() -> None:
    text = tr("report", str(HANG), "--no-html", env={"COLUMNS": "200"}).stdout
    assert "HANG: Rank 1 never joined all_reduce #17 on pg 0 (world, default_pg); rank 0 waits in it" in text
    assert "[the job stopped there: every later step is lost]" in text and "100.0% of the step" not in text
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in text and "init_process_group" in \
        json.dumps(json.loads(tr("report", str(HANG), "--format", "json", "-o", "-").stdout)["findings"])
    hang = tr("hang", str(HANG)).stdout
    assert "in it rank 0; behind rank 1 (never enqueued it, at #16); waits on rank 1" in hang  # ranks read as ranks
    assert "rank 1: host_elsewhere" in hang


def test_nccl_jobs_keep_the_nccl_advice() -> None:
    from report_fixture import full_report

    from traceread.assemble.findings import assemble

    doc = full_report()  # backend nccl, with a hang
    hang = next(f for f in assemble.build_findings(doc) if f["id"] == "hang")
    assert any("TORCH_NCCL_ASYNC_ERROR_HANDLING" in s for s in hang["suggestions"])


def test_terminal_fits_80_columns_and_folds_wide_tables() -> None:
    """In-process: the fixture report at 80 columns — no line longer, no padding, the per-rank table
    folded onto two lines a rank (its ten columns need ~100), nothing cut with "…"."""
    import io

    from report_fixture import full_report

    from traceread.assemble.findings import assemble
    from traceread.render import terminal

    doc = full_report()
    doc["findings"] = assemble.build_findings(doc)
    for width in (80, 200):
        buf = io.StringIO()
        terminal.render_to(doc, buf, width=width, color="never")
        lines = buf.getvalue().splitlines()
        assert max(len(ln) for ln in lines) <= width and all(ln == ln.rstrip() for ln in lines)
        table = buf.getvalue().split("Per rank — mean per step")[1].split("Collectives")[0]
        assert "…" not in table
        assert table.count("MFU") == 1
        heads = [ln for ln in table.splitlines() if "rank" in ln and "step" in ln]
        assert heads and (("SM eff" not in heads[0]) if width == 80 else ("MFU" in heads[0]))
