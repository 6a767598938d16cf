"""Bad target fields, TOML files, resolve() specs and preset core counts: a TargetError naming
the field (and the file, for TOML), never a Python traceback."""

from dataclasses import replace

import pytest

from apportion.errors import TargetError
from apportion.target import Target, cpu, load_toml, resolve, spyre
from apportion.target.target import COST_FIELDS

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("field, value", [
    ("name", ""), ("name", "  "), ("name", 3), ("name", None),
    *[(f, v) for f in ("cores", "max_cores", "span_limit", "stick_bytes", "scratchpad_bytes",
                       "alignment", "max_loop_count")
      for v in (0, -1, True, 2.0, "8", None)],
    *[(f, v) for f in ("scratchpad_reserve", *COST_FIELDS) if f != "pt_rows"
      for v in (NAN, INF, -INF, True, "1", None, 10**400)],
    ("scratchpad_reserve", 1.0), ("scratchpad_reserve", -0.1),
    ("mac_rate", 0.0), ("core_bandwidth", 0), ("mem_bandwidth", -1.0),
    ("ring_us_per_element", -0.5), ("overlap", 1.5), ("broadcast_cohort", 0.5),
    ("batch_split_factor", 0.9), ("pt_rows", 0), ("pt_rows", 2.0),
    ("split_padded_reduction", 1), ("split_padded_reduction", "no"),
    ("layout", "tiled"), ("layout", 1), ("layout", None), ("layout", ["stick"]),
])
def test_bad_field_is_named(field, value):
    with pytest.raises(TargetError, match=rf"^target .*: {field} must ") as e:
        replace(spyre(environ={}), **{field: value})
    assert "\n" not in str(e.value)


def test_nan_message_reads_as_documented():
    with pytest.raises(TargetError) as e:
        replace(spyre(environ={}), mac_rate=NAN)
    assert str(e.value) == \
        "target 'spyre': mac_rate must be a finite number > 0, got nan"


def test_cores_above_max_cores_names_the_range():
    with pytest.raises(TargetError, match=r"cores must be in 1\.\.32, got 33"):
        spyre(cores=33)


@pytest.mark.parametrize("field, value", [
    ("scratchpad_reserve", 0), ("ring_us_per_element", 0), ("mac_rate", 5 * 10**12),
    ("overlap", 1), ("overlap", 0.0),
])
def test_ints_and_bounds_are_accepted_for_figures(field, value):
    assert getattr(replace(spyre(environ={}), **{field: value}), field) == value


def test_max_loop_count_defaults_to_16_bit():
    assert spyre(environ={}).max_loop_count == 65535 and cpu().max_loop_count == 65535


@pytest.mark.parametrize("make", [spyre, cpu])
@pytest.mark.parametrize("cores", ["4", 4.0, True, [4], 0])
def test_preset_with_bad_cores_type_is_an_error(make, cores):
    with pytest.raises(TargetError, match="cores must be"):
        make(cores=cores)


# --- TOML --------------------------------------------------------------------------------------

def _load(tmp_path, text: str | bytes, name: str = "t.toml"):
    f = tmp_path / name
    if isinstance(text, bytes):
        f.write_bytes(text)
    else:
        f.write_text(text)
    return load_toml(f)


@pytest.mark.parametrize("body, field", [
    ('cores = "x"', "cores"),
    ("span_limit = [1]", "span_limit"),
    ("name = 3", "name"),
    ('name = ""', "name"),
    ("layout = 1", "layout"),
    ('layout = "tiled"', "layout"),
    ("max_cores = 1.5", "max_cores"),
    ("max_cores = true", "max_cores"),
    ("alignment = 0", "alignment"),
    ("max_loop_count = 0", "max_loop_count"),
    ('max_loop_count = "65535"', "max_loop_count"),
    ("scratchpad_reserve = nan", "scratchpad_reserve"),
    ("mac_rate = inf", "mac_rate"),
    ("mem_bandwidth = -inf", "mem_bandwidth"),
    ("ring_us_per_element = 1979-05-27", "ring_us_per_element"),
    ("core_bandwidth = { a = 1 }", "core_bandwidth"),
    ('span_limit_mib = "big"', "span_limit_mib"),
    ("span_limit_mib = nan", "span_limit_mib"),
    ("span_limit_mib = inf", "span_limit_mib"),
    ("span_limit_mib = true", "span_limit_mib"),
    ("span_limit_mib = [1]", "span_limit_mib"),
    ("span_limit_mib = 1e-7", "span_limit_mib"),
    ("span_limit_mib = 1e306", "span_limit_mib"),
    ("span_limit_mib = -1", "span_limit_mib"),
    ("span_limit_mib = 0", "span_limit_mib"),
    ("preset = 5", "preset"),
    ("preset = [1]", "preset"),
    ('preset = "tpu"', "preset"),
    ("cores_mib = 1", "cores_mib"),
    ("target = 3", "target"),
    ("target = [1, 2]", "target"),
    ("[[target]]\ncores = 1", "target"),
])
def test_bad_toml_field_names_the_file_and_field(tmp_path, body, field):
    text = body if "preset" in body or "target" in body else f'preset = "spyre"\n{body}\n'
    with pytest.raises(TargetError, match=rf"^target file '.*t\.toml'.*\b{field}\b") as e:
        _load(tmp_path, text)
    assert "\n" not in str(e.value)


