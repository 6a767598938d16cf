import pytest

from apportion.errors import TargetError
from apportion.target import cpu, load_toml, presets, resolve, spyre
from apportion.target.presets import CPU_SPLIT_K, MAX_CPU_CORES


def test_spyre_defaults_to_32_cores_and_its_figures():
    t = spyre(environ={})
    assert t.cores == 32 and t.span_limit == 256 << 20 and t.stick_bytes == 128
    assert [t.elems_per_stick(d) for d in ("float16", "bfloat16", "float32", "int32", "int8")] \
        == [64, 64, 32, 32, 128]
    assert t.scratchpad_capacity == int(2 * (1 << 20) * 0.8)


def test_sencores_sets_the_default_core_count():
    assert spyre(environ={"SENCORES": "8"}).cores == 8


def test_explicit_cores_win_over_sencores():
    assert spyre(4, environ={"SENCORES": "8"}).cores == 4


@pytest.mark.parametrize("value", ["0", "33", "-1"])
def test_sencores_outside_1_to_32_is_an_error(value):
    with pytest.raises(TargetError, match="1..32"):
        spyre(environ={"SENCORES": value})


def test_sencores_not_a_number_is_an_error():
    with pytest.raises(TargetError, match="not an integer"):
        spyre(environ={"SENCORES": "many"})


@pytest.mark.parametrize("value", ["\u0668", "\u2078", "1_6"])
def test_sencores_in_other_digits_than_ascii_is_an_error(value):
    # int() reads '٨' as 8 and '1_6' as 16, and fails on '⁸'
    with pytest.raises(TargetError, match=f"SENCORES={value!r} is not an integer core count "
                                          "in digits 0-9"):
        spyre(environ={"SENCORES": value})


@pytest.mark.parametrize("cores", [MAX_CPU_CORES + 1, 10 ** 20, 0, -1])
def test_cpu_cores_beyond_the_limit_are_refused_before_the_host_table(cores, monkeypatch):
    def measured() -> None:
        raise AssertionError("the host's split-K table was read before the cores were checked")

    monkeypatch.setattr(presets, "host_table", measured)
    monkeypatch.setattr(presets.os, "cpu_count", lambda: 2)
    with pytest.raises(TargetError, match=rf"target 'cpu': cores must be in 1\.\.{MAX_CPU_CORES} "
                                          rf"\(this machine's 2, .*got {cores}"):
        cpu(cores)


def test_cpu_plans_a_larger_cpu_up_to_the_limit():
    assert cpu(MAX_CPU_CORES, split_k_table=CPU_SPLIT_K).cores == MAX_CPU_CORES


def test_cpu_span_limit_never_binds():
    assert cpu().span_limit > 1 << 60 and cpu().stick_bytes == 64


def test_toml_target_overrides_a_preset(tmp_path):
    f = tmp_path / "small.toml"
    f.write_text('preset = "spyre"\nname = "small"\nmax_cores = 8\nspan_limit_mib = 1\n')
    t = load_toml(f)
    assert (t.name, t.cores, t.span_limit) == ("small", 8, 1 << 20)


def test_toml_unknown_field_is_named(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text('preset = "spyre"\nwarp_drive = 3\n')
    with pytest.raises(TargetError, match="warp_drive"):
        load_toml(f)


def test_toml_without_preset_needs_every_field(tmp_path):
    f = tmp_path / "bare.toml"
    f.write_text("cores = 2\n")
    with pytest.raises(TargetError, match="missing fields"):
        load_toml(f)


def test_unknown_target_name_lists_presets():
    with pytest.raises(TargetError, match="spyre, cpu"):
        resolve("tpu")
