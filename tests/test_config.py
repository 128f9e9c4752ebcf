import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from heptstudy.config import ConfigError, HEPTv2Config, as_yaml, load_config, load_platform


def test_defaults_are_the_recommended_model():
    cfg = load_config()
    h = cfg.model.heptv2
    assert cfg.model.variant == "hit_heptv2_grouped_tracker_features"
    assert (h.embedding_dim, h.width, h.num_heads, h.block_size, h.n_hashes, h.num_regions) == (
        128,
        512,
        8,
        100,
        3,
        140,
    )
    assert (h.num_convs, h.mlp_ratio, h.dropout, cfg.model.decoder.num_layers) == (6, 4.0, 0.1, 4)
    assert h.activation_checkpointing == "off"


def test_overrides_apply_and_parse_types():
    cfg = load_config(overrides=["model.heptv2.activation_checkpointing=true", "train.lr=0.002"])
    assert cfg.model.heptv2.activation_checkpointing == "full"
    assert cfg.train.lr == 0.002


def test_yaml_file_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"model": {"heptv2": {"num_convs": 2}}, "train": {"seed": 7}}))
    cfg = load_config(path, ["train.seed=9"])
    assert cfg.model.heptv2.num_convs == 2 and cfg.train.seed == 9


def test_misspelled_key_names_key_and_suggests():
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["model.heptv2.num_hedas=4"])
    msg = str(err.value)
    assert (
        "model.heptv2.num_hedas" in msg and "unknown key" in msg and "model.heptv2.num_heads" in msg
    )


def test_an_unknown_key_is_never_told_its_own_section():
    """`model.foo` was asked "did you mean 'model'?", the section it is already in."""
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["model.fo=1"])
    assert "unknown key model.fo=1" in str(err.value)
    assert "did you mean 'model'?" not in str(err.value)
    with pytest.raises(ConfigError, match=r"unknown key data\.zzzzz=1; data has .*data_dir"):
        load_config(overrides=["data.zzzzz=1"])


def test_an_empty_configuration_path_is_said_to_be_empty():
    """Path('') is '.': it was called a folder."""
    with pytest.raises(ConfigError, match="configuration file '' is an empty path"):
        load_config("")


def test_wrong_type_names_key_and_value():
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["model.heptv2.num_heads=eight"])
    msg = str(err.value)
    assert "model.heptv2.num_heads" in msg and "'eight'" in msg and "integer" in msg


def test_block_size_zero_is_refused_with_the_allowed_range():
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["model.heptv2.block_size=0"])
    msg = str(err.value)
    assert "model.heptv2.block_size" in msg and "greater than or equal to 1" in msg and "0" in msg


def test_neighbourhood_radius_above_one_is_refused():
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["model.tracker_features.radii=[0.02,1.5]"])
    msg = str(err.value)
    assert "model.tracker_features.radii.1" in msg and "less than or equal to 1" in msg
    assert "1.5" in msg


def test_heads_must_divide_embedding():
    with pytest.raises(ConfigError, match="divisible"):
        load_config(overrides=["model.heptv2.num_heads=7"])


def test_dataset_must_suit_variant():
    with pytest.raises(ConfigError, match="_pf"):
        load_config(overrides=["model.variant=track_cluster_mlpf"])
    cfg = load_config(
        overrides=["model.variant=track_cluster_mlpf", "data.dataset=cld_edm_ttbar_pf:3.2.1"]
    )
    assert cfg.data.name == "cld_edm_ttbar_pf"


def test_missing_file_and_malformed_override():
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("no/such/file.yaml")
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_config(overrides=["model.heptv2.num_heads"])


