"""What a target can do is a declared field, set by its preset and inherited by a TOML file that
starts from it under a name of its own; the split-K resolver is a typed object spelled by name."""

from __future__ import annotations

import dataclasses

import pytest

import apportion as ap
from apportion.cost.calibrate import Calibration, target_toml
from apportion.errors import CalibrationError, TargetError
from apportion.target.presets import CPU_SPLIT_K, PRESETS, cpu, gpu, spyre
from apportion.target.split_k import (
    BY_NAME,
    RESOLVERS,
    ByCost,
    ByTable,
    IreeGpu,
    NoSplit,
    parse_split_k,
)
from apportion.target.terms import CostTerm


def test_each_preset_declares_its_capabilities():
    assert (spyre().forall_mapping, spyre().host, spyre().split_k) == ("cores", False, ByCost())
    assert (gpu().forall_mapping, gpu().host, gpu().split_k) == ("gpu_blocks", False, IreeGpu())
    mine = cpu(cores=2, split_k_table=CPU_SPLIT_K)
    assert (mine.forall_mapping, mine.host, mine.split_k) == ("cores", True, ByTable())


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_toml_target_with_its_own_name_inherits_its_presets_capabilities(tmp_path, preset):
    path = tmp_path / "mine.toml"
    path.write_text(f'preset = "{preset}"\nname = "mine"\ncores = 2\n')
    mine, base = ap.targets.resolve(str(path)), PRESETS[preset](2)
    assert mine.name == "mine"
    assert (mine.forall_mapping, mine.host, mine.split_k) == \
        (base.forall_mapping, base.host, base.split_k)


def test_a_toml_target_may_declare_a_capability(tmp_path):
    path = tmp_path / "blocks.toml"
    path.write_text('preset = "spyre"\nforall_mapping = "gpu_blocks"\nsplit_k = "none"\n')
    target = ap.targets.resolve(str(path))
    assert target.forall_mapping == "gpu_blocks" and target.split_k == NoSplit()


@pytest.mark.parametrize(("line", "message"), [
    ('forall_mapping = "threads"', "forall_mapping must be one of cores, gpu_blocks, got "
                                   "'threads'"),
    ("host = 1", "host must be true or false, got 1"),
    ('split_k = "magic"', "split_k must be one of cost, gpu, table, none, got 'magic'"),
])
def test_a_bad_capability_is_refused_naming_file_and_field(tmp_path, line, message):
    path = tmp_path / "bad.toml"
    path.write_text(f'preset = "spyre"\n{line}\n')
    with pytest.raises(TargetError, match=rf"bad\.toml.*{message}"):
        ap.targets.resolve(str(path))


@pytest.mark.parametrize("name", RESOLVERS)
def test_a_resolver_is_spelled_and_printed_by_its_name(name):
    resolver = parse_split_k(name)
    assert resolver is BY_NAME[name] and str(resolver) == resolver.name == name
    assert parse_split_k(resolver) is resolver
    assert dataclasses.replace(spyre(), split_k=name, split_k_table=CPU_SPLIT_K).split_k == \
        resolver


def test_a_target_toml_of_every_field_writes_each_resolver_by_name():
    target = cpu(cores=2, split_k_table=CPU_SPLIT_K)
    cal = Calibration(target, target, (), (), 0.0, 0.0)
    text = target_toml(cal, None)
    assert 'split_k = "table"\n' in text and 'forall_mapping = "cores"\n' in text
    assert "host = true\n" in text and "cost_terms" not in text


def test_a_target_with_cost_terms_is_not_written_as_a_full_toml_file():
    @dataclasses.dataclass(frozen=True)
    class Hop(CostTerm):
        def us(self, op, program, target, sizes, splits, largest) -> float:
            return 1.0

    target = dataclasses.replace(spyre(), cost_terms=(Hop(),))
    cal = Calibration(target, target, (), (), 0.0, 0.0)
    with pytest.raises(CalibrationError, match="cost terms \\(Hop\\).*write it with a preset"):
        target_toml(cal, None)
    assert target_toml(cal, "spyre").startswith('preset = "spyre"')
