"""Traces where they live: a report on ``s3://`` objects, served by a local S3-compatible server
(moto in server mode on 127.0.0.1, started by the test; never the internet)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import needs
import pytest
from engine_docs import differences
from ports import free_port as _free_port

from traceread.assemble.report import ReportOptions, build_report

needs.module("s3fs")
moto_server = needs.module("moto.server")

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "ddp_straggler_h100"
BUCKET = "traces"


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> dict:
    import boto3

    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    creds = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}
    client = boto3.client("s3", endpoint_url=endpoint, **creds)
    client.create_bucket(Bucket=BUCKET)
    for f in sorted(SAMPLE.glob("rank*.pt.trace.json.gz")):
        client.upload_file(str(f), BUCKET, f"run1/{f.name}")
    yield {"endpoint": endpoint, "client": client,
           "options": {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}}
    server.stop()


def _normalised(doc: dict) -> dict:
    """The same document with file locations reduced to file names (local paths vs URLs)."""
    doc = json.loads(json.dumps(doc, default=str))
    doc["source"]["paths"] = []
    doc["source"].pop("cycle", None)  # profiling cycles are grouped for local files only (so far)
    for r in doc["ranks"]:
        r["file"] = Path(r["file"]).name
    doc["warnings"] = [w for w in doc["warnings"] if "rank" not in w or "missing" not in w]
    return doc


def test_report_on_s3_equals_local_and_keys_on_the_object(s3: dict, tmp_path: Path) -> None:
    local = build_report([SAMPLE], ReportOptions(use_cache=False, workers=1))
    cache = tmp_path / "cache"
    opts = ReportOptions(cache_dir=cache, workers=2, storage_options=s3["options"])
    remote = build_report([f"s3://{BUCKET}/run1/"], opts)
    assert [r["file"] for r in remote["ranks"]][0].startswith(f"s3://{BUCKET}/run1/rank")
    assert differences(_normalised(local), _normalised(remote)) == []

    # Same objects: served from the caches without downloading anything.
    from traceread.engine import tasks

    real = tasks._parse
    tasks._parse = lambda f, o: (_ for _ in ()).throw(AssertionError(f"{f} downloaded again"))  # type: ignore[assignment]
    try:
        shutil.rmtree(cache / "documents")
        again = build_report([f"s3://{BUCKET}/run1/rank*.pt.trace.json.gz"], opts)
    finally:
        tasks._parse = real  # type: ignore[assignment]
    assert differences(_normalised(remote), _normalised(again)) == []

    # A re-uploaded object (new ETag) is a miss: its rank is read again.
    first = sorted(SAMPLE.glob("rank*.pt.trace.json.gz"))[0]
    s3["client"].put_object(Bucket=BUCKET, Key=f"run1/{first.name}", Body=b"not a trace any more")
    changed = build_report([f"s3://{BUCKET}/run1/"], opts)
    assert any(first.name in w and "missing" in w for w in changed["warnings"])
    s3["client"].upload_file(str(first), BUCKET, f"run1/{first.name}")


def test_cli_on_s3_with_endpoint_from_the_environment(s3: dict, tmp_path: Path) -> None:
    """``AWS_ENDPOINT_URL`` (honoured by botocore >= 1.31) is enough; no --storage-options needed."""
    import os

    env = dict(os.environ, AWS_ENDPOINT_URL=s3["endpoint"], AWS_ACCESS_KEY_ID="testing",
               AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
               TRACEREAD_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", "traceread.cli", "report", f"s3://{BUCKET}/run1/", "--format", "json"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert len(doc["ranks"]) == len(list(SAMPLE.glob("rank*.pt.trace.json.gz")))
    bad = subprocess.run([sys.executable, "-m", "traceread.cli", "report", f"s3://{BUCKET}/nothing-here/",
                          "--format", "json"], env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
