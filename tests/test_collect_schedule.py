"""The default profiling window and the message when a job is too short for it."""

from __future__ import annotations

from click.testing import CliRunner

from traceread.cli import cli
from traceread.collect.schedule import DEFAULT_ACTIVE, DEFAULT_WAIT, DEFAULT_WARMUP, steps_needed, too_short_note


def test_defaults_skip_start_up_and_record_ten_steps() -> None:
    assert (DEFAULT_WAIT, DEFAULT_WARMUP, DEFAULT_ACTIVE) == (5, 3, 10)
    assert steps_needed(DEFAULT_WAIT, DEFAULT_WARMUP, DEFAULT_ACTIVE) == 19
    help_text = CliRunner().invoke(cli, ["collect", "--help"]).output
    assert "[default: 5; x>=0]" in help_text and "[default: 10; x>=1]" in help_text
    assert "10-19 by default" in " ".join(help_text.split())


def test_too_short_note() -> None:
    note = too_short_note(6, 5, 3, 10)
    assert note is not None and "ran 6 optimizer step(s)" in note and "records from step 10 on" in note
    assert "19 steps for the whole --active 10 window" in note and "--active 4" in note
    assert too_short_note(19, 5, 3, 10) is None
    assert too_short_note(10, 5, 3, 10) is None  # step 10 was recorded: a partial window, kept
    assert too_short_note(None, 5, 3, 10) is None  # no rank reported steps (torch never imported)
