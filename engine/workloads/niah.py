"""`python -m engine.workloads.niah --out FILE`: needle-in-a-haystack recall of bounded-KV cache policies
against the full-cache oracle over a context ladder (kind `niah`, v1).

For each rung (context length) x needle depth x sample, the oracle (`full`) and every policy under test
(`--policy hybrid:4:64,sink_window:4:64`, each optionally with a K/V precision: `hybrid:4:64:q8`)
decode greedily after the same `engine.zoo.corpus.haystack`
prompt; recall is the exact match of the answer digits. Per rung the report gives the recall of each,
the recall delta (oracle minus policy, a fraction: 0.05 = 5 percentage points), the K/V bytes each holds
(measured from the cache) against the full cache and against the bound the policy promises
(`engine.policy.expected_kv_bytes`), and the farthest-back position each can still attend to.

Needle placement. On a rung longer than the widest policy window, every needle lies where the bounded
policies have evicted it by query time: after the sinks and before the window of the last prompt
position, i.e. token positions [sink, context - window) for the widest sink and window under test. The
depths are fractions of that evictable span: 0 % is the first sentence boundary at or after the sinks,
100 % the last one whose needle ends before the window. Shorter rungs use the depths over the whole
prompt, and say so (`needles_evicted: false`).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

import engine
from engine.geometry import read_geometry
from engine.policy import expected_kv_bytes, layer_slot_bytes, oldest_visible
from engine.report import geometry_block
from engine.workloads import cli, plots
from engine.zoo import corpus

DEPTHS = [0.0, 0.25, 0.5, 0.75, 1.0]
MIN_SPAN = 24  # evictable tokens a rung needs to place needles outside the window


class Config(cli.ModelConfig):
    policies: list[cli.PolicyField] = Field(min_length=1)  # under test: one per kind, not full
    contexts: list[Annotated[int, Field(ge=32)]] = Field(min_length=1)
    depths: list[Annotated[float, Field(ge=0.0, le=1.0)]] = Field(min_length=1)
    samples: int = Field(ge=1)
    seed: int
    batch: int = Field(default=1, ge=1)  # haystacks decoded at once (engine.generate_batch)


class Placed(BaseModel):
    """One haystack prompt as the model tokenizes it."""

    ids: list[int]
    answer: str
    needle_pos: int  # token index of the needle's key
    needle_end: int  # one past the needle's last token
    evicted: bool  # the needle lies in [sink, len(ids) - window) of the widest policy under test


class DepthResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    depth: float
    needle_pos: list[int]
    prompt_tokens: list[int]
    recall: dict[str, float]  # policy kind (full = the oracle) -> fraction of samples answered exactly


class OracleResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policy: str
    recall: float
    kv_bytes: int
    farthest_position: int


class PolicyResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policy: str
    recall: float
    recall_delta: float  # oracle recall - this policy's recall (fraction)
    kv_bytes: int  # held at the end of decoding, max over the rung's samples
    kv_bytes_bound: int  # what the policy promises at that position (engine.policy.expected_kv_bytes)
    kv_bytes_full: int  # the oracle's, same prompt
    kv_fraction: float  # kv_bytes / kv_bytes_full
    kv_allocated_bytes: int  # buffers allocated (bounded layers never beyond sink + ring)
    kv_bounded: bool
    farthest_position: int  # smallest key position the last prompt token still attends to (sinks aside)
    reach: int  # positions back from the last prompt token it still attends to (sinks aside)


class Rung(BaseModel):
    model_config = ConfigDict(extra="forbid")
    context: int
    samples: int  # haystacks per depth
    needles: int  # haystacks in the rung
    needles_evicted: bool  # every needle lies outside the window of every policy under test
    depths: list[DepthResult]
    oracle: OracleResult
    policies: dict[str, PolicyResult]


class PolicySummary(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policy: str
    min_recall: float
    max_recall_delta: float
    max_kv_fraction: float
    kv_bounded: bool


class Summary(BaseModel):
    model_config = ConfigDict(extra="forbid")
    oracle_min_recall: float
    evicted_rungs: int
    kv_bounded: bool
    policies: dict[str, PolicySummary]
    wall_s: float


# --- prompts ------------------------------------------------------------------------------------------


def locate(model: engine.Model, prompt: str, key: str) -> tuple[list[int], int, int]:
    """The prompt's token ids and the needle's token span, measured with the model's tokenizer."""
    m = re.search(rf"(^| ){re.escape(key)} :", prompt)
    if m is None:
        raise ValueError(f"needle {key!r} not found in its prompt")
    start = m.start() + len(m.group(1))
    end = prompt.index(" .", start) + 2
    ids = model.encode(prompt)
    return ids, len(model.encode(prompt[:start].rstrip())), len(model.encode(prompt[:end]))


