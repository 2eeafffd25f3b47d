"""Cache policies and slot layout: exact visibility under forwards, prefill chunks and rollbacks;
K/V byte accounting of the torch cache (invariant c)."""

from __future__ import annotations

import random

import pytest

from engine.cache import EMPTY, Group, Layout, visible_mask
from engine.policy import (
    LayerSpec,
    Policy,
    expected_kv_bytes,
    full,
    hybrid,
    layer_spec,
    parse_policy,
    sink_window,
)


def test_parse_and_validate_policies() -> None:
    assert parse_policy("full") == full()
    assert parse_policy("sink_window:4:64") == sink_window(4, 64)
    assert parse_policy(str(hybrid(2, 8))) == hybrid(2, 8)
    for bad in ("window:4:64", "sink_window:4", "hybrid:a:8", "sink_window:4:0", "sink_window:-1:8"):
        with pytest.raises(ValueError, match="policy"):
            parse_policy(bad)
    with pytest.raises(ValueError, match="no sink or window"):
        Policy("full", 4, 8)
    with pytest.raises(ValueError, match="not supported"):
        layer_spec(full(), "chunked_attention", None)


def _policy_rule(policy: Policy, layer_type: str, native: int | None, q: int, j: int) -> bool:
    """The documented rule, written out: causal, policy sink+window (not on hybrid's full layers),
    intersected with the native window on sliding layers."""
    if j > q:
        return False
    exact = policy.kind == "full" or (policy.kind == "hybrid" and layer_type == "full_attention")
    if not exact:
        assert policy.window is not None
        if not (j < policy.sink or j > q - policy.window):
            return False
    return layer_type != "sliding_attention" or native is None or j > q - native


@pytest.mark.parametrize(
    "policy", [full(), sink_window(4, 8), sink_window(0, 5), sink_window(3, 40), hybrid(2, 6), hybrid(4, 30)]
)
@pytest.mark.parametrize("layer_type", ["full_attention", "sliding_attention"])
def test_layer_spec_is_the_documented_rule(policy: Policy, layer_type: str) -> None:
    native = 16
    spec = layer_spec(policy, layer_type, native)
    for q in range(70):
        for j in range(70):
            assert spec.visible(q, j) == _policy_rule(policy, layer_type, native, q, j), (spec, q, j)


def _simulate(spec: LayerSpec, max_block: int, steps: int, seed: int) -> int:
    """Drive a Layout with random blocks, prefill chunks and rollbacks, applying each plan to a
    slot -> position table exactly as a backend does; check every query attends to exactly the
    positions the rule allows. Returns the number of queries checked."""
    rng = random.Random(seed)
    layout = Layout(spec, max_block)
    table: list[int] = []  # slot -> absolute position held (EMPTY: nothing)
    checked = 0
    for step in range(steps):
        big = step == 0 or rng.random() < 0.05
        m = rng.randint(max_block + 1, 3 * max_block + 40) if big else rng.randint(1, max_block)
        plan = layout.plan(m)
        new = list(range(plan.start, plan.start + m))
        table += [EMPTY] * (plan.capacity - len(table))
        if spec.bounded:
            assert plan.capacity <= spec.sink + (spec.ring_size(max_block) or 0)
        if plan.concat:
            keys = table[: plan.old_view] + new
        written = new if plan.keep is None else [new[i] for i in plan.keep]
        assert len(set(plan.slots)) == len(plan.slots)
        for s, p in zip(plan.slots, written, strict=True):
            table[s] = p
        if not plan.concat:
            keys = table[: plan.view]
        for q in new:
            seen = sorted(
                k
                for k in keys
                if k <= q
                and (spec.window is None or k < spec.sink or k > q - spec.window)
                and (spec.native_window is None or k > q - spec.native_window)
            )
            assert seen == [j for j in range(q + 1) if spec.visible(q, j)], (spec, step, q)
            if not plan.mask:
                assert m == 1 and len(seen) == len(keys), "a mask-free forward attends to a hidden slot"
            if plan.sinks_hidden:
                assert m == 1 and seen == sorted(keys[spec.sink :]), (
                    "sinks_hidden: not exactly the sinks hidden"
                )
            checked += 1
        if rng.random() < 0.6:
            r = rng.randint(0, min(m + 2, layout.n))
            try:
                dropped = layout.trim(r)
            except ValueError:  # refused: more than the slack would be pending
                assert r > max_block or layout.hw - layout.n + r > max_block
                continue
            for s in dropped:
                table[s] = EMPTY
        assert layout.held() <= len(table)
    return checked


