"""Values parsed once at the edge (engine/workloads/cli.py): a workload's Config holds typed values (a
`Policy`, a `DrafterSpec`) that reports write as strings and that parse back to the same values; a value
out of the bounds its `Field` declares is a usage error (exit 2, one line naming the flag), before any
model loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.drafters import DrafterSpec
from engine.policy import Policy, hybrid, parse_policy, sink_window
from engine.workloads import compression, niah, parity, restoration, throughput


def _throughput_config(**change: object) -> throughput.Config:
    values: dict[str, object] = dict(
        model="zoo:tiny-hybrid",
        backend="torch",
        dtype="float32",
        policy="hybrid:4:64:q8",
        drafter="diffusion:zoo:tiny-dlm:steps=2",
        drafter_policy=sink_window(4, 64),
        k=4,
        prompts=1,
        prompt_source="auto",
        prompt_tokens=8,
        new_tokens=8,
        repeats=1,
        seed=0,
        min_speedup=1.0,
    )
    return throughput.Config(**{**values, **change})


def test_typed_values_serialise_to_the_strings_they_parse_from() -> None:
    config = _throughput_config()
    assert isinstance(config.policy, Policy) and config.policy.precision == "q8"
    assert config.drafter == DrafterSpec("diffusion", "zoo:tiny-dlm", (("steps", 2),))
    dumped = config.model_dump()
    assert dumped["policy"] == "hybrid:4:64:q8" and dumped["drafter_policy"] == "sink_window:4:64"
    assert dumped["drafter"] == "diffusion:zoo:tiny-dlm:steps=2" and dumped["denoise_steps"] == 2
    assert (
        throughput.Config.model_validate({k: v for k, v in dumped.items() if k != "denoise_steps"}) == config
    )
    assert parse_policy(dumped["policy"]) == config.policy
    assert _throughput_config(drafter="lookup").model_dump()["denoise_steps"] is None
    assert '"policy":"hybrid:4:64:q8"' in config.model_dump_json()


def test_a_bad_typed_value_is_a_validation_error() -> None:
    with pytest.raises(ValueError, match="bad cache policy"):
        _throughput_config(policy="hybrid:4")
    with pytest.raises(ValueError, match="start with a kind"):
        _throughput_config(drafter="bogus")


@pytest.mark.parametrize(
    ("module", "argv", "line"),
    [
        (throughput, ["--k", "0"], "--k: Input should be greater than or equal to 1"),
        (throughput, ["--batches", "8,0"], "--batches[1]: Input should be greater than or equal to 1"),
        (throughput, ["--new-tokens", "1"], "--new-tokens: Input should be greater than or equal to 2"),
        (niah, ["--depths", "0,1.5"], "--depths[1]: Input should be less than or equal to 1"),
        (niah, ["--contexts", "16"], "--contexts[0]: Input should be greater than or equal to 32"),
        (niah, ["--batch", "0"], "--batch: Input should be greater than or equal to 1"),
        (parity, ["--prompts", "0"], "--prompts: Input should be greater than or equal to 1"),
        (parity, ["--policy", "hybrid:2:0"], "window"),
        (compression, ["--seq-lens", "0"], "--seq-lens[0]: Input should be greater than or equal to 1"),
        (restoration, ["--alphas", "0.5,1"], "--alphas[1]: Input should be less than 1"),
        (restoration, ["--contexts", "40"], "every context must be >= sink + window + 32"),
    ],
)
def test_bounds_live_in_the_config_and_fail_as_usage_errors(
    module: object, argv: list[str], line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.json"
    with pytest.raises(SystemExit) as done:
        module.main([*argv, "--out", str(out)])  # type: ignore[attr-defined]
    assert done.value.code == 2 and not out.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert line in err[-1] and "Traceback" not in "\n".join(err)


def test_niah_holds_the_policies_it_parsed() -> None:
    config = niah.Config(
        model="m", backend="torch", dtype="float32", policies=["hybrid:4:64", sink_window(2, 8)],
        contexts=[64], depths=[0.5], samples=1, seed=0,
    )  # fmt: skip
    assert config.policies == [hybrid(4, 64), sink_window(2, 8)]
    assert config.model_dump()["policies"] == ["hybrid:4:64", "sink_window:2:8"]