def place(
    model: engine.Model, context: int, depth: float, seed: int, sink: int, window: int, scale: float
) -> Placed:
    """A haystack of about `context` tokens with its needle at `depth` of the evictable span (or of the
    whole prompt when the rung is too short to evict anything); `scale`: model tokens per corpus word."""

    n_words = max(32, round(context / scale))
    filler = n_words - 1 - (corpus.NEEDLE_DIGITS + 3) - corpus.QUERY_TOKENS
    needle = corpus.NEEDLE_DIGITS + 3
    evict = context - window - round(needle * scale) - sink >= MIN_SPAN
    if not evict:
        nd = corpus.haystack(n_words, depth, seed)
        ids, pos, end = locate(model, nd.prompt, nd.key)
        return Placed(
            ids=ids,
            answer=nd.answer,
            needle_pos=pos,
            needle_end=end,
            evicted=pos >= sink and end <= len(ids) - window,
        )
    for variant in range(24):
        target = sink + depth * (context - window - round(needle * scale) - sink)
        for _ in range(10):
            d = min(1.0, max(0.0, (target - 1) / (scale * filler)))
            nd = corpus.haystack(n_words, d, seed + 100_000 * variant)
            ids, pos, end = locate(model, nd.prompt, nd.key)
            hi = len(ids) - window
            if pos >= sink and end <= hi:
                return Placed(ids=ids, answer=nd.answer, needle_pos=pos, needle_end=end, evicted=True)
            # The needle snaps to the sentence boundary nearest the target: push the target past it.
            target += (sink - pos) if pos < sink else (hi - end)
    raise ValueError(f"could not place a needle outside the window at context {context}, depth {depth}")


def tokens_per_word(model: engine.Model) -> float:
    """Model tokens per corpus word (1.0 for the zoo tokenizer, about 1-2 for real tokenizers)."""

    nd = corpus.haystack(512, 0.5, 0)
    return len(model.encode(nd.prompt)) / nd.n_tokens


# --- the run --------------------------------------------------------------------------------------------


class _Tally:
    def __init__(self) -> None:
        self.hits = 0
        self.n = 0
        self.kv = 0
        self.bound = 0
        self.full = 0
        self.allocated = 0
        self.bounded = True
        self.farthest = 1 << 62
        self.reach = 0


def _decode(model: engine.Model, seq: engine.Session, batch: list[Placed]) -> list[bool]:
    """Whether each haystack's answer comes out (one row each; a row's output is cut to its own length,
    so it is the same as decoding it alone)."""
    news = [max(2, len(model.encode("? " + pl.answer)) - len(model.encode("?")) + 1) for pl in batch]
    stop = engine.Stop(max(news), model.eos_ids)
    if seq.rows == 1:
        gens = [engine.generate(seq, batch[0].ids, engine.Stop(news[0], model.eos_ids))]
    else:
        gens = engine.generate_batch(seq, [pl.ids for pl in batch], stop)
    out = []
    for pl, gen, n in zip(batch, gens, news, strict=True):
        want = pl.answer.split()
        out.append(model.decode(gen.tokens[:n]).replace(corpus.EOS, " ").split()[: len(want)] == want)
    return out


