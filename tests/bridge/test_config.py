"""Configuration: kakeya.toml or [tool.kakeya], then KAKEYA_* variables."""

from __future__ import annotations

import pytest

from bridge.config import load_config, project_root
from bridge.core.errors import InvalidRequest


def test_defaults_file_and_environment_layering(tmp_path):
    assert load_config(tmp_path, {}).remote == ""
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname="x"\n[tool.kakeya]\nremote = "origin"\nlabels = ["h200"]\n'
    )
    cfg = load_config(tmp_path, {})
    assert cfg.remote == "origin" and cfg.labels == ["h200"]
    cfg = load_config(
        tmp_path,
        {
            "KAKEYA_REMOTE": "git://h/x",
            "KAKEYA_LABELS": "cpu, mac-m4",
            "KAKEYA_POLL_INTERVAL": "0.5",
            "KAKEYA_SECRETS": "A,B",
        },
    )
    assert (cfg.remote, cfg.labels, cfg.poll_interval_s, cfg.secrets) == (
        "git://h/x",
        ["cpu", "mac-m4"],
        0.5,
        ["A", "B"],
    )
    (tmp_path / "kakeya.toml").write_text('remote = "file-wins"\nlog_cap_bytes = 4096\n')
    cfg = load_config(tmp_path, {})
    assert cfg.remote == "file-wins" and cfg.log_cap_bytes == 4096


@pytest.mark.parametrize(
    ("text", "env", "match"),
    [
        ("remote = [", {}, "kakeya.toml"),
        ("poll_interval = 1\n", {}, "poll_interval"),
        ("", {"KAKEYA_POLL_INTERVAL": "-1"}, "poll_interval_s"),
        ("", {"KAKEYA_LOG_CAP": "lots"}, "log_cap_bytes"),
    ],
)
def test_bad_config_names_the_problem(tmp_path, text, env, match):
    (tmp_path / "kakeya.toml").write_text(text)
    with pytest.raises(InvalidRequest, match=match):
        load_config(tmp_path, env)


def test_project_root_is_the_git_top_level(tmp_path):
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "a" / "b").mkdir(parents=True)
    assert project_root(tmp_path / "a" / "b") == tmp_path.resolve()
    outside = tmp_path.parent / f"{tmp_path.name}-plain"
    outside.mkdir()
    assert project_root(outside) == outside.resolve()
