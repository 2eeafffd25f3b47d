"""The niah, throughput and compression workloads at tiny sizes: reports that pass their schemas, needles
outside the window, exactness computed from tokens, the seeds' compression table, the K/V cross-check.
The zoo-model tests (the niah gate passes for hybrid and fails for sink_window) are in test_workloads_zoo.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import engine  # noqa: E402
from engine.policy import oldest_visible  # noqa: E402
from engine.workloads import cli, compression, niah, throughput  # noqa: E402
from tests.engine import tiny_models  # noqa: E402
from tests.engine.backends import HAVE_MLX  # noqa: E402
from tests.engine.workload_support import (  # noqa: E402
    CROSS_CHECKED,
    SEEDS_TABLE,
    ZOO_TOKENS,
    save_zoo_model,
    tiny_throughput,
)
from tests.engine.workload_support import gate as _gate  # noqa: E402

torch.set_num_threads(1)


def _save_gemma(path: Path, layers: list[str], seed: int, window: int = 16) -> Path:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        **ZOO_TOKENS,
        **tiny_models.ATTENTION,
        num_hidden_layers=len(layers),
        sliding_window=window,
        layer_types=layers,
        tie_word_embeddings=False,
    )
    return save_zoo_model(path, Gemma3ForCausalLM, config, seed)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Gemma-3 over the zoo vocabulary: sliding (window 16) / full layers."""
    return _save_gemma(
        tmp_path_factory.mktemp("wl") / "gemma", ["sliding_attention", "full_attention"] * 2, 0
    )


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save_gemma(tmp_path_factory.mktemp("wl") / "drafter", ["full_attention"], 1)


# --- niah -------------------------------------------------------------------------------------------------


def test_place_puts_needles_in_the_evictable_span(model_dir: Path) -> None:
    model = engine.load(str(model_dir))
    sink, window = 4, 32
    for context in (80, 300, 1000):
        starts = []
        for depth in niah.DEPTHS:
            placed = niah.place(model, context, depth, 7, sink, window, 1.0)
            n = len(placed.ids)
            assert n == context and placed.evicted
            assert sink <= placed.needle_pos and placed.needle_end <= n - window
            assert placed.needle_end - placed.needle_pos == 7  # "kN : d d d d ."
            assert model.decode(placed.ids[placed.needle_pos + 2 : placed.needle_end - 1]) == placed.answer
            starts.append(placed.needle_pos)
        span = context - window - 7 - sink
        assert starts[0] - sink <= 25 and (context - window - 7) - starts[-1] <= 25, (context, starts)
        assert starts[2] - span // 2 - sink in range(-30, 31)
    short = niah.place(model, 40, 1.0, 0, sink, window, 1.0)  # no room outside the window: the whole prompt
    assert not short.evicted and short.needle_end > len(short.ids) - window


