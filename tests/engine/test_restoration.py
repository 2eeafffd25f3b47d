"""K/V restoration (engine/restoration.py, torch) and its study (engine/workloads/restoration.py) on the zoo:
the identity restoration reproduces the full-cache oracle under a bounded cache while holding only the
bounded cache's bytes, f_theta's training is deterministic, and the study's report passes its preset's gate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import engine  # noqa: E402
from engine import restoration  # noqa: E402
from engine.workloads import niah  # noqa: E402
from engine.workloads import restoration as study  # noqa: E402
from tests.engine.test_workloads_zoo import _argv, _gate  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def zoo() -> tuple[engine.Model, engine.Model]:
    return engine.load("zoo:tiny-hybrid", "torch"), engine.load("zoo:tiny-drafter", "torch")


@pytest.mark.parametrize("chunk", [512, 100])
def test_identity_restoration_equals_the_oracle(zoo, chunk: int) -> None:
    model, _ = zoo
    placed = niah.place(model, 320, 0.5, 3, 4, 24, 1.0)
    assert placed.evicted
    policy = engine.sink_window(4, 24)
    supply = restoration.truth(restoration.capture(model, placed.ids))
    oracle = model.session(engine.full()).prefill(placed.ids, logits=True).logits
    bounded = model.session(policy, prefill_chunk=chunk).prefill(placed.ids, logits=True).logits
    restored_session = restoration.restored_session(model, policy, supply, prefill_chunk=chunk)
    restored = restored_session.prefill(placed.ids, logits=True).logits
    assert torch.allclose(restored, oracle, atol=1e-4)
    assert not torch.allclose(bounded, oracle, atol=1e-2)  # the bounded cache alone does lose the needle
    plain = model.session(policy, prefill_chunk=chunk)
    plain.prefill(placed.ids)
    assert restored_session.kv_bytes() == plain.kv_bytes()  # supplied K/V are not held by the cache
    stop = engine.Stop(6, model.eos_ids)
    want = engine.generate(model.session(engine.full()), placed.ids, stop).tokens
    got = engine.generate(restoration.restored_session(model, policy, supply), placed.ids, stop).tokens
    assert got == want and model.decode(want).split()[:4] == placed.answer.split()


def test_a_wrong_supply_changes_the_output(zoo) -> None:
    model, _ = zoo
    placed = niah.place(model, 320, 0.25, 1, 4, 24, 1.0)
    truth = restoration.truth(restoration.capture(model, placed.ids))
    noise = restoration.Supply([torch.randn_like(k) for k in truth.k], [torch.randn_like(v) for v in truth.v])
    policy = engine.sink_window(4, 24)
    oracle = model.session(engine.full()).prefill(placed.ids, logits=True).logits
    wrong = restoration.restored_session(model, policy, noise).prefill(placed.ids, logits=True).logits
    assert not torch.allclose(wrong, oracle, atol=1e-2)
    half = restoration.mix(0.5, truth, noise)
    assert torch.allclose(half.k[0], 0.5 * (truth.k[0] + noise.k[0]))
    gone = torch.arange(4, 320 - 24)
    assert restoration.rel_mse(truth, truth, [0, 1], gone) == 0.0
    assert restoration.rel_mse(half, truth, [0, 1], gone) == pytest.approx(
        0.25 * restoration.rel_mse(noise, truth, [0, 1], gone), rel=1e-4
    )


def test_ftheta_training_is_deterministic(zoo) -> None:
    model, drafter = zoo
    pairs = study.training_pairs(model, drafter, 2, 96, 0)
    geo = model.geometry
    scaling = float(model.attention_modules()[0].scaling)

    def fit() -> tuple[restoration.TrainResult, list[torch.Tensor]]:
        torch.manual_seed(0)
        f = restoration.FTheta(pairs[0][0].features().shape[1], 8, geo.kv_heads, geo.head_dim, 6)
        r = restoration.train_ftheta(f, pairs, geo.layer_types, geo.sliding_window, scaling, 4, seed=0)
        return r, [p.detach().clone() for p in f.parameters()]

    (a, pa), (b, pb) = fit(), fit()
    assert a == b and all(torch.equal(x, y) for x, y in zip(pa, pb, strict=True))
    assert a.steps == 4 and a.rows == 2 and a.row_tokens == 96
    assert a.last_loss < a.first_loss and a.first_kv_rel_mse > 0


def test_the_study_runs_and_its_gate_passes(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    params = {"contexts": "256", "samples": 1, "train_steps": 5, "train_rows": 2}
    argv = _argv("restoration-study", params, out)
    assert argv[1:3] == ["-m", "engine.workloads.restoration"]
    assert study.main([*argv[3:], "--depths", "0.25,0.75", "--alphas", "0.5"]) == 0
    report = json.loads(out.read_text())
    assert _gate(report, "restoration-study").status == "pass"
    arms = {a["name"]: a for a in report["arms"]}
    assert list(arms) == [
        "oracle",
        "sink_window",
        "exact_global",
        "identity",
        "f_theta",
        "f_theta+exact_global",
        "alpha=0.5",
    ]
    s = report["summary"]
    assert s["haystacks"] == 2 and s["needles_evicted"] and s["oracle_recall"] == 1.0
    assert arms["identity"]["matches_oracle"] and arms["identity"]["recall"] == 1.0
    assert arms["sink_window"]["recall"] < 1.0
    assert arms["identity"]["kv_bytes"] == arms["sink_window"]["kv_bytes"] < arms["oracle"]["kv_bytes"]
    assert arms["identity"]["rel_mse"] == {"full_attention": 0.0, "sliding_attention": 0.0}
    assert arms["sink_window"]["rel_mse"] == {"full_attention": 1.0, "sliding_attention": 1.0}
    assert arms["oracle"]["rel_mse_all"] == 0.0 and arms["exact_global"]["rel_mse"]["full_attention"] == 0.0
    assert 0 < arms["alpha=0.5"]["rel_mse_all"] < arms["f_theta"]["rel_mse_all"]
    assert arms["f_theta"]["source_bytes"] < arms["identity"]["source_bytes"]
    assert (tmp_path / "r-recall.png").is_file()

    # The gate can fail: an identity control that does not match the oracle is caught.
    report["summary"]["identity_matches_oracle"] = False
    assert _gate(report, "restoration-study").status == "fail"