def _account(t: _Tally, seq: engine.Session, slot_bytes: list[int], n_prompts: list[int]) -> None:
    """K/V bytes of a (batched) session against the policy's bound: per layer over all rows (each row
    bounded at its own position), the most any row holds, and the attention reach of each prompt."""
    held = seq.kv_bytes()
    bounds = [expected_kv_bytes(seq.specs, n, seq.max_block, slot_bytes) for n in seq.positions]
    bound = [sum(layer) for layer in zip(*bounds, strict=True)]
    allocated = seq.kv_allocated_bytes()
    limits = [
        None if s.window is None else (s.sink + s.ring_size(seq.max_block)) * b * seq.rows
        for s, b in zip(seq.specs, slot_bytes, strict=True)
    ]
    t.bounded &= all(h <= b for h, b in zip(held, bound, strict=True))
    t.bounded &= all(lim is None or a <= lim for a, lim in zip(allocated, limits, strict=True))
    t.kv = max(t.kv, *seq.kv_row_bytes())
    t.bound = max(t.bound, *(sum(b) for b in bounds))
    t.allocated = max(t.allocated, sum(allocated) // seq.rows)
    for n_prompt in n_prompts:
        oldest = oldest_visible(seq.specs, n_prompt - 1)
        t.farthest = min(t.farthest, oldest)
        t.reach = max(t.reach, n_prompt - oldest)


def _depth(
    config: Config, model: Any, run: list[Any], tallies: dict[str, _Tally], slot_bytes: dict[str, Any],
    placed: list[Placed], depth: float, bar: Any,
) -> DepthResult:  # fmt: skip
    """Every policy (the oracle first: its K/V bytes are the others' reference) on one depth's haystacks."""
    hits = {p.kind: 0 for p in run}
    full_kv = 0
    for p in run:
        t = tallies[p.kind]
        for b in range(0, config.samples, config.batch):
            batch = placed[b : b + config.batch]
            seq = model.session(p, rows=len(batch))
            got = _decode(model, seq, batch)
            hits[p.kind] += sum(got)
            t.hits += sum(got)
            t.n += len(batch)
            _account(t, seq, slot_bytes[p.kind], [len(pl.ids) for pl in batch])
            if p.kind == "full":
                full_kv = max(full_kv, max(seq.kv_row_bytes()))
            bar.update(len(batch))
        t.full = max(t.full, full_kv)
    return DepthResult(
        depth=depth,
        needle_pos=[pl.needle_pos for pl in placed],
        prompt_tokens=[len(pl.ids) for pl in placed],
        recall={k: h / config.samples for k, h in hits.items()},
    )


def _rung(config: Config, context: int, under_test: list[Any], tallies: dict[str, _Tally],
          depths: list[DepthResult], evicted: bool) -> Rung:  # fmt: skip
    """One context's rung from its tallies: each policy against the oracle."""
    o = tallies["full"]
    oracle_recall = o.hits / o.n
    results = {}
    for p in under_test:
        t = tallies[p.kind]
        results[p.kind] = PolicyResult(
            policy=str(p),
            recall=t.hits / t.n,
            recall_delta=oracle_recall - t.hits / t.n,
            kv_bytes=t.kv,
            kv_bytes_bound=t.bound,
            kv_bytes_full=t.full,
            kv_fraction=t.kv / t.full if t.full else 1.0,
            kv_allocated_bytes=t.allocated,
            kv_bounded=t.bounded,
            farthest_position=t.farthest,
            reach=t.reach,
        )
    return Rung(
        context=context,
        samples=config.samples,
        needles=len(config.depths) * config.samples,
        needles_evicted=evicted,
        depths=depths,
        oracle=OracleResult(policy="full", recall=oracle_recall, kv_bytes=o.kv, farthest_position=o.farthest),
        policies=results,
    )


def _summary(rungs: list[Rung], under_test: list[Any], t0: float) -> Summary:
    return Summary(
        oracle_min_recall=min(r.oracle.recall for r in rungs),
        evicted_rungs=sum(r.needles_evicted for r in rungs),
        kv_bounded=all(p.kv_bounded for r in rungs for p in r.policies.values()),
        policies={
            p.kind: PolicySummary(
                policy=str(p),
                min_recall=min(r.policies[p.kind].recall for r in rungs),
                max_recall_delta=max(r.policies[p.kind].recall_delta for r in rungs),
                max_kv_fraction=max(r.policies[p.kind].kv_fraction for r in rungs),
                kv_bounded=all(r.policies[p.kind].kv_bounded for r in rungs),
            )
            for p in under_test
        },
        wall_s=round(time.perf_counter() - t0, 3),
    )


def niah(config: Config) -> dict[str, Any]:
    t0 = time.perf_counter()
    under_test = config.policies
    run = [engine.full(), *under_test]  # the oracle first
    sink = max(p.sink for p in under_test)
    window = max(p.window or 0 for p in under_test)
    model = engine.load(config.model, config.backend, config.dtype, config.device)
    geo = read_geometry(engine.resolve(config.model))
    slot_bytes = {p.kind: layer_slot_bytes(p, geo, config.dtype) for p in run}  # quantized: codes + scales
    scale = tokens_per_word(model)
    total = len(config.contexts) * len(config.depths) * config.samples * len(run)
    rungs: list[Rung] = []
    with cli.progress(total, "niah", "gen") as bar:
        for context in config.contexts:
            tallies = {p.kind: _Tally() for p in run}
            depths, evicted = [], True
            for depth in config.depths:
                placed = [
                    place(model, context, depth, config.seed + s, sink, window, scale)
                    for s in range(config.samples)
                ]
                evicted &= all(pl.evicted for pl in placed)
                depths.append(_depth(config, model, run, tallies, slot_bytes, placed, depth, bar))
                bar.set_postfix(context=context, depth=depth)
            rungs.append(_rung(config, context, under_test, tallies, depths, evicted))
    return {
        "config": config.model_dump(),
        "geometry": geometry_block(geo),
        "placement": {"sink": sink, "window": window},
        "rungs": [r.model_dump() for r in rungs],
        "summary": _summary(rungs, under_test, t0).model_dump(),
        "plot": None,
    }


GATE_DELTA = 0.05  # the niah presets' gate: a bounded policy's recall within 5 points of the oracle's


def draw(body: dict[str, Any], path: Any) -> None:
    """Recall vs context (oracle and each policy, with the gate's line: 5 points under the oracle) and K/V
    bytes held vs context. The oracle is a wide light line with large hollow markers under the policies' thin
    ones, so that a policy equal to it (hybrid at full recall) does not hide it."""
    plt = plots.pyplot()
    rungs = body["rungs"]
    xs = [r["context"] for r in rungs]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    oracle = {"color": "0.35", "lw": 5, "alpha": 0.45, "marker": "o", "ms": 11, "mfc": "none", "mew": 2}
    recall = [r["oracle"]["recall"] for r in rungs]
    ax.plot(xs, recall, label="full (oracle)", zorder=1, **oracle)
    bx.plot(xs, [r["oracle"]["kv_bytes"] for r in rungs], label="full (oracle)", zorder=1, **oracle)
    ax.plot(
        xs,
        [v - GATE_DELTA for v in recall],
        color="#b00020",
        ls="--",
        lw=1.2,
        label=f"gate: oracle - {GATE_DELTA:g} (niah presets: a bounded policy stays above)",
        zorder=2,
    )
    for kind, marker in zip(body["summary"]["policies"], ("s", "^", "D"), strict=False):
        label = body["summary"]["policies"][kind]["policy"]
        ax.plot(xs, [r["policies"][kind]["recall"] for r in rungs], f"-{marker}", label=label, ms=5, zorder=3)
        bx.plot(
            xs, [r["policies"][kind]["kv_bytes"] for r in rungs], f"-{marker}", label=label, ms=5, zorder=3
        )
    edge = body["placement"]["sink"] + body["placement"]["window"]
    for axis in (ax, bx):
        axis.set_xscale("log", base=2)
        axis.set_xticks(xs, [str(x) for x in xs])
        axis.minorticks_off()
        axis.set_xlabel("context (tokens)")
        if min(xs) <= edge <= max(xs):
            axis.axvline(edge, color="grey", ls=":", lw=1, label="sink + window")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    ax.set_ylim(-0.05, 1.05)
    ax.set_ylabel("needle recall (exact match)")
    ax.set_title("recall vs context")
    bx.set_yscale("log")
    bx.set_ylabel("K/V bytes held")
    bx.set_title("K/V bytes vs context")
    fig.suptitle(f"niah: {body['config']['model']} ({body['config']['backend']})", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def table(report: dict[str, Any]) -> str:
    kinds = list(report["summary"]["policies"])
    head = (
        ["context", "evicted", "oracle"] + [f"{k} (delta)" for k in kinds] + [f"{k} KV/full" for k in kinds]
    )
    lines = [" | ".join(head)]
    for r in report["rungs"]:
        row = [str(r["context"]), "yes" if r["needles_evicted"] else "no", f"{r['oracle']['recall']:.2f}"]
        row += [f"{r['policies'][k]['recall']:.2f} ({r['policies'][k]['recall_delta']:+.2f})" for k in kinds]
        row += [f"{r['policies'][k]['kv_fraction']:.3f}" for k in kinds]
        lines.append(" | ".join(row))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_model_args(parser)
    parser.add_argument(
        "--policy",
        default="hybrid:4:64,sink_window:4:64",
        help="policies under test, comma-separated (the full-cache oracle always runs)",
    )
    parser.add_argument(
        "--contexts", type=cli.int_list, default=[256, 512, 1024], help="the ladder, e.g. 256,1024"
    )
    parser.add_argument("--depths", type=cli.float_list, default=DEPTHS, help="needle depths in [0, 1]")
    parser.add_argument("--samples", type=int, default=4, help="haystacks per rung and depth")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=1, help="haystacks decoded at once (batched rows)")
    parser.add_argument(
        "--plot", help="PNG path (default: <report stem>-recall.png next to the report; 'none')"
    )
    args = parser.parse_args(argv)
    try:
        under_test = cli.policies(args.policy, allow_full=False)
        cli.set_threads(args.threads)
        cli.check_device(args.backend, args.device)
    except ValueError as exc:
        parser.error(str(exc))
    config = cli.make_config(parser, Config, args, policies=under_test)
    report, png = plots.write_plotted(args.out, "niah", niah(config), draw, "recall", args.plot)
    print(table(report))
    s = report["summary"]
    print(
        f"niah: oracle min recall {s['oracle_min_recall']:.2f}, "
        + ", ".join(f"{k} max delta {v['max_recall_delta']:+.2f}" for k, v in s["policies"].items())
        + f", kv_bounded {s['kv_bounded']}, {s['evicted_rungs']}/{len(report['rungs'])} rungs with evicted needles"
        + (f"; plot {png}" if png else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