def test_niah_tiny_report(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "niah.json"
    assert (
        niah.main(
            [
                "--model",
                str(model_dir),
                "--policy",
                "hybrid:2:8,sink_window:2:8",
                "--contexts",
                "32,96",
                "--samples",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert "kv_bounded True" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert _gate(report).status == "pass", _gate(report).reasons()
    short, long = report["rungs"]
    assert not short["needles_evicted"] and long["needles_evicted"]
    assert report["summary"]["evicted_rungs"] == 1 and report["placement"] == {"sink": 2, "window": 8}
    for d in long["depths"]:
        assert all(p >= 2 and p + 7 <= 96 - 8 for p in d["needle_pos"]) and d["prompt_tokens"] == [96]
        assert set(d["recall"]) == {"full", "hybrid", "sink_window"}
    sw, hy = long["policies"]["sink_window"], long["policies"]["hybrid"]
    # sink_window holds sink + window - 1 + 1 slots in each of 4 layers x 2 K/V heads x 16 x 4 bytes x 2 (K, V)
    assert (
        sw["kv_bytes"] == sw["kv_bytes_bound"] == short["policies"]["sink_window"]["kv_bytes"] == 4 * 10 * 256
    )
    assert sw["kv_bytes"] < hy["kv_bytes"] < hy["kv_bytes_full"] == long["oracle"]["kv_bytes"]
    assert sw["kv_fraction"] == pytest.approx(sw["kv_bytes"] / sw["kv_bytes_full"])
    assert sw["farthest_position"] == 95 - 8 + 1 and sw["reach"] == 8
    assert hy["farthest_position"] == 0 and hy["reach"] == 96 and long["oracle"]["farthest_position"] == 0
    for r in report["rungs"]:
        for p in r["policies"].values():
            assert p["recall_delta"] == pytest.approx(r["oracle"]["recall"] - p["recall"])
    png = tmp_path / "niah-recall.png"
    assert report["plot"] == png.name and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    long["policies"]["hybrid"]["recall_delta"] = 0.25  # the preset's gate reads these fields
    verdict = _gate(report, "niah-smoke")
    assert verdict.status == "fail" and any("recall_delta" in r for r in verdict.reasons())
    del long["policies"]["hybrid"]["reach"]
    assert any("reach" in v.message for v in _gate(report).violations)


@pytest.mark.skipif(not HAVE_MLX, reason="mlx / mlx-lm not installed")
def test_niah_batched_report_equals_batch_one_and_a_missing_device_exits_2(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Haystacks decoded 3 at a time (rows of different lengths) give the report of one at a time."""
    common = ["--model", str(model_dir), "--policy", "hybrid:2:8,sink_window:2:8", "--contexts", "48,96"]
    common += ["--samples", "3", "--depths", "0.2,0.8", "--plot", "none", "--device", "cpu"]
    reports = []
    for batch in ("1", "3"):
        out = tmp_path / f"niah-b{batch}.json"
        assert niah.main([*common, "--batch", batch, "--out", str(out)]) == 0
        reports.append(json.loads(out.read_text()))
    one, three = reports
    assert three["config"]["batch"] == 3 and three["config"]["device"] == "cpu"
    assert one["rungs"] == three["rungs"]
    assert {k: v for k, v in one["summary"].items() if k != "wall_s"} == {
        k: v for k, v in three["summary"].items() if k != "wall_s"
    }
    env = three["environment"]
    assert env["device"].startswith("cpu") and env["dtype"] == "float32" and env["peak_memory_bytes"] is None
    assert _gate(three).status == "pass", _gate(three).reasons()
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        niah.main([*common, "--device", "cuda:3", "--out", str(tmp_path / "x.json")])
    assert exc.value.code == 2 and not (tmp_path / "x.json").exists()
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith("device 'cuda:3' is not available here; torch devices here: " + ", ".join(_devices()))


def _devices() -> list[str]:
    from engine.backends.torch.device import devices

    return devices()


def test_niah_mlx_backend_matches_torch(model_dir: Path, tmp_path: Path) -> None:
    reports = {}
    for backend in ("torch", "mlx"):
        out = tmp_path / f"{backend}.json"
        niah.main(
            [
                "--model",
                str(model_dir),
                "--backend",
                backend,
                "--policy",
                "hybrid:2:8",
                "--contexts",
                "64",
                "--depths",
                "0,1",
                "--samples",
                "1",
                "--plot",
                "none",
                "--out",
                str(out),
            ]
        )
        reports[backend] = json.loads(out.read_text())
        assert _gate(reports[backend]).status == "pass" and reports[backend]["plot"] is None
    t, m = (reports[b]["rungs"][0] for b in ("torch", "mlx"))
    assert t["depths"] == m["depths"] and t["policies"] == m["policies"]


def test_niah_refuses_bad_arguments(tmp_path: Path) -> None:
    for bad in (["--policy", "full"], ["--policy", "hybrid:4:64,hybrid:4:32"], ["--depths", "1.5"]):
        with pytest.raises(SystemExit) as exc:
            niah.main(["--out", str(tmp_path / "r.json"), *bad])
        assert exc.value.code == 2


# --- throughput ---------------------------------------------------------------------------------------------


def test_throughput_tiny_report(model_dir: Path, drafter_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "tp.json"
    args = tiny_throughput(model_dir, "--policy", "sink_window:2:8", "--batches", "1,3", "--out", str(out))
    assert throughput.main([*args, "--drafter", str(drafter_dir)]) == 0
    report = json.loads(out.read_text())
    assert _gate(report).status == "pass", _gate(report).reasons()
    c, s = report["config"], report["summary"]
    assert c["prompt_source"] == "zoo" and c["drafter_policy"] == "sink_window:2:8"
    for p in report["prompts"]:
        assert p["exact"] and p["first_mismatch"] is None and p["prompt_tokens"] == 24
        sp = p["speculative"]
        assert (
            p["greedy"]["tokens"] == sp["tokens"] == 20
            and sp["accepted"] <= sp["drafted"] <= 3 * sp["forwards"]
        )
        assert sp["acceptance_length"] == pytest.approx((sp["tokens"] - 1) / sp["forwards"])
        assert p["speedup"] == pytest.approx(sp["decode_tok_s"] / p["greedy"]["decode_tok_s"])
    assert s["all_exact"] and s["exact_prompts"] == 2
    assert s["speedup_ok"] == (s["speedup"] >= 1.0)
    assert (tmp_path / "tp-tok_s.png").read_bytes()[:4] == b"\x89PNG"
    one, three = report["batched"]
    assert (one["batch"], three["batch"]) == (1, 3) and one["exact"] and three["exact"]
    assert one["tokens"] == 20 and three["tokens"] == 60
    assert three["decode_tok_s"] == pytest.approx((60 - 3) / three["decode_s"])
    # rows 0 and 2 hold the same prompt; sink_window:2:8 holds sink + window slots per row at the end
    per_row = 4 * 10 * 256
    assert (
        three["kv_bytes_per_row"] == [per_row] * 3 and three["kv_bytes"] == 3 * per_row == 3 * one["kv_bytes"]
    )

    assert throughput.main([*args, "--drafter", "lookup", "--plot", "none"]) == 0
    lookup = json.loads(out.read_text())
    assert lookup["config"]["drafter"] == "lookup" and lookup["summary"]["all_exact"]
    assert [p["greedy"]["tokens"] for p in lookup["prompts"]] == [20, 20]


@pytest.mark.skipif(not HAVE_MLX, reason="mlx / mlx-lm not installed")
def test_throughput_mlx_backend(model_dir: Path, drafter_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "tp.json"
    args = ["--backend", "mlx", "--drafter", str(drafter_dir), "--policy", "hybrid:2:8", "--plot", "none"]
    throughput.main(tiny_throughput(model_dir, *args, "--out", str(out)))
    report = json.loads(out.read_text())
    assert _gate(report).status == "pass" and report["config"]["backend"] == "mlx"
    assert report["summary"]["all_exact"] and all(p["speculative"]["tokens"] == 20 for p in report["prompts"])


def test_throughput_exactness_is_computed_from_tokens(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = engine.speculative_generate

    def corrupt(*args: Any, **kwargs: Any) -> engine.Generation:
        gen = real(*args, **kwargs)
        if len(gen.tokens) > 5:  # (not the warm-up run) one wrong token, same length
            gen.tokens[5] = (gen.tokens[5] + 1) % 100
        return gen

    monkeypatch.setattr(engine, "speculative_generate", corrupt)
    out = tmp_path / "tp.json"
    throughput.main(
        [
            "--model",
            str(model_dir),
            "--drafter",
            "lookup",
            "--prompts",
            "2",
            "--prompt-tokens",
            "24",
            "--new-tokens",
            "12",
            "--repeats",
            "1",
            "--plot",
            "none",
            "--out",
            str(out),
        ]
    )
    report = json.loads(out.read_text())
    assert [(p["exact"], p["first_mismatch"]) for p in report["prompts"]] == [(False, 5), (False, 5)]
    assert not report["summary"]["all_exact"] and report["summary"]["exact_prompts"] == 0
    verdict = _gate(report, "throughput-code")
    assert verdict.status == "fail" and any("/exact" in r for r in verdict.reasons())
    assert cli.first_divergence([1, 2, 3], [1, 2]) == 2 and cli.first_divergence([4], [4]) is None


# --- compression --------------------------------------------------------------------------------------------

SEEDS = {  # the earlier system's table (shared/seeds/000): (B, S) -> (net bytes per token, compression ratio)
    (8, 8192): (18582, 6.17),
    (8, 32768): (4645.5, 24.69),
    (8, 131072): (1161.4, 98.75),
    (64, 131072): (166.6, 688.36),
    (64, 1048576): (20.8, 5506.92),
}


def test_compression_reproduces_the_seed_table(tmp_path: Path) -> None:
    """Qwen3-1.7B (28 layers, 8 K/V heads of 128, bfloat16) under sink 4 + window 24, a drafter that holds no
    K/V and weighs Qwen3-0.6B in bfloat16 (596,049,920 parameters): the seeds' numbers, from the config alone."""
    model = tmp_path / "qwen3-1.7b"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen3",
                "num_hidden_layers": 28,
                "hidden_size": 2048,
                "intermediate_size": 6144,
                "num_attention_heads": 16,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "vocab_size": 151936,
                "use_sliding_window": False,
                "sliding_window": None,
                "torch_dtype": "bfloat16",
            }
        )
    )
    out = tmp_path / "c.json"
    args = [
        "--model",
        str(model),
        *SEEDS_TABLE,
        "--batches",
        "8,64",
        "--seq-lens",
        "8192,32768,131072,1048576",
    ]
    compression.main([*args, "--check-lens", "none", "--out", str(out)])
    report = json.loads(out.read_text())
    assert _gate(report).status == "pass" and report["config"]["dtype"] == "bfloat16"
    rows = {(r["batch"], r["seq_len"]): r for r in report["table"]}
    for key, (per_token, ratio) in SEEDS.items():
        assert round(rows[key]["net_bytes_per_token"], 1) == per_token
        assert round(rows[key]["compression_ratio"], 2) == ratio
    assert report["summary"]["full_bytes_per_token"] == 28 * 2 * 8 * 128 * 2
    assert report["summary"]["check_passed"] is None
    assert _gate(report, "compression-table").status == "fail"  # no cross-check, no pass


def test_compression_cross_check(
    model_dir: Path, drafter_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "c.json"
    args = ["--model", str(model_dir), "--drafter", str(drafter_dir), *CROSS_CHECKED, "--out", str(out)]
    compression.main(args)
    report = json.loads(out.read_text())
    assert _gate(report, "compression-table").status == "pass", _gate(report, "compression-table").reasons()
    assert report["summary"]["checks"] == 2 * 4  # (full, 2 policies, the drafter's sink_window) x 2 lengths
    assert {(c["model"], c["policy"]) for c in report["checks"]} == {
        ("verifier", "full"),
        ("verifier", "sink_window:2:8"),
        ("verifier", "hybrid:2:8"),
        ("drafter", "sink_window:2:8"),
    }
    params = sum(p.numel() for p in engine.load(str(drafter_dir)).model.parameters())
    assert report["drafter"] == {"params": params, "weight_bytes": params * 4, "layers": 1}
    sw = [r for r in report["table"] if r["policy"] == "sink_window:2:8"]
    slot = 2 * 2 * 16 * 4
    assert all(
        r["kv_bytes"] == r["batch"] * 4 * (2 + 8 - 1 + 4) * slot for r in sw
    )  # bounded: k slack, any S
    for r in report["table"]:
        assert r["net_bytes"] == r["kv_bytes"] + r["drafter_kv_bytes"] + params * 4
        assert r["compression_ratio"] == pytest.approx(r["full_bytes"] / r["net_bytes"])

    real = compression.per_sequence
    monkeypatch.setattr(compression, "per_sequence", lambda *a: real(*a) + (1 if a[2] == 40 else 0))
    compression.main(args)
    report = json.loads(out.read_text())
    assert report["summary"]["check_passed"] is False
    assert [c["seq_len"] for c in report["checks"] if not c["match"]] == [40] * 4
    assert _gate(report, "compression-table").status == "fail"


@pytest.mark.parametrize(
    ("drafter", "printed", "kv", "layers"),
    [
        ("diffusion:zoo:tiny-dlm", "diffusion:zoo:tiny-dlm:steps=4", False, None),  # weights only
        ("zoo:tiny-dlm", "diffusion:zoo:tiny-dlm:steps=4", False, None),  # the kind its config.json says
        ("model:zoo:tiny-drafter", "model:zoo:tiny-drafter", True, 1),
        ("lookup", "lookup", False, None),
    ],
)
def test_compression_counts_what_each_drafter_kind_holds(
    drafter: str, printed: str, kv: bool, layers: int | None, tmp_path: Path
) -> None:
    out = tmp_path / "c.json"
    argv = ["--drafter", drafter, "--batches", "1", "--seq-lens", "4096", "--check-lens", "none"]
    compression.main([*argv, "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["config"]["drafter"] == printed and _gate(report).status == "pass"
    assert report["drafter"]["layers"] == layers
    assert (report["drafter"]["weight_bytes"] > 0) == (drafter != "lookup")
    assert all((r["drafter_kv_bytes"] > 0) == kv for r in report["table"])


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--drafter", "block:zoo:tiny-block-drafter"], "a block drafter's bytes are not counted yet"),
        (["--drafter", "model:zoo:tiny-dlm"], "is a diffusion drafter"),
        (["--k", "0"], "--k 0 is plain decoding: use --drafter none"),
    ],
)
def test_compression_refuses_a_drafter_it_does_not_count(
    argv: list[str], line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        compression.main([*argv, "--check-lens", "none", "--out", str(tmp_path / "c.json")])
    assert exc.value.code == 2 and line in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()


def test_oldest_visible_matches_the_reference_rule() -> None:
    from engine.policy import layer_specs

    types = ["sliding_attention", "full_attention"]
    for policy in (engine.full(), engine.hybrid(4, 8), engine.sink_window(4, 8), engine.sink_window(0, 40)):
        specs = layer_specs(policy, types, 16)
        for q in (0, 5, 11, 12, 30, 100):
            want = min(
                min((j for j in range(q + 1) if all(s.visible(q, i) for i in range(j, q + 1))), default=q)
                for s in specs
            )
            assert oldest_visible(specs, q) == want, (policy, q)


def test_compression_quantized_columns_and_a_quantized_policy_cross_checked(
    model_dir: Path, drafter_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "q.json"
    compression.main(
        [
            "--model",
            str(model_dir),
            "--drafter",
            str(drafter_dir),
            "--policy",
            "sink_window:2:8,hybrid:2:8:q4",
        ]
        + ["--k", "3", "--batches", "1,8", "--seq-lens", "8192", "--check-lens", "12,40", "--out", str(out)]
    )
    report = json.loads(out.read_text())
    assert _gate(report, "compression-table").status == "pass", _gate(report, "compression-table").reasons()
    assert ("verifier", "hybrid:2:8:q4") in {(c["model"], c["policy"]) for c in report["checks"]}
    # head_dim 16, float32: a group of 16 values is 16 (q8) or 8 (q4) bytes of codes + 2 x 4 bytes
    for r in report["table"]:
        plain = r["kv_bytes"] if r["policy"] == "sink_window:2:8" else r["kv_bytes"] * 64 // 16
        assert (r["kv_bytes_q8"], r["kv_bytes_q4"], r["kv_bytes_k8v4"]) == (
            plain * 24 // 64,
            plain * 16 // 64,
            plain * 20 // 64,
        )
        for q in ("q8", "q4", "k8v4"):
            net = r[f"kv_bytes_{q}"] + r["drafter_kv_bytes"] + r["drafter_weight_bytes"]
            assert r[f"compression_ratio_{q}"] == pytest.approx(r["full_bytes"] / net)
        assert r["compression_ratio_q4"] > r["compression_ratio_q8"]


def test_the_recall_plot_shows_the_gate_and_an_oracle_that_hybrid_equals(tmp_path: Path, monkeypatch) -> None:
    """report-recall.png: the gate's line (5 points under the oracle), and the oracle drawn under the policies
    wider, with larger hollow markers: where hybrid equals it (full recall) both stay visible."""
    import matplotlib.pyplot as plt

    figures: list = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to look at
    rungs = [
        {"context": c, "oracle": {"recall": 1.0, "kv_bytes": 8 * c}, "policies": {"hybrid": {"recall": 1.0, "kv_bytes": 512}}}
        for c in (256, 512, 1024)
    ]  # fmt: skip
    body = {
        "rungs": rungs,
        "summary": {"policies": {"hybrid": {"policy": "hybrid:4:64"}}},
        "placement": {"sink": 4, "window": 64},
        "config": {"model": "zoo:tiny-hybrid", "backend": "torch"},
    }
    niah.draw(body, tmp_path / "r-recall.png")
    assert (tmp_path / "r-recall.png").read_bytes()[:4] == b"\x89PNG"
    lines = {ln.get_label(): ln for ln in figures[0].axes[0].lines}
    oracle, hybrid = lines["full (oracle)"], lines["hybrid:4:64"]
    gate = next(ln for label, ln in lines.items() if label.startswith("gate: oracle - 0.05"))
    assert list(gate.get_ydata()) == [0.95, 0.95, 0.95]
    assert list(oracle.get_ydata()) == list(hybrid.get_ydata())  # equal: drawn so both show
    assert oracle.get_markersize() > hybrid.get_markersize() and oracle.get_markerfacecolor() == "none"
    assert oracle.get_linewidth() > hybrid.get_linewidth() and oracle.get_zorder() < hybrid.get_zorder()