SPECS = [
    LayerSpec(0, None),
    LayerSpec(4, 8),
    LayerSpec(0, 8),
    LayerSpec(2, 1),
    LayerSpec(4, 5, 16),
    LayerSpec(3, 30),
]


def test_a_wrapped_ring_past_the_native_window_hides_exactly_its_sinks() -> None:
    """Decode steps of a sliding layer with sinks (the policy's window inside the native one) whose ring
    has wrapped and whose sinks left the native window see every slot but the sinks: one constant mask
    (`Plan.sinks_hidden`), on a row and on batched rows (the rows' smallest position decides)."""
    spec = LayerSpec(4, 5, 16)
    layout = Layout(spec, 1)
    layout.plan(3)
    hidden = []
    for _ in range(40):
        plan = layout.plan(1)
        hidden.append(plan.sinks_hidden)
        assert not plan.sinks_hidden or plan.mask
    assert hidden.index(True) == 19 + 1 - 4 and all(hidden[16:])  # from the query at 19 = 16 + 4 - 1 on
    group = Group(spec, "sliding_attention", 1, [0], rows=2)
    group.advance(30, row=0)
    group.advance(10, row=1)
    steps = [group.advance(1).plan.sinks_hidden for _ in range(14)]
    assert steps == [False] * 9 + [True] * 5  # row 1 reaches position 19 at the tenth step
    assert not _hides(LayerSpec(4, 20, 16))  # a window wider than the native one: the ring is masked too
    assert not _hides(LayerSpec(4, 5, None))  # no native window: nothing to hide (no mask at all)


def _hides(spec: LayerSpec) -> bool:
    layout = Layout(spec, 1)
    layout.plan(3)
    return any(layout.plan(1).sinks_hidden for _ in range(60))


@pytest.mark.parametrize("spec", SPECS, ids=str)
@pytest.mark.parametrize("max_block", [1, 2, 5, 9])
def test_layout_sees_exactly_the_window_through_wraps_and_rollbacks(spec: LayerSpec, max_block: int) -> None:
    assert _simulate(spec, max_block, steps=300, seed=max_block) > 300


@pytest.mark.parametrize("spec", SPECS, ids=str)
@pytest.mark.parametrize("max_block", [1, 3, 8])
def test_batched_advance_equals_each_rows_own_plan(spec: LayerSpec, max_block: int) -> None:
    """The vectorized batched step (`Group.advance(m)`, every row at once) writes, views and masks
    exactly what `Layout.plan` does for each row on its own, through per-row prefills of different
    lengths (some longer than the ring: concat), ring wraps, rollbacks and rows advanced alone."""
    rng = random.Random(max_block)
    rows = 4
    group = Group(spec, "full_attention", max_block, [0], rows)
    refs = [Layout(spec, max_block) for _ in range(rows)]
    tables: list[list[int]] = [[] for _ in range(rows)]

    def apply(r: int, m: int) -> None:  # the reference: one row's own plan on its own table
        plan = refs[r].plan(m)
        new = list(range(plan.start, plan.start + m))
        tables[r] += [EMPTY] * (plan.capacity - len(tables[r]))
        written = new if plan.keep is None else [new[i] for i in plan.keep]
        for slot, p in zip(plan.slots, written, strict=True):
            tables[r][slot] = p

    def check() -> None:
        for r in range(rows):
            assert group.layouts[r].n == refs[r].n and group.layouts[r].hw == refs[r].hw
            held = group.table[r].tolist()
            assert held[: len(tables[r])] == tables[r] and set(held[len(tables[r]) :]) <= {EMPTY}

    for r in range(rows):  # prompts of different lengths, some longer than the ring (concat)
        m = rng.randint(1, 3 * max_block + 40)
        group.advance(m, row=r)
        apply(r, m)
    check()
    for step in range(200):
        if rng.random() < 0.1:  # one row alone (rows drift apart)
            r, m = rng.randrange(rows), rng.randint(1, max_block)
            group.advance(m, row=r)
            apply(r, m)
        m = rng.randint(1, max_block)
        before = [lay.n for lay in refs]
        fwd = group.advance(m)
        for r in range(rows):
            apply(r, m)
        view = max(refs[r].view_len(refs[r].n, refs[r].hw) for r in range(rows))
        assert fwd.row is None and fwd.plan.view == view and not fwd.plan.concat
        assert fwd.plan.capacity >= view and fwd.plan.capacity <= group.table.shape[1]
        assert fwd.queries.tolist() == [list(range(b, b + m)) for b in before]
        assert fwd.slots is not None
        assert fwd.slots.tolist() == [
            [refs[r].slot(p) for p in range(b, b + m)] for r, b in enumerate(before)
        ]
        check()
        keys = [(tables[r] + [EMPTY] * view)[:view] for r in range(rows)]
        assert fwd.keys.tolist() == keys
        mask = visible_mask(spec, fwd.queries, fwd.keys)
        for r in range(rows):
            for i, q in enumerate(fwd.queries[r].tolist()):
                seen = sorted(k for k, v in zip(keys[r], mask[r, i].tolist(), strict=True) if v)
                assert seen == [j for j in range(q + 1) if spec.visible(q, j)], (spec, step, r, q)
        if not fwd.plan.mask:  # a mask-free batched forward: every row sees every slot of the view
            assert m == 1 and mask.all(), (spec, step)
        if fwd.plan.sinks_hidden:  # every row sees every slot of the view but the sinks
            assert m == 1 and not mask[..., : spec.sink].any() and mask[..., spec.sink :].all(), (spec, step)
        if rng.random() < 0.4:  # roll every row back (a rejected draft)
            n = rng.randint(0, m)
            told = group.trim(n)  # the slots it marked EMPTY, per row, for a backend's device copy
            assert (told is None) == (not spec.bounded)
            for r in range(rows):
                dropped = refs[r].trim(n)
                if spec.bounded:  # unbounded: the stale positions lie past every query (hidden)
                    assert told is not None and told[r] == list(dropped)
                    for slot in dropped:
                        tables[r][slot] = EMPTY
            check()
    if spec.bounded:  # every row's ring wrapped
        assert all(lay.limit is not None and lay.hw > lay.limit for lay in refs)