def test_bad_field_in_a_target_table_names_the_file_and_field(tmp_path):
    with pytest.raises(TargetError, match=r"t\.toml.*cores must be an int, got 'x' \(str\)"):
        _load(tmp_path, '[target]\npreset = "spyre"\ncores = "x"\n')


def test_toml_that_is_not_utf8_is_an_error(tmp_path):
    with pytest.raises(TargetError, match=r"t\.toml.*not UTF-8"):
        _load(tmp_path, b'preset = "spyre"\nname = "caf\xe9"\n')


def test_toml_size_given_twice_names_both(tmp_path):
    with pytest.raises(TargetError, match=r"span_limit and span_limit_mib"):
        _load(tmp_path, 'preset = "spyre"\nspan_limit = 1048576\nspan_limit_mib = 1\n')


def test_toml_fractional_mib_that_is_whole_bytes_gives_int_bytes(tmp_path):
    t = _load(tmp_path, 'preset = "spyre"\nspan_limit_mib = 0.5\nscratchpad_bytes_mib = 4\n')
    assert t.span_limit == 1 << 19 and type(t.span_limit) is int
    assert t.scratchpad_bytes == 4 << 20 and type(t.scratchpad_bytes) is int


def test_toml_sets_max_loop_count(tmp_path):
    assert _load(tmp_path, 'preset = "spyre"\nmax_loop_count = 255\n').max_loop_count == 255


def test_toml_without_preset_may_leave_defaulted_fields_out(tmp_path):
    t = _load(tmp_path, "cores = 2\nmax_cores = 4\nspan_limit = 4096\nstick_bytes = 128\n"
                        "scratchpad_bytes = 65536\nscratchpad_reserve = 0.0\n"
                        "mac_rate = 1e3\nsfp_rate = 1e2\nreduce_rate = 1e2\n"
                        "core_bandwidth = 1e9\nmem_bandwidth = 2e9\n", name="bare.toml")
    assert (t.name, t.layout, t.alignment, t.max_loop_count) == ("bare", "stick", 128, 65535)


def test_missing_toml_file_is_named(tmp_path):
    with pytest.raises(TargetError, match=r"cannot read target file .*nope\.toml"):
        load_toml(tmp_path / "nope.toml")


def test_bad_cores_argument_to_load_toml_names_the_file(tmp_path):
    f = tmp_path / "t.toml"
    f.write_text('preset = "spyre"\n')
    with pytest.raises(TargetError, match=r"t\.toml.*cores must be"):
        load_toml(f, cores="2")


# --- resolve -----------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", [3, None, 2.5, ["spyre"]])
def test_resolve_non_str_spec_says_what_was_given(spec):
    with pytest.raises(TargetError, match=rf"got .*\({type(spec).__name__}\).*") as e:
        resolve(spec)
    assert "spyre, cpu" in str(e.value)


def test_resolve_a_target_object_is_an_error():
    with pytest.raises(TargetError, match=r"spyre, cpu.*\(Target\)"):
        resolve(spyre(environ={}))


@pytest.mark.parametrize("cores", ["8", 8.0, True, [8]])
@pytest.mark.parametrize("spec", ["spyre", "cpu", "x.toml"])
def test_resolve_non_int_cores_is_an_error(spec, cores):
    with pytest.raises(TargetError, match=r"cores must be an int"):
        resolve(spec, cores)


def test_resolve_still_takes_presets_and_files(tmp_path):
    f = tmp_path / "small.toml"
    f.write_text('preset = "spyre"\nmax_cores = 8\n')
    assert resolve("spyre", 4).cores == 4 and resolve(str(f), 2).cores == 2
    assert isinstance(resolve("cpu"), Target)


def test_a_toml_key_outside_the_target_table_is_an_error(tmp_path):
    from apportion.target.presets import load_toml

    path = tmp_path / "t.toml"
    path.write_text('preset = "spyre"\n[target]\nname = "x"\n')
    with pytest.raises(TargetError, match="field 'preset' is outside the \\[target\\] table"):
        load_toml(path)
