"""SIGTERM (a batch system's time limit, ``kill``) on a command is handled as Ctrl-C: raised
where the command stands, so its cleanup runs, then one line and exit status 143; the handler
is the command's only while it runs."""

from __future__ import annotations

import os
import signal
import time

import pytest

import apportion.cli.main as cli
from apportion.cli.main import main


def test_sigterm_during_a_command_runs_its_cleanup_and_exits_143_with_one_line(
        monkeypatch, capsys):
    cleaned = []

    def terminated_while_planning(args, console):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises here at the latest
        finally:
            cleaned.append(True)
        return 0

    monkeypatch.setattr(cli, "cmd_plan", terminated_while_planning)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert main(["plan", "examples/mlp.json"]) == 143
    assert cleaned == [True]
    assert capsys.readouterr().err == "apportion: terminated (SIGTERM)\n"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # back as it was


def test_a_sigterm_handler_set_by_the_host_program_is_left_alone(monkeypatch):
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
    try:
        monkeypatch.setattr(cli, "cmd_plan", lambda args, console: os.kill(os.getpid(),
                                                                           signal.SIGTERM) or 0)
        assert main(["plan", "examples/mlp.json"]) == 0
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize("status", [0, 1])
def test_the_handler_is_removed_whatever_the_command_returns(monkeypatch, status):
    monkeypatch.setattr(cli, "cmd_plan", lambda args, console: status)
    assert main(["plan", "examples/mlp.json"]) == status
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