def test_cli_config_show_prints_resolved_config_and_clean_errors():
    run = [sys.executable, "-m", "heptstudy.cli", "config", "show"]
    ok = subprocess.run(
        run + ["--set", "model.heptv2.activation_checkpointing=true"],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr
    shown = yaml.safe_load(ok.stdout)
    assert shown["model"]["heptv2"]["activation_checkpointing"] == "full"
    bad = subprocess.run(
        run + ["--set", "model.heptv2.block_size=0"], capture_output=True, text=True
    )
    assert bad.returncode == 2
    assert "model.heptv2.block_size" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize(
    "yaml_text,key,fragment",
    [
        ("model: {heptv2: {block_size: true}}", "model.heptv2.block_size=true", "whole number"),
        ("model: {heptv2: {block_size: yes}}", "model.heptv2.block_size=true", "whole number"),
        ("train: {lr: true}", "train.lr=true", "a number, not true/false"),
        ("model: {tracker_features: {radii: [0.02, true]}}", "radii=[0.02, true]", "a number"),
        (
            "model: {heptv2: {activation_checkpointing: 1}}",
            "checkpointing=1",
            "a number is not a checkpointing plan",
        ),
        ("model: {tracker_features: {enabled: 0}}", "enabled=0", "true or false"),
    ],
)
def test_booleans_and_numbers_are_not_interchangeable(tmp_path, yaml_text, key, fragment):
    path = tmp_path / "c.yaml"
    path.write_text(yaml_text + "\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert key in str(err.value) and fragment in str(err.value), str(err.value)


def test_whole_numbers_still_serve_as_floats():
    cfg = load_config(overrides=["train.lr=1", "model.heptv2.dropout=0"])
    assert cfg.train.lr == 1.0 and cfg.model.heptv2.dropout == 0.0


def test_relative_data_dir_is_the_repositorys_out_dir_the_working_directorys(tmp_path, monkeypatch):
    from heptstudy.paths import REPO_ROOT

    monkeypatch.chdir(tmp_path)
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("train: {out_dir: experiments/mine}\n")
    cfg = load_config(yaml_file)
    assert REPO_ROOT is not None and (REPO_ROOT / "pyproject.toml").is_file()
    assert cfg.data.data_dir == str(REPO_ROOT / "data" / "tfds")
    # where results go follows the working directory, as --output does (heptstudy.paths)
    assert cfg.train.out_dir == str(tmp_path / "experiments" / "mine")
    absolute = load_config(overrides=[f"data.data_dir={tmp_path}"])
    assert absolute.data.data_dir == str(tmp_path)
    assert load_config(overrides=["data.data_dir=~/d"]).data.data_dir == str(Path.home() / "d")


@pytest.mark.parametrize(
    "override,message",
    [
        (
            "model.heptv2.auto_plan_order=[layers99]",
            "model.heptv2.auto_plan_order: layers99 checkpoints 99 of the backbone's 3 layers "
            "(model.heptv2.num_convs); a count plan takes 1 to 2 layers (all of them is full): "
            "use one of those or full",
        ),
        ("model.heptv2.auto_plan_order=[layers0,full]", "layers0 checkpoints 0 of the backbone's"),
        ("model.heptv2.activation_checkpointing=last3", "last3 checkpoints 3 of the backbone's 3"),
        ("model.heptv2.auto_plan_order=[off]", "leave off out"),
        ("model.heptv2.auto_plan_order=[every4]", "takes each of selective, every2, every3, full"),
    ],
)
def test_count_plans_must_fit_the_backbone(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["model.heptv2.num_convs=3", override])
    assert message in str(err.value)


@pytest.mark.parametrize("value", ["inf", ".inf", "-inf", "nan"])
def test_numbers_that_are_not_finite_are_refused(value):
    """A budget of infinity (or NaN) is no budget; JSON, where every report records its
    configuration, cannot hold it either."""
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[f"model.heptv2.memory_budget_gib={value}"])
    assert re.search(
        r"model\.heptv2\.memory_budget_gib=\S+ is not allowed: Input should be a finite number",
        str(err.value),
    )
    with pytest.raises(
        ConfigError, match=r"train\.lr=\S+ is not allowed: Input should be a finite number"
    ):
        load_config(overrides=[f"train.lr={value}"])


def test_an_empty_value_is_refused_as_null_and_says_so():
    """`--set model.heptv2.op_costs=` reads as null: the error says why a path became null."""
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["model.heptv2.op_costs="])
    assert "model.heptv2.op_costs=null is not allowed: Input should be a valid string" in str(
        err.value
    )
    assert "give model.heptv2.op_costs a value (an empty one reads as null)" in str(err.value)


