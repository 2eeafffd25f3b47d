"""`python -m engine.workloads.restoration --out FILE`: the K/V restoration study (kind `restoration`, v1).

Can K/V that a bounded cache evicted be restored from elsewhere at attention time, well enough to keep
needle recall? f_theta (engine/restoration.py) is trained first, on the CPU: a low-rank map from the
drafter's K/V (`--drafter`, zoo:tiny-drafter) to every verifier layer's pre-RoPE K/V, with a relative
K/V MSE loss plus an attention-output distillation loss, on `--train-rows` zoo training haystacks. Then
every arm decodes the answer after the same haystacks (needles placed where sink + window evicted them,
engine.workloads.niah.place):

    oracle                the full cache
    sink_window           sink_window:SINK:WINDOW, nothing restored
    exact_global          hybrid:SINK:WINDOW (global layers exact), nothing restored
    identity              sink_window + the verifier's own K/V supplied at evicted positions: the control,
                          which must reproduce the oracle token for token (the study is shown to work)
    f_theta               sink_window + f_theta's K/V at evicted positions, every layer
    f_theta+exact_global  hybrid + f_theta's K/V at the sliding layers' evicted positions (seed 002's S5)
    alpha=A               sink_window + A * true + (1 - A) * f_theta K/V (`--alphas`)

Per arm: recall (exact answer digits), whether its tokens equal the oracle's on every haystack, the K/V
bytes the verifier's cache holds (max over haystacks), the bytes its restoration source keeps (the true
K/V for identity, the drafter's K/V and f_theta's weights for f_theta, both for a mix), and rel_mse per
layer type: ||attended - true||^2 / ||true||^2 of K and V at the positions evicted by the end of the
prompt (0 for an exact layer, 1 for a dropped one). Plots: recall vs alpha and recall vs rel_mse.
Torch backend only (the restored session is a TorchSession).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from typing import Annotated, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

import engine
from engine import restoration
from engine.geometry import SLIDING_ATTENTION
from engine.report import geometry_block
from engine.workloads import cli, niah, plots
from engine.zoo import corpus

Restore = Literal["none", "truth", "f_theta", "mix"]


class Config(cli.ModelConfig):
    drafter: str
    sink: int = Field(ge=0)
    window: int = Field(ge=1)
    contexts: list[int] = Field(min_length=1)  # each >= sink + window + 32 (room for an evicted needle)
    depths: list[Annotated[float, Field(ge=0.0, le=1.0)]] = Field(min_length=1)
    samples: int = Field(ge=1)
    alphas: list[Annotated[float, Field(gt=0.0, lt=1.0)]] = Field(min_length=1)
    rank: int = Field(ge=1)
    train_steps: int = Field(ge=1)
    train_rows: int = Field(ge=1)
    train_tokens: int = Field(ge=64)
    attn_weight: float = Field(ge=0)
    seed: int

    @model_validator(mode="after")
    def _room(self) -> Config:
        if any(c < self.sink + self.window + 32 for c in self.contexts):
            raise ValueError("every context must be >= sink + window + 32 (room for an evicted needle)")
        return self


class Training(restoration.TrainResult):
    source: str  # the drafter whose K/V f_theta reads
    rank: int
    params: int
    param_bytes: int
    seconds: float


class Arm(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    policy: str
    restore: Restore
    alpha: float | None  # mix: the weight of the true K/V
    recall: float
    matches_oracle: bool  # its tokens equal the oracle's on every haystack
    kv_bytes: int  # held by the verifier's cache at the end of decoding, max over haystacks
    source_bytes: int  # kept by the restoration source (max over haystacks)
    rel_mse: dict[str, float]  # layer type -> at the evicted positions (0: exact, 1: dropped)
    rel_mse_all: float  # over every layer


class Summary(BaseModel):
    model_config = ConfigDict(extra="forbid")
    haystacks: int
    needles_evicted: bool
    oracle_recall: float
    sink_window_recall: float
    identity_recall: float
    identity_matches_oracle: bool
    f_theta_recall: float
    f_theta_exact_global_recall: float
    complete: bool  # every arm ran on every haystack
    wall_s: float


def training_pairs(verifier: Any, drafter: Any, rows: int, tokens: int, seed: int) -> list[tuple[Any, Any]]:
    """(drafter trace, verifier trace) of `rows` zoo training haystacks (seeded apart from the study's)."""
    rng = random.Random(f"restoration-train:{seed}")
    pairs = []
    for _ in range(rows):
        words, _mask = corpus.training_haystack(tokens, rng)
        ids = verifier.encode(" ".join(words[1:]))
        pairs.append((restoration.capture(drafter, ids), restoration.capture(verifier, ids)))
    return pairs


def evicts(spec: Any, layer_type: str, native_window: int | None) -> bool:
    """Whether a layer's spec drops positions the model itself attends (narrower than its native rule)."""
    if spec.window is None:
        return False
    return layer_type != SLIDING_ATTENTION or native_window is None or spec.window < native_window


def _hit(model: engine.Model, tokens: list[int], answer: str) -> bool:
    want = answer.split()
    return bool(model.decode(tokens).replace(corpus.EOS, " ").split()[: len(want)] == want)


ArmSpec = tuple[str, engine.Policy, Restore, float | None]  # name, policy, what is restored, alpha


def train(config: Config, model: engine.Model, drafter: engine.Model) -> tuple[Any, Training]:
    """f_theta trained on the zoo's training haystacks, and what its training measured."""
    t_train = time.perf_counter()
    geo, types = model.geometry, list(model.geometry.layer_types)
    torch.manual_seed(config.seed)
    pairs = training_pairs(model, drafter, config.train_rows, config.train_tokens, config.seed)
    f = restoration.FTheta(
        pairs[0][0].features().shape[1], config.rank, geo.kv_heads, geo.head_dim, len(types)
    )
    scaling = float(model.attention_modules()[0].scaling)
    result = restoration.train_ftheta(
        f, pairs, types, geo.sliding_window, scaling, config.train_steps, attn_weight=config.attn_weight,
        seed=config.seed,
    )  # fmt: skip
    training = Training(
        source=config.drafter,
        rank=config.rank,
        params=sum(p.numel() for p in f.parameters()),
        param_bytes=f.nbytes,
        seconds=round(time.perf_counter() - t_train, 3),
        **result.model_dump(),
    )
    return f, training


class Tally:
    """Each arm's figures summed over the haystacks."""

    def __init__(self, arms: list[ArmSpec], types: list[str]):
        names = [a[0] for a in arms]
        self.arms, self.n = arms, 0
        self.hits = dict.fromkeys(names, 0)
        self.same = dict.fromkeys(names, True)
        self.kv = dict.fromkeys(names, 0)
        self.source = dict.fromkeys(names, 0)
        self.err: dict[str, dict[str, list[float]]] = {a: {t: [] for t in set(types)} for a in names}
        self.err_all: dict[str, list[float]] = {a: [] for a in names}

    def rows(self) -> list[Arm]:
        return [
            Arm(
                name=name,
                policy=str(policy),
                restore=how,
                alpha=alpha,
                recall=self.hits[name] / self.n,
                matches_oracle=self.same[name],
                kv_bytes=self.kv[name],
                source_bytes=self.source[name],
                rel_mse={lt: sum(v) / len(v) for lt, v in sorted(self.err[name].items())},
                rel_mse_all=sum(self.err_all[name]) / len(self.err_all[name]),
            )
            for name, policy, how, alpha in self.arms
        ]


def haystack(
    config: Config, model: engine.Model, drafter: engine.Model, f: Any, placed: Any, tally: Tally, bar: Any
) -> None:
    """Every arm decodes the answer after one placed haystack; its figures go to `tally`."""
    geo, types = model.geometry, list(model.geometry.layer_types)
    slot, dslot = geo.slot_bytes(config.dtype), drafter.geometry.slot_bytes(config.dtype)
    ids, t = placed.ids, len(placed.ids)
    trace = restoration.capture(model, ids)
    true = restoration.truth(trace)
    restored = f.supply(restoration.capture(drafter, ids), trace)
    zero = restoration.Supply([0 * x for x in true.k], [0 * x for x in true.v])
    gone = torch.arange(config.sink, max(config.sink, t - config.window))
    max_new = len(model.encode("? " + placed.answer)) - len(model.encode("?")) + 1
    stop = engine.Stop(max(2, max_new), model.eos_ids)
    oracle_tokens: list[int] = []
    tally.n += 1
    for name, policy, how, alpha in tally.arms:
        mix = None if alpha is None else restoration.mix(alpha, true, restored)
        supply = {"none": None, "truth": true, "f_theta": restored, "mix": mix}[how]
        session = (
            model.session(policy) if supply is None else restoration.restored_session(model, policy, supply)  # type: ignore[arg-type]
        )
        tokens = engine.generate(session, ids, stop).tokens
        if name == "oracle":
            oracle_tokens = tokens
        tally.hits[name] += _hit(model, tokens, placed.answer)
        tally.same[name] &= tokens == oracle_tokens
        tally.kv[name] = max(tally.kv[name], sum(session.kv_bytes()))
        bounded = [i for i, sp in enumerate(session.specs) if evicts(sp, types[i], geo.sliding_window)]
        true_bytes = t * sum(slot[i] for i in bounded)
        f_bytes = t * sum(dslot) + f.nbytes
        cost = {"none": 0, "truth": true_bytes, "f_theta": f_bytes, "mix": true_bytes + f_bytes}
        tally.source[name] = max(tally.source[name], cost[how] if bounded else 0)
        attended = zero if supply is None else supply
        for lt in set(types):
            layers = [i for i in bounded if types[i] == lt]
            tally.err[name][lt].append(restoration.rel_mse(attended, true, layers, gone) if layers else 0.0)
        tally.err_all[name].append(restoration.rel_mse(attended, true, bounded, gone) if bounded else 0.0)
        bar.update(1)


def study(config: Config) -> dict[str, Any]:
    t0 = time.perf_counter()
    model = engine.load(config.model, "torch", config.dtype, config.device)
    drafter = engine.load(config.drafter, "torch", config.dtype, config.device)
    probe = corpus.code_prompts(1, 0, 32)[0]
    if drafter.encode(probe) != model.encode(probe):
        raise ValueError(f"the drafter {config.drafter} does not share the verifier's tokenizer")
    f, training = train(config, model, drafter)
    sw = engine.sink_window(config.sink, config.window)
    hy = engine.hybrid(config.sink, config.window)
    arms: list[ArmSpec] = [
        ("oracle", engine.full(), "none", None),
        ("sink_window", sw, "none", None),
        ("exact_global", hy, "none", None),
        ("identity", sw, "truth", None),
        ("f_theta", sw, "f_theta", None),
        ("f_theta+exact_global", hy, "f_theta", None),
        *[(f"alpha={a:g}", sw, "mix", a) for a in config.alphas],
    ]
    tally, evicted = Tally(arms, list(model.geometry.layer_types)), True
    total = len(config.contexts) * len(config.depths) * config.samples * len(arms)
    with cli.progress(total, "restoration", "gen") as bar:
        for context in config.contexts:
            for depth in config.depths:
                for s in range(config.samples):
                    placed = niah.place(
                        model, context, depth, config.seed + s, config.sink, config.window, 1.0
                    )
                    evicted &= placed.evicted
                    haystack(config, model, drafter, f, placed, tally, bar)
    rows = tally.rows()
    by = {r.name: r for r in rows}
    summary = Summary(
        haystacks=tally.n,
        needles_evicted=evicted,
        oracle_recall=by["oracle"].recall,
        sink_window_recall=by["sink_window"].recall,
        identity_recall=by["identity"].recall,
        identity_matches_oracle=by["identity"].matches_oracle
        and by["identity"].recall == by["oracle"].recall,
        f_theta_recall=by["f_theta"].recall,
        f_theta_exact_global_recall=by["f_theta+exact_global"].recall,
        complete=tally.n == total // len(arms) and len(rows) == len(arms),
        wall_s=round(time.perf_counter() - t0, 3),
    )
    return {
        "config": config.model_dump(),
        "geometry": geometry_block(model.geometry),
        "training": training.model_dump(),
        "arms": [r.model_dump() for r in rows],
        "summary": summary.model_dump(),
        "plot": None,
    }


def draw(body: dict[str, Any], path: Any) -> None:
    """Recall vs alpha (f_theta at 0, identity at 1; oracle and sink_window for reference) and recall vs
    rel_mse over every arm."""
    plt = plots.pyplot()
    by = {a["name"]: a for a in body["arms"]}
    sweep = sorted(
        [(0.0, by["f_theta"]["recall"]), (1.0, by["identity"]["recall"])]
        + [(a["alpha"], a["recall"]) for a in body["arms"] if a["restore"] == "mix"]
    )
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    ax.plot([x for x, _ in sweep], [y for _, y in sweep], "-o", label="alpha * true + (1 - alpha) * f_theta")
    ax.axhline(by["oracle"]["recall"], color="k", ls="--", lw=1, label="oracle")
    ax.axhline(by["sink_window"]["recall"], color="grey", ls=":", lw=1, label="sink_window")
    ax.set_xlabel("alpha (weight of the true K/V)")
    ax.set_ylabel("needle recall")
    ax.set_title("recall vs alpha")
    for a in body["arms"]:
        bx.scatter(a["rel_mse_all"], a["recall"])
        bx.annotate(
            a["name"], (a["rel_mse_all"], a["recall"]), fontsize=7, xytext=(3, 3), textcoords="offset points"
        )
    bx.set_xlabel("rel_mse of the attended K/V at evicted positions (all layers)")
    bx.set_title("recall vs rel_mse")
    for axis in (ax, bx):
        axis.set_ylim(-0.05, 1.1)
        axis.grid(alpha=0.3)
    ax.legend(fontsize=8)
    c = body["config"]
    fig.suptitle(
        f"restoration: {c['model']} <- {c['drafter']}, sink {c['sink']} window {c['window']}", fontsize=10
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def table(report: dict[str, Any]) -> str:
    types = sorted(report["arms"][0]["rel_mse"])
    lines = [" | ".join(["arm", "policy", "recall", "= oracle", "kv_bytes", "source_bytes", *types])]
    for a in report["arms"]:
        lines.append(
            " | ".join(
                [a["name"], a["policy"], f"{a['recall']:.2f}", str(a["matches_oracle"]), str(a["kv_bytes"])]
                + [str(a["source_bytes"])]
                + [f"{a['rel_mse'][t]:.3g}" for t in types]
            )
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_model_args(parser, backend=False)
    parser.add_argument("--drafter", default="zoo:tiny-drafter", help="the model whose K/V f_theta reads")
    parser.add_argument("--sink", type=int, default=4)
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--contexts", type=cli.int_list, default=[384], help="haystack lengths, e.g. 256,512")
    parser.add_argument("--depths", type=cli.float_list, default=[0.0, 0.25, 0.5, 0.75, 1.0])
    parser.add_argument("--samples", type=int, default=2, help="haystacks per context and depth")
    parser.add_argument("--alphas", type=cli.float_list, default=[0.25, 0.5, 0.75, 0.9])
    parser.add_argument("--rank", type=int, default=32, help="f_theta's rank")
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument("--train-rows", type=int, default=16, help="training haystacks")
    parser.add_argument("--train-tokens", type=int, default=256, help="tokens per training haystack")
    parser.add_argument("--attn-weight", type=float, default=1.0, help="weight of the attention-output loss")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--plot", help="PNG path (default: <report stem>-recall.png next to the report; 'none')"
    )
    args = parser.parse_args(argv)
    try:
        cli.set_threads(args.threads)
    except ValueError as exc:
        parser.error(str(exc))
    config = cli.make_config(parser, Config, args, backend="torch")
    report, png = plots.write_plotted(args.out, "restoration", study(config), draw, "recall", args.plot)
    print(table(report))
    s = report["summary"]
    print(
        f"restoration: oracle {s['oracle_recall']:.2f}, sink_window {s['sink_window_recall']:.2f}, identity "
        f"{s['identity_recall']:.2f} (matches oracle {s['identity_matches_oracle']}), f_theta "
        f"{s['f_theta_recall']:.2f}, f_theta+exact_global {s['f_theta_exact_global_recall']:.2f} over "
        f"{s['haystacks']} haystacks" + (f"; plot {png}" if png else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
