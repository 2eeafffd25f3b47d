"""The preset allowlist: typed, bounded parameters; argv templates that cannot be split or extended."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from bridge.cli.main import main
from bridge.core.errors import InvalidRequest, KakeyaError
from bridge.presets.params import parse_assignments, resolve_model
from bridge.presets.preset import Preset
from bridge.presets.registry import get_preset, load_preset_file, load_registry

PARAMS = {
    "n": {"type": "int", "min": 1, "max": 100, "default": 5},
    "x": {"type": "float", "min": 0.0, "max": 1.5, "default": 0.5},
    "flag": {"type": "bool", "default": False},
    "policy": {"type": "enum", "choices": ["hybrid", "sink_window"], "default": "hybrid"},
    "tag": {"type": "str", "pattern": "[a-z]+", "max_length": 8, "default": "abc"},
    "contexts": {"type": "int_list", "min": 64, "max": 4096, "max_items": 3, "default": [256]},
    "data": {"type": "path", "root": "data", "default": "a.txt"},
    "model": {"type": "model", "default": "zoo:tiny-hybrid"},
}


def make_preset(**over) -> Preset:
    data = {
        "name": "demo",
        "description": "a test preset",
        "runners": ["cpu"],
        "timeout_s": 10,
        "argv": ["{python}", "prog.py", *[f"{{{n}}}" for n in PARAMS], "{report}"],
        "params": PARAMS,
        "report": {"kind": "probe", "schema_version": 1},
        "gate": [{"check": "min", "path": "/probe/cpu_count", "value": 1}],
    }
    data.update(over)
    return Preset.model_validate(data)


CASES = [  # (param, lowest ok, highest ok, just below, just above)
    ("n", "1", "100", "0", "101"),
    ("x", "0", "1.5", "-0.0001", "1.5001"),
    ("contexts", "64", "4096", "63", "4097"),
]


@pytest.mark.parametrize(("name", "low", "high", "under", "over"), CASES)
def test_numeric_bounds(name, low, high, under, over):
    preset = make_preset()
    assert preset.validate_params({name: low})[name] in (1, 0.0, [64])
    assert preset.validate_params({name: high})[name] in (100, 1.5, [4096])
    for bad in (under, over):
        with pytest.raises(InvalidRequest, match=rf"preset demo: parameter {name}=.*between"):
            preset.validate_params({name: bad})


@pytest.mark.parametrize(
    ("name", "good", "bad", "rule"),
    [
        ("n", "7", "7.5", "integer"),
        ("n", 7, True, "not a boolean"),
        ("x", "0.25", "nan", "finite"),
        ("x", 1, "abc", "number"),
        ("flag", "true", "maybe", "true or false"),
        ("flag", False, "2", "true or false"),
        ("policy", "sink_window", "full", "one of hybrid, sink_window"),
        ("tag", "abcdefgh", "abcdefghi", "at most 8"),
        ("tag", "abc", "ab1", "pattern"),
        ("contexts", "64,128,256", "64,128,256,512", "at most 3"),
        ("contexts", [64, 128], "64,x", "integer"),
        ("contexts", "64", "", "at least one"),
        ("data", "sub/b.txt", "../etc/passwd", r"'\.\.'"),
        ("data", "sub/b.txt", "/etc/passwd", "absolute"),
        ("data", "c", "a/../../b", r"'\.\.'"),
        ("model", "gemma-3-1b", "../../secret", "model directory name"),
        ("model", "zoo:tiny-drafter", "/abs/model", "model directory name"),
        # matched whole: a trailing newline (which a `$` lets through) or any control character is refused
        ("model", "zoo:tiny-hybrid", "zoo:tiny-hybrid\n", r"control characters \(U\+000A at position 15\)"),
        ("model", "gemma-3-1b", "gemma-3-1b\n", "control characters"),
        ("model", "org/gemma", "org/gemma\r", "control characters"),
        ("tag", "abc", "abc\n", r"control characters \(U\+000A"),
        ("tag", "abc", "a\x1bc", r"control characters \(U\+001B"),
        ("data", "a.txt", "a.txt\n", "control characters"),
        ("data", "a.txt", "a\x00.txt", r"U\+0000"),
        ("data", "a.txt", "\u202etxt.exe", r"U\+202E"),  # a bidi override
        ("data", "a.txt", "a\u2028b", r"U\+2028"),  # a line separator
        ("policy", "hybrid", "hybrid\n", "one of"),
    ],
)
def test_types_accept_and_reject(name, good, bad, rule):
    preset = make_preset()
    preset.validate_params({name: good})
    with pytest.raises(InvalidRequest, match=rule) as err:
        preset.validate_params({name: bad})
    assert f"parameter {name}=" in str(err.value) and "preset demo" in str(err.value)


def test_control_characters_are_refused_whatever_the_pattern_allows():
    loose = make_preset(
        params={"s": {"type": "str", "pattern": "(?s).+", "max_length": 10, "default": "x"}},
        argv=["prog", "{s}"],
    )
    assert loose.validate_params({"s": "a b-c"})["s"] == "a b-c"
    for bad in ("a\nb", "ab\n", "a\x7fb", "a\x85b", "a\u200fb", "\ud800"):
        with pytest.raises(InvalidRequest, match=r"preset demo: parameter s=.* must not contain control"):
            loose.validate_params({"s": bad})


def test_absolute_path_under_absolute_root_is_accepted():
    preset = make_preset(
        params={"data": {"type": "path", "root": "/srv/data", "default": "x"}}, argv=["prog", "{data}"]
    )
    assert preset.validate_params({"data": "/srv/data/a/b"})["data"] == "a/b"
    with pytest.raises(InvalidRequest, match="absolute"):
        preset.validate_params({"data": "/srv/database"})
    assert preset.render_argv(preset.validate_params({}), {}, {}) == ["prog", "/srv/data/x"]


def test_unknown_missing_and_repeated_parameters():
    preset = make_preset()
    with pytest.raises(InvalidRequest, match="unknown parameter 'bogus'"):
        preset.validate_params({"bogus": "1"})
    required = make_preset(
        params={"n": {"type": "int", "min": 1, "max": 3, "required": True}}, argv=["prog", "{n}"]
    )
    with pytest.raises(InvalidRequest, match="parameter 'n' is required"):
        required.validate_params({})
    with pytest.raises(InvalidRequest, match="'n' is given twice"):
        parse_assignments(["n=1", "n=2"])
    with pytest.raises(InvalidRequest, match="name=value"):
        parse_assignments(["n"])
    assert parse_assignments(["a=b=c", "d="]) == {"a": "b=c", "d": ""}


def test_defaults_fill_and_render_one_element_each():
    preset = make_preset()
    values = preset.validate_params({"contexts": "256,1024", "flag": "yes"})
    argv = preset.render_argv(values, {"python": "/py", "report": "/r.json", "run_dir": "/d"}, {})
    assert argv == [
        "/py",
        "prog.py",
        "5",
        "0.5",
        "true",
        "hybrid",
        "abc",
        "256,1024",
        "data/a.txt",
        "zoo:tiny-hybrid",
        "/r.json",
    ]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"argv": ["prog", "--n={n}"]}, "a placeholder must be a whole element"),
        ({"argv": ["prog", "{nope}"]}, "'{nope}' names no parameter or builtin"),
        ({"argv": ["prog"]}, "are never used in argv"),
        ({"params": {"n": {"type": "int", "min": 1, "max": 3}}, "argv": ["p", "{n}"]}, "needs a default"),
        (
            {"params": {"n": {"type": "int", "min": 1, "max": 3, "default": 9}}, "argv": ["p", "{n}"]},
            r"default of parameter 'n' \(9\) must be between 1 and 3",
        ),
        (
            {"params": {"python": {"type": "int", "min": 1, "max": 3, "default": 1}}, "argv": ["{python}"]},
            "shadows the builtin",
        ),
        (
            {
                "params": {"n": {"type": "float", "min": 1, "max": 3, "default": 1, "choices": ["a"]}},
                "argv": ["p", "{n}"],
            },
            r"(?s)choices.*Extra inputs are not permitted",
        ),
        ({"name": "Bad Name"}, "must be lowercase letters, digits and dashes"),
        ({"gate": [{"check": "median", "path": "/x", "value": 1}]}, "Input should be 'min'"),
        ({"gate": [{"check": "min", "path": "x/y", "value": 1}]}, "is not a JSON pointer"),
        ({"gate": [{"check": "between", "path": "/x", "value": [3, 1]}]}, r"needs value \[low, high\]"),
        ({"env": {"BAD-NAME": "1"}}, "env name 'BAD-NAME' is not a valid variable name"),
    ],
)
def test_malformed_presets_are_rejected(bad, message):
    with pytest.raises(ValueError, match=message):
        make_preset(**bad)


def test_env_placeholders_resolve_from_runner_only():
    preset = make_preset(env={"HF_HUB_OFFLINE": "1", "MODELS": "${ENV:KAKEYA_MODELS}/x"})
    assert preset.render_env({"KAKEYA_MODELS": "/m"}) == {"HF_HUB_OFFLINE": "1", "MODELS": "/m/x"}
    with pytest.raises(KakeyaError, match=r"\$\{ENV:KAKEYA_MODELS\} but KAKEYA_MODELS is not set"):
        preset.render_env({})


def test_model_resolution_names_both_locations(tmp_path):
    (tmp_path / "models" / "gemma").mkdir(parents=True)
    env = {"KAKEYA_MODELS": str(tmp_path / "models"), "HOME": str(tmp_path / "home")}
    assert resolve_model("gemma", env) == str(tmp_path / "models" / "gemma")
    assert resolve_model("zoo:tiny-hybrid", env) == "zoo:tiny-hybrid"
    (tmp_path / "home" / "kakeya-models" / "qwen").mkdir(parents=True)
    assert resolve_model("qwen", env) == str(tmp_path / "home" / "kakeya-models" / "qwen")
    with pytest.raises(KakeyaError) as err:
        resolve_model("missing", env)
    assert str(tmp_path / "models" / "missing") in str(err.value)
    assert str(tmp_path / "home" / "kakeya-models" / "missing") in str(err.value)


def test_content_hash_ignores_formatting_but_not_content(tmp_path):
    data = make_preset().model_dump(mode="json")
    a, b = tmp_path / "a" / "demo.yaml", tmp_path / "b" / "demo.yaml"
    a.parent.mkdir()
    b.parent.mkdir()
    a.write_text(yaml.safe_dump(data))
    b.write_text(json.dumps(data, indent=7))  # JSON is YAML
    assert load_preset_file(a).content_hash == load_preset_file(b).content_hash
    data["timeout_s"] = 11
    b.write_text(yaml.safe_dump(data))
    assert load_preset_file(a).content_hash != load_preset_file(b).content_hash


def test_registry_errors_name_the_file(tmp_path):
    (tmp_path / "wrong.yaml").write_text(yaml.safe_dump(make_preset().model_dump(mode="json")))
    with pytest.raises(InvalidRequest, match="must match the file name"):
        load_registry(tmp_path)
    (tmp_path / "wrong.yaml").write_text("name: [unclosed")
    with pytest.raises(InvalidRequest, match="wrong.yaml: cannot read YAML"):
        load_registry(tmp_path)
    (tmp_path / "wrong.yaml").write_text("- a list")
    with pytest.raises(InvalidRequest, match="mapping"):
        load_registry(tmp_path)
    (tmp_path / "wrong.yaml").write_text("name: wrong\nrunners: []\n")
    with pytest.raises(InvalidRequest, match=r"wrong.yaml: .*runners"):
        load_registry(tmp_path)
    with pytest.raises(KakeyaError, match="does not exist"):
        load_registry(tmp_path / "nope")
    with pytest.raises(InvalidRequest, match="unknown preset 'x'"):
        get_preset({}, "x")


def test_shipped_presets_load_and_list(capsys):
    registry = load_registry()
    assert "probe" in registry
    assert main(["presets"]) == 0
    assert "probe" in capsys.readouterr().out
    assert main(["presets", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {p["name"] for p in listed} == set(registry)
    assert main(["presets", "show", "probe", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["hash"] == registry["probe"].content_hash
    assert main(["presets", "show", "probe"]) == 0
    assert "runners: cpu" in capsys.readouterr().out
    assert main(["presets", "show", "nope"]) == 2
    assert "unknown preset 'nope'" in capsys.readouterr().err
    assert main(["presets", "show"]) == 2


def test_presets_dir_override(tmp_path, monkeypatch, capsys):
    (tmp_path / "demo.yaml").write_text(yaml.safe_dump(make_preset().model_dump(mode="json")))
    monkeypatch.setenv("KAKEYA_PRESETS", str(tmp_path))
    assert main(["presets", "show", "demo"]) == 0
    out = capsys.readouterr().out
    assert "contexts" in out and "int_list" in out and "64..4096" in out
    assert Path(tmp_path / "demo.yaml").exists()