@pytest.mark.parametrize("command", [["config", "show"], ["bench"]])
@pytest.mark.parametrize(
    "value,problem",
    [
        ("!!python/object:os.system", "could not determine a constructor for the tag"),
        ("*a", "found undefined alias"),
        ("&a [*a]", "YAML recursive aliases are not supported"),
        ("!!float abc", "a date or !!tagged value that cannot be built"),
        ("[" * 1001 + "]" * 1001, "exceeded maximum nesting depth"),
    ],
)
def test_set_values_yaml_cannot_read_are_named_not_a_traceback(capsys, command, value, problem):
    from heptstudy.cli import main

    item = f"model.heptv2.width={value}"
    assert main([*command, "--set", item]) == 2
    said = capsys.readouterr().err
    shown = value if len(value) <= 60 else f"{value[:57]}..."
    assert (
        f"override model.heptv2.width: its value {shown!r} is not YAML that can be read "
        f"({problem}" in said
    ), said
    assert "a value is a number, true/false, null, a word or a [list]" in said
    quoted = json.dumps(value) if len(value) <= 60 else '"TEXT"'
    assert f"to give it as text, quote it: --set 'model.heptv2.width={quoted}'" in said


def test_config_that_is_no_regular_file_is_refused_as_such(tmp_path, capsys):
    from heptstudy.cli import main

    assert main(["config", "show", "--config", os.devnull]) == 2
    said = capsys.readouterr().err
    assert f"configuration file '{os.devnull}' is not a regular file (a device, a pipe" in said
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)  # read, it would wait for a writer for ever
    with pytest.raises(ConfigError) as err:
        load_config(pipe)
    assert f"configuration file {str(pipe)!r} is not a regular file" in str(err.value)


@pytest.mark.parametrize(
    "text,problem",
    [
        ("- a\n- b\n", "must hold a mapping of KEY: VALUE lines, found list; write its settings"),
        ("train: {seed: 2001-13-01}\n", "(a date or !!tagged value that cannot be built)"),
        ("train: {seed: !!bool maybe}\n", "(a date or !!tagged value that cannot be built)"),
        # deeper than any recursion limit a process sets (tests/test_import_order.py: 10,000)
        ("train: " + "[" * 100_000 + "]" * 100_000, "(lists or mappings nested too deep)"),
    ],
)
def test_config_file_yaml_cannot_read_or_use_is_named(tmp_path, text, problem):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert f"configuration file {str(path)!r}" in str(err.value) and problem in str(err.value)


def test_an_empty_config_file_is_still_the_defaults(tmp_path):
    (tmp_path / "empty.yaml").write_text("")
    assert load_config(tmp_path / "empty.yaml") == load_config()


@pytest.mark.parametrize(
    "value,shown,why",
    [
        ("1e30", "1.0e+30", " (with a decimal point or an exponent a number is exact only up to"),
        ("1.5", "1.5", ";"),
        (".inf", ".inf", ";"),
        (".nan", ".nan", ";"),
    ],
)
def test_whole_number_keys_refuse_fractions_infinities_and_rounded_floats(value, shown, why):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[f"model.heptv2.width={value}"])
    default = HEPTv2Config().width
    assert (
        f"model.heptv2.width={shown} is not allowed: takes a whole number, not {shown}{why}"
        in str(err.value)
    )
    assert f"give a whole number, for example the default {default}" in str(err.value)


def test_bench_refuses_a_rounded_float_width():
    from heptstudy.cli import build_parser
    from heptstudy.cli.bench import request_from_args

    args = build_parser().parse_args(["bench", "--set", "model.heptv2.width=1e30"])
    with pytest.raises(ConfigError, match=r"width=1\.0e\+30 is not allowed: takes a whole number"):
        request_from_args(args).resolve()


def test_whole_floats_and_large_widths_are_still_read():
    # no bound on width here: whether a model fits is the model-size check's to say
    exact = 2**53
    for value, expected in [("512.0", 512), ("1e15", 10**15), (str(exact), exact)]:
        assert load_config(overrides=[f"model.heptv2.width={value}"]).model.heptv2.width == expected


@pytest.mark.parametrize("value", [1.5, True, 1e30])
def test_a_profile_key_without_default_refuses_a_wrong_number_cleanly(tmp_path, value):
    from heptstudy.paths import REPO_ROOT

    assert REPO_ROOT is not None
    profile = yaml.safe_load((REPO_ROOT / "configs/training/platforms/local_cpu.yaml").read_text())
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({**profile, "devices_per_node": value}))
    with pytest.raises(ConfigError) as err:
        load_platform(path)
    assert f"devices_per_node={as_yaml(value)} is not allowed: takes a whole number" in str(
        err.value
    )
    assert str(err.value).splitlines()[1].endswith("give a whole number")