def test_rollback_beyond_the_slack_is_refused() -> None:
    layout = Layout(LayerSpec(4, 8), max_block=3)
    layout.plan(50)
    layout.plan(3)
    with pytest.raises(ValueError, match="slack of 3"):
        layout.trim(4)
    layout.trim(3)
    with pytest.raises(ValueError, match="slack"):
        layout.trim(1)  # 3 rejected positions already pending
    layout.plan(2)
    layout.trim(2)


def test_held_slots_follow_the_formula() -> None:
    spec = LayerSpec(4, 8)
    layout = Layout(spec, max_block=5)
    for n in range(1, 60):
        layout.plan(1)
        assert layout.held() == spec.held_slots(n, 5) == min(n, 4 + 8 - 1 + 5)


# --- K/V bytes of the torch cache (invariant c) ------------------------------------------------

torch = pytest.importorskip("torch")

from engine.policy import kv_bytes_per_slot  # noqa: E402
from tests.engine import tiny_models  # noqa: E402
from tests.engine.backends import BACKENDS, on  # noqa: E402


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("max_block", [1, 5])
def test_kv_bytes_sink_window_constant_hybrid_grows_only_in_full_layers(max_block: int, backend: str) -> None:
    cfg = tiny_models.gemma().model.config
    slot_bytes = [
        kv_bytes_per_slot(cfg.num_key_value_heads, cfg.head_dim, 4)
    ] * cfg.num_hidden_layers  # float32
    tm = on(backend, tiny_models.gemma())
    ids = tiny_models.prompt(300, seed=3)
    full_layers = [i for i, t in enumerate(tm.layer_types) if t == "full_attention"]
    sliding = [i for i, t in enumerate(tm.layer_types) if t == "sliding_attention"]
    history: dict[str, list[list[int]]] = {}
    for policy in (full(), sink_window(4, 8), hybrid(4, 8)):
        seq = tm.session(policy, max_block=max_block, prefill_chunk=64)
        rows = []
        for n in (40, 100, 200, 300):
            seq.prefill(ids[seq.position : n])
            got = seq.kv_bytes()
            assert got == expected_kv_bytes(seq.specs, n, max_block, slot_bytes)
            assert sum(seq.kv_allocated_bytes()) >= sum(got)
            rows.append(got)
        history[str(policy)] = rows
    sw = history["sink_window:4:8"]
    assert all(row == sw[0] for row in sw), "sink_window bytes must not grow"
    hy = history["hybrid:4:8"]
    for i in sliding:
        assert len({row[i] for row in hy}) == 1, "hybrid sliding layers must not grow"
    for i in full_layers:
        assert [row[i] for row in hy] == [row[i] for row in history["full"]]
        assert hy[0][i] < hy[-1][i]
    assert sum(sw[-1]) < sum(hy[-1]) < sum(history["full"][-1])
