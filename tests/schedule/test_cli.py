"""``apportion schedule PROG``: the plan lowered to its schedule, printed; bad counts exit 2."""

from __future__ import annotations

from apportion.cli.main import main


def test_schedule_prints_the_text_form(capsys):
    assert main(["schedule", "examples/fused.json", "--target", "spyre", "--cores", "8"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "schedule fused on spyre, 8 cores"
    assert "  loop 2 over m:" in out and "    loop 4 over n:" in out
    assert sum(line.lstrip().startswith("core ") for line in out) == 16


def test_schedule_binds_symbolic_counts_and_refuses_bad_ones(capsys):
    args = ["schedule", "examples/softmax_symbolic.json", "--cores", "8"]
    assert main([*args, "--param", "T=8"]) == 0
    assert "loop 8 (T = 8) over m:" in capsys.readouterr().out
    assert main([*args, "--param", "T=3"]) == 2
    # refused before planning, naming the group and its bounds
    assert "--param T=3: loop count 'T' of tiling group" in (err := capsys.readouterr().err)
    assert "takes 8..64" in err
    assert main(args) == 2
    assert "pass --param T=N" in capsys.readouterr().err
