"""`python -m engine.workloads.throughput --out FILE`: code-completion decode speed, greedy vs speculative
decoding under one cache policy (kind `throughput`, v1).

Prompts: the zoo's code-like corpus (`engine.zoo.corpus.code_prompts`) when the model reads the zoo
vocabulary (one token per word), else built-in HumanEval-style Python prompts (a signature and a
docstring to complete). Per prompt the verifier decodes greedily and then speculatively with the drafter
`--drafter SPEC` (engine.drafters.spec: `lookup`, `model:zoo:tiny-drafter`, `block:zoo:tiny-block-drafter`,
`diffusion:zoo:tiny-dlm:steps=4`, `gemma4-assistant:DIR`, or a bare model reference whose config.json
says its kind; k drafted tokens per block), each the best of `--repeats` runs. Reported per prompt:
decode-only tok/s (tokens after the first / time after prefill) and end-to-end tok/s (tokens / prefill +
decode) of both, the mean acceptance length (tokens committed per verifier forward), the speedup
(speculative / greedy decode tok/s), the acceptance per draft position (of the blocks drafting position i,
the fraction whose draft i was accepted), and `exact`: whether the two token lists are equal, compared
token by token; `digests`: per batch size and row that decoded the prompt, hashes of the plain greedy and
the speculative token lists (the gate checks each pair is equal).

Batched (`--batches`): per batch size B, greedy decoding of B prompts at once (the prompts cycled) and
batched speculative decoding of the same rows with the same drafter kind (engine.speculative_generate_batch;
a model or block drafter drafts for all rows in batched forwards; `ADAPT`: the draft length adapts per
block, docs/speculative.md): decode tok/s of both, speedup, acceptance length and per-position acceptance;
each row's digests go to its prompt's `digests`. A drafter that cannot batch (Gemma 4's assistant) says
why on stderr and leaves `speculative` null. `--temperature T` > 0 adds, per
prompt, plain sampling against lossless speculative sampling at T, `--repeats` runs of each (run i seeded
--seed + i): tok/s, speedup, acceptance length and per position (no parity: the draws differ), over all
prompts in `summary.sampled`.

A model drafter's own cache: `--drafter-policy` (default: sink_window with the policy's sink and window, or
full when the policy is full - a drafter only needs recent context).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, computed_field

import engine
from engine.backends.base import batch_unsupported
from engine.drafters import DrafterFactory, load_drafter, parse_drafter
from engine.policy import drafter_policy
from engine.workloads import cli, plots
from engine.zoo import corpus

HUMANEVAL_STYLE = [
    'def running_max(numbers: list[int]) -> list[int]:\n    """Return the running maximum of numbers.\n'
    '    >>> running_max([1, 3, 2, 5])\n    [1, 3, 3, 5]\n    """\n',
    'def count_vowels(text: str) -> int:\n    """Count the vowels (a, e, i, o, u) in text, ignoring case.\n'
    '    >>> count_vowels("Hello World")\n    3\n    """\n',
    'def is_palindrome(text: str) -> bool:\n    """Whether text reads the same backwards, ignoring spaces and case.\n'
    '    >>> is_palindrome("Never odd or even")\n    True\n    """\n',
    'def pairwise_sums(xs: list[int]) -> list[int]:\n    """Sums of neighbouring elements.\n'
    '    >>> pairwise_sums([1, 2, 3, 4])\n    [3, 5, 7]\n    """\n',
    'def flatten(nested: list[list[int]]) -> list[int]:\n    """Concatenate the inner lists in order.\n'
    '    >>> flatten([[1, 2], [], [3]])\n    [1, 2, 3]\n    """\n',
    'def word_lengths(sentence: str) -> dict[str, int]:\n    """Map each word of sentence to its length.\n'
    "    >>> word_lengths(\"to be or not\")\n    {'to': 2, 'be': 2, 'or': 2, 'not': 3}\n    \"\"\"\n",
    'def fizzbuzz(n: int) -> list[str]:\n    """FizzBuzz from 1 to n: "Fizz" for multiples of 3, "Buzz" of 5, "FizzBuzz" of both.\n'
    "    >>> fizzbuzz(5)\n    ['1', '2', 'Fizz', '4', 'Buzz']\n    \"\"\"\n",
    'def dedupe(items: list[int]) -> list[int]:\n    """Remove repeated items, keeping the first occurrence of each.\n'
    '    >>> dedupe([3, 1, 3, 2, 1])\n    [3, 1, 2]\n    """\n',
]


# batched speculative runs adapt the draft length per block (engine/draft_length.py)? On: with the
# block drafter on the zoo pair (benchmarks/results/batched_speculative-cpu.json) fixed k = 4 was 0.98x
# batched greedy at B = 32 and adaptive 1.19x, at the price of ~10% at B = 1 and 8 (still 1.5-2x)
ADAPT = True


class Config(cli.ModelConfig):
    policy: cli.PolicyField
    drafter: cli.Drafter
    drafter_policy: cli.PolicyField
    k: int = Field(ge=1)
    prompts: int = Field(ge=1)
    prompt_source: str
    prompt_tokens: int = Field(ge=2)
    new_tokens: int = Field(ge=2)
    repeats: int = Field(ge=1)
    seed: int
    min_speedup: float = Field(ge=0)
    batches: list[Annotated[int, Field(ge=1)]] = Field(
        default=[1, 8, 32], min_length=1
    )  # batch sizes of the batched greedy and speculative runs
    temperature: float = Field(default=0.0, ge=0)  # > 0: also plain vs speculative sampling per prompt

    @computed_field  # type: ignore[prop-decorator]
    @property
    def denoise_steps(self) -> int | None:
        """The diffusion drafter's denoising forwards per block at most (None: another drafter)."""
        return self.drafter.option("steps") if self.drafter.kind == "diffusion" else None


class Run(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tokens: int
    prefill_s: float
    decode_s: float
    decode_tok_s: float
    e2e_tok_s: float


class SpecRun(Run):
    forwards: int
    drafted: int
    accepted: int
    acceptance_length: float
    position_drafted: list[int]  # blocks drafting position i (0-based)
    position_accepted: list[int]  # ... whose draft i was accepted


class Digests(BaseModel):
    """Hashes of two token lists that must be equal (the gate's `same` check)."""

    model_config = ConfigDict(extra="forbid")
    greedy: str
    speculative: str


class BatchDigests(Digests):
    batch: int  # the batch size of the runs
    row: int  # the batch row that decoded the prompt


class Sampled(BaseModel):
    """Plain sampling vs lossless speculative sampling at the config's temperature: `repeats` runs of each,
    interleaved, run i seeded seed + i (no parity: the draws differ); tok/s over all runs."""

    model_config = ConfigDict(extra="forbid")
    temperature: float
    seeds: list[int]
    plain_tokens: int  # tokens after the first, over all runs
    plain_decode_s: float
    speculative_tokens: int
    speculative_decode_s: float
    speculative_forwards: int  # verify forwards over all runs
    plain_decode_tok_s: float
    speculative_decode_tok_s: float
    speedup: float
    acceptance_length: float
    acceptance_rate: float
    position_acceptance: list[float]


class SampledSummary(BaseModel):
    """Over all prompts: plain vs speculative sampling decode tok/s, speedup and acceptance."""

    model_config = ConfigDict(extra="forbid")
    temperature: float
    plain_decode_tok_s: float
    speculative_decode_tok_s: float
    speedup: float
    mean_acceptance_length: float


class Prompt(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompt_tokens: int
    greedy: Run
    speculative: SpecRun
    speedup: float  # speculative / greedy decode tok/s
    speedup_e2e: float
    exact: bool  # the speculative tokens equal the greedy tokens, compared token by token
    first_mismatch: int | None
    # per batch size, per row decoding this prompt: digests of the plain greedy and the speculative tokens
    # (batch 1: the unbatched runs above; B > 1: the rows of the batched runs)
    digests: list[BatchDigests]
    sampled: Sampled | None = None


class BatchedSpeculative(BaseModel):
    """Batched speculative decoding of the same rows (engine.speculative_generate_batch)."""

    model_config = ConfigDict(extra="forbid")
    decode_s: float
    decode_tok_s: float
    speedup: float  # / the batched greedy decode tok/s at this batch size
    acceptance_length: float  # tokens committed per row per verify forward
    position_acceptance: list[float]
    exact: bool  # every row equals greedy decoding of its prompt alone
    adaptive: bool  # the draft length adapted per block (0..k) to the measured costs (ADAPT)


class Batched(BaseModel):
    """Greedy decoding of `batch` prompts at once (the prompts, cycled): decode tok/s over all rows, and
    K/V bytes held at the end, per row and in total."""

    model_config = ConfigDict(extra="forbid")
    batch: int
    tokens: int  # new tokens over all rows
    decode_s: float
    decode_tok_s: float  # (tokens - rows) / decode_s: the first token of each row comes from prefill
    exact: bool  # every row equals greedy decoding of its prompt alone
    kv_bytes: int
    kv_bytes_per_row: list[int]
    speculative: BatchedSpeculative | None = None  # None: the drafter cannot batch (Gemma 4's assistant)


class Summary(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompts: int
    exact_prompts: int
    all_exact: bool
    greedy_decode_tok_s: float
    speculative_decode_tok_s: float
    greedy_e2e_tok_s: float
    speculative_e2e_tok_s: float
    speedup: float
    speedup_e2e: float
    min_prompt_speedup: float
    mean_acceptance_length: float
    acceptance_rate: float
    position_acceptance: list[float]  # per draft position: accepted / drafted over all prompts
    min_speedup: float
    speedup_ok: bool
    # decode tok/s over all prompts, one sample per repeat (for noise-aware baselines)
    greedy_decode_tok_s_samples: list[float] = []
    speculative_decode_tok_s_samples: list[float] = []
    sampled: SampledSummary | None = None  # --temperature > 0


def is_zoo_tokenizer(model: engine.Model) -> bool:
    """One token per word of a zoo code prompt (plus <bos>): the model reads the zoo vocabulary."""

    text = corpus.code_prompts(1, 0, 32)[0]
    ids = model.encode(text)
    return len(ids) == 32 and model.decode(ids[1:]) == text


def prompt_texts(source: str, n: int, n_tokens: int, seed: int) -> list[str]:
    if source == "zoo":
        return corpus.code_prompts(n, seed, n_tokens)
    return [HUMANEVAL_STYLE[(seed + i) % len(HUMANEVAL_STYLE)] for i in range(n)]


def _run(gen: Any) -> dict[str, Any]:
    total = gen.prefill_s + gen.decode_s
    return {
        "tokens": len(gen.tokens),
        "prefill_s": gen.prefill_s,
        "decode_s": gen.decode_s,
        "decode_tok_s": gen.decode_tok_s,
        "e2e_tok_s": len(gen.tokens) / total if total > 0 else 0.0,
    }


def _best(runs: list[Any]) -> Any:
    first = runs[0].tokens
    if any(r.tokens != first for r in runs):
        raise RuntimeError(
            "repeated runs of the same prompt produced different tokens: decoding is not deterministic"
        )
    return min(runs, key=lambda g: g.decode_s)


def throughput(config: Config) -> dict[str, Any]:

    t0 = time.perf_counter()
    policy = config.policy
    model = engine.load(config.model, config.backend, config.dtype, config.device)
    source = config.prompt_source
    if source == "auto":
        source = "zoo" if is_zoo_tokenizer(model) else "humaneval"
    texts = prompt_texts(source, config.prompts, config.prompt_tokens, config.seed)
    make_drafter: DrafterFactory = load_drafter(
        config.drafter,
        model,
        k=config.k,
        policy=config.drafter_policy,
        dtype=config.dtype,
        device=config.device,
        probe=texts[0],
    )
    stop = engine.Stop(config.new_tokens, model.eos_ids)
    _warm_up(model, config, make_drafter, model.encode(texts[0]))
    rows: list[Prompt] = []
    per_repeat: dict[str, list[list[Any]]] = {"greedy": [], "speculative": []}  # [prompt][repeat] runs
    greedy_tokens: list[list[int]] = []
    with cli.progress(len(texts) * config.repeats * 2, "throughput", "gen") as bar:
        for text in texts:
            ids = model.encode(text)
            greedy, spec = [], []
            for _ in range(config.repeats):  # interleaved, so a busy spell hits both alike
                greedy.append(engine.generate(model.session(policy), ids, stop))
                bar.update(1)
                session = model.session(policy, config.k + 1)
                spec.append(engine.speculative_generate(session, make_drafter(session), ids, config.k, stop))
                bar.update(1)
            per_repeat["greedy"].append(greedy)
            per_repeat["speculative"].append(spec)
            g, s = _best(greedy), _best(spec)
            greedy_tokens.append(g.tokens)
            sampled = _sampled(model, config, make_drafter, ids, stop) if config.temperature else None
            rows.append(_prompt(len(ids), g, s, sampled))
    summary = summarize(rows, config.min_speedup).model_copy(
        update={
            **{f"{m}_decode_tok_s_samples": repeat_rates(per_repeat[m]) for m in per_repeat},
            "sampled": summarize_sampled([r.sampled for r in rows if r.sampled]),
        }
    )
    alone = [model.encode(t) for t in texts]
    batched = []
    if why := batch_unsupported(model.geometry, policy):
        print(f"throughput: no batched runs: batched decoding {why}", file=sys.stderr)
    else:
        batched = _batched_runs(model, config, make_drafter, alone, greedy_tokens, stop, rows)
    return {
        "config": config.model_copy(update={"prompt_source": source}).model_dump(),
        "prompts": [r.model_dump() for r in rows],
        "batched": [b.model_dump() for b in batched],
        "summary": summary.model_dump(),
        "wall_s": round(time.perf_counter() - t0, 3),
        "plot": None,
    }


def _warm_up(model: engine.Model, config: Config, make_drafter: DrafterFactory, warm: list[int]) -> None:
    """First forwards pay one-off costs: run each kind once on a short decode, kept out of the figures."""
    engine.generate(model.session(config.policy), warm, engine.Stop(4))
    session = model.session(config.policy, config.k + 1)
    engine.speculative_generate(session, make_drafter(session), warm, config.k, engine.Stop(4))
    if config.temperature:
        _sampled(model, config.model_copy(update={"repeats": 1}), make_drafter, warm, engine.Stop(4))


def _prompt(prompt_tokens: int, g: Any, s: Any, sampled: Sampled | None) -> Prompt:
    """One prompt's row from its best greedy run `g` and best speculative run `s`."""
    mismatch = cli.first_divergence(g.tokens, s.tokens)
    gr = Run(**_run(g))
    sr = SpecRun(
        **_run(s),
        forwards=s.forwards,
        drafted=s.drafted,
        accepted=s.accepted,
        acceptance_length=s.acceptance_length,
        position_drafted=s.position_drafted,
        position_accepted=s.position_accepted,
    )
    return Prompt(
        prompt_tokens=prompt_tokens,
        greedy=gr,
        speculative=sr,
        speedup=sr.decode_tok_s / gr.decode_tok_s if gr.decode_tok_s else 0.0,
        speedup_e2e=sr.e2e_tok_s / gr.e2e_tok_s if gr.e2e_tok_s else 0.0,
        exact=mismatch is None,
        first_mismatch=mismatch,
        digests=[BatchDigests(batch=1, row=0, greedy=digest(g.tokens), speculative=digest(s.tokens))],
        sampled=sampled,
    )


def _batched_runs(
    model: engine.Model, config: Config, make_drafter: DrafterFactory, alone: list[list[int]],
    greedy_tokens: list[list[int]], stop: engine.Stop, rows: list[Prompt],
) -> list[Batched]:  # fmt: skip
    """Each batch size's run; its rows' digests go to their prompts (batch 1: the unbatched runs' stand)."""
    batched = []
    for b in config.batches:
        run, digests = _batched(model, config, make_drafter, alone, greedy_tokens, b, stop)
        batched.append(run)
        for r, d in enumerate(digests):
            if b > 1:
                rows[r % len(rows)].digests.append(d)
    return batched


def repeat_rates(runs: list[list[Any]]) -> list[float]:
    """Decode tok/s over all prompts for each repeat (runs[prompt][repeat])."""
    return [
        _rate(sum(len(p[i].tokens) - 1 for p in runs), sum(p[i].decode_s for p in runs))
        for i in range(len(runs[0]) if runs else 0)
    ]


def digest(tokens: list[int]) -> str:
    """A short hash of a token list (equal lists, equal digests)."""
    return hashlib.sha256(",".join(map(str, tokens)).encode()).hexdigest()[:16]


def _sampled(
    model: engine.Model, config: Config, make_drafter: DrafterFactory, ids: list[int], stop: Any
) -> Sampled:
    """Plain sampling vs speculative sampling at the config's temperature, `repeats` seeded runs each."""
    seeds = [config.seed + i for i in range(config.repeats)]
    plain, spec = [], []
    for seed in seeds:  # interleaved, so a busy spell hits both alike
        settings = engine.Sampling(temperature=config.temperature, seed=seed)
        plain.append(engine.generate(model.session(config.policy), ids, stop, settings))
        session = model.session(config.policy, config.k + 1)
        spec.append(
            engine.speculative_generate(session, make_drafter(session), ids, config.k, stop, settings)
        )
    p_tokens, s_tokens = sum(len(g.tokens) - 1 for g in plain), sum(len(g.tokens) - 1 for g in spec)
    p_s, s_s = sum(g.decode_s for g in plain), sum(g.decode_s for g in spec)
    forwards, drafted = sum(g.forwards for g in spec), sum(g.drafted for g in spec)
    return Sampled(
        temperature=config.temperature,
        seeds=seeds,
        plain_tokens=p_tokens,
        plain_decode_s=p_s,
        speculative_tokens=s_tokens,
        speculative_decode_s=s_s,
        speculative_forwards=forwards,
        plain_decode_tok_s=_rate(p_tokens, p_s),
        speculative_decode_tok_s=_rate(s_tokens, s_s),
        speedup=_rate(s_tokens, s_s) / _rate(p_tokens, p_s) if p_tokens else 0.0,
        acceptance_length=s_tokens / forwards if forwards else 1.0,
        acceptance_rate=sum(g.accepted for g in spec) / drafted if drafted else 0.0,
        position_acceptance=position_acceptance(spec),
    )


def position_acceptance(gens: list[Any]) -> list[float]:
    """Per draft position i over generations: blocks whose draft i was accepted / blocks drafting i."""
    n = max((len(g.position_drafted) for g in gens), default=0)
    pairs = [
        (
            sum(g.position_accepted[i] for g in gens if i < len(g.position_accepted)),
            sum(g.position_drafted[i] for g in gens if i < len(g.position_drafted)),
        )
        for i in range(n)
    ]
    return [a / d if d else 0.0 for a, d in pairs]


def summarize_sampled(runs: list[Sampled]) -> SampledSummary | None:
    if not runs:
        return None
    plain = _rate(sum(r.plain_tokens for r in runs), sum(r.plain_decode_s for r in runs))
    spec = _rate(sum(r.speculative_tokens for r in runs), sum(r.speculative_decode_s for r in runs))
    forwards = sum(r.speculative_forwards for r in runs)
    return SampledSummary(
        temperature=runs[0].temperature,
        plain_decode_tok_s=plain,
        speculative_decode_tok_s=spec,
        speedup=spec / plain if plain else 0.0,
        mean_acceptance_length=sum(r.speculative_tokens for r in runs) / forwards if forwards else 1.0,
    )


def _batched(
    model: engine.Model,
    config: Config,
    make_drafter: DrafterFactory,
    prompts: list[list[int]],
    want: list[list[int]],
    b: int,
    stop: Any,
) -> tuple[Batched, list[BatchDigests]]:
    """One batched greedy run of b rows (the prompts cycled), then batched speculative decoding of the same
    rows; each row checked against its prompt alone, and each row's two token lists digested."""
    rows = [prompts[r % len(prompts)] for r in range(b)]
    session = model.session(config.policy, rows=b)
    gens = engine.generate_batch(session, rows, stop)
    tokens = sum(len(g.tokens) for g in gens)
    decode_s = gens[0].decode_s
    greedy_tok_s = _rate(tokens - b, decode_s)
    out = Batched(
        batch=b,
        tokens=tokens,
        decode_s=decode_s,
        decode_tok_s=greedy_tok_s,
        exact=all(g.tokens == want[r % len(want)] for r, g in enumerate(gens)),
        kv_bytes=sum(session.kv_bytes()),
        kv_bytes_per_row=session.kv_row_bytes(),
    )
    verifier = model.session(config.policy, config.k + 1, rows=b)
    try:
        first = make_drafter(verifier)  # one for all rows (a model drafter), or one per row
        drafters = (
            first if hasattr(first, "propose_rows") else [first, *(make_drafter(verifier) for _ in rows[1:])]
        )
        specs = engine.speculative_generate_batch(verifier, drafters, rows, config.k, stop, adapt=ADAPT)
    except ValueError as exc:
        print(f"throughput: no batched speculative run at B={b}: {exc}", file=sys.stderr)
        return out, []
    n = max(len(g.position_drafted) for g in specs)
    drafted = [sum(g.position_drafted[i] for g in specs if i < len(g.position_drafted)) for i in range(n)]
    accepted = [sum(g.position_accepted[i] for g in specs if i < len(g.position_accepted)) for i in range(n)]
    spec_s = specs[0].decode_s
    spec_tok_s = _rate(sum(len(g.tokens) for g in specs) - b, spec_s)
    forwards = sum(g.forwards for g in specs)
    digests = [
        BatchDigests(batch=b, row=r, greedy=digest(g.tokens), speculative=digest(s.tokens))
        for r, (g, s) in enumerate(zip(gens, specs, strict=True))
    ]
    return out.model_copy(
        update={
            "speculative": BatchedSpeculative(
                decode_s=spec_s,
                decode_tok_s=spec_tok_s,
                speedup=spec_tok_s / greedy_tok_s if greedy_tok_s else 0.0,
                acceptance_length=sum(len(g.tokens) - 1 for g in specs) / forwards if forwards else 1.0,
                position_acceptance=[x / d if d else 0.0 for x, d in zip(accepted, drafted, strict=True)],
                exact=all(g.tokens == want[r % len(want)] for r, g in enumerate(specs)),
                adaptive=ADAPT,
            )
        }
    ), digests


def _rate(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0


def _per_position(rows: list[Prompt]) -> list[float]:
    n = max((len(r.speculative.position_drafted) for r in rows), default=0)
    drafted, accepted = [0] * n, [0] * n
    for r in rows:
        for i, (d, a) in enumerate(
            zip(r.speculative.position_drafted, r.speculative.position_accepted, strict=True)
        ):
            drafted[i] += d
            accepted[i] += a
    return [a / d if d else 0.0 for a, d in zip(accepted, drafted, strict=True)]


def summarize(rows: list[Prompt], min_speedup: float) -> Summary:
    g_dec = _rate(sum(r.greedy.tokens - 1 for r in rows), sum(r.greedy.decode_s for r in rows))
    s_dec = _rate(sum(r.speculative.tokens - 1 for r in rows), sum(r.speculative.decode_s for r in rows))
    g_e2e = _rate(
        sum(r.greedy.tokens for r in rows), sum(r.greedy.prefill_s + r.greedy.decode_s for r in rows)
    )
    s_e2e = _rate(
        sum(r.speculative.tokens for r in rows),
        sum(r.speculative.prefill_s + r.speculative.decode_s for r in rows),
    )
    forwards = sum(r.speculative.forwards for r in rows)
    drafted = sum(r.speculative.drafted for r in rows)
    speedup = s_dec / g_dec if g_dec else 0.0
    exact = sum(r.exact for r in rows)
    return Summary(
        prompts=len(rows),
        exact_prompts=exact,
        all_exact=exact == len(rows),
        greedy_decode_tok_s=g_dec,
        speculative_decode_tok_s=s_dec,
        greedy_e2e_tok_s=g_e2e,
        speculative_e2e_tok_s=s_e2e,
        speedup=speedup,
        speedup_e2e=s_e2e / g_e2e if g_e2e else 0.0,
        min_prompt_speedup=min(r.speedup for r in rows),
        mean_acceptance_length=sum(r.speculative.tokens - 1 for r in rows) / forwards if forwards else 1.0,
        acceptance_rate=sum(r.speculative.accepted for r in rows) / drafted if drafted else 0.0,
        position_acceptance=_per_position(rows),
        min_speedup=min_speedup,
        speedup_ok=speedup >= min_speedup,
    )


def draw(body: dict[str, Any], path: Any) -> None:
    """Decode tok/s per prompt and overall, greedy vs speculative, with the speedup over each pair."""
    plt = plots.pyplot()
    rows, s = body["prompts"], body["summary"]
    labels = [str(i) for i in range(len(rows))] + ["all"]
    greedy = [r["greedy"]["decode_tok_s"] for r in rows] + [s["greedy_decode_tok_s"]]
    spec = [r["speculative"]["decode_tok_s"] for r in rows] + [s["speculative_decode_tok_s"]]
    speedups = [r["speedup"] for r in rows] + [s["speedup"]]
    xs = list(range(len(labels)))
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(labels) + 2), 4))
    ax.bar([x - 0.2 for x in xs], greedy, 0.4, label="greedy")
    c = body["config"]
    ax.bar([x + 0.2 for x in xs], spec, 0.4, label=f"speculative ({c['drafter']}, k={c['k']})")
    for x, g, sp, up in zip(xs, greedy, spec, speedups, strict=True):
        ax.annotate(f"{up:.2f}x", (x, max(g, sp)), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(xs, labels)
    ax.set_xlabel("prompt")
    ax.set_ylabel("decode tok/s")
    ax.set_title(f"throughput: {c['model']} ({c['backend']}, {c['policy']})", fontsize=10)
    ax.set_ylim(0, 1.3 * max(greedy + spec + [1e-9]))
    ax.legend(fontsize=8, loc="upper left", ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def said(report: dict[str, Any], png: Any) -> str:
    """The report in a few lines: each prompt, the summary, sampling and the batched runs."""
    out = []
    s = report["summary"]
    for i, r in enumerate(report["prompts"]):
        out.append(
            f"prompt {i}: greedy {r['greedy']['decode_tok_s']:.1f} tok/s, speculative "
            f"{r['speculative']['decode_tok_s']:.1f} tok/s ({r['speedup']:.2f}x), acceptance length "
            f"{r['speculative']['acceptance_length']:.2f}, exact {r['exact']}"
        )
    out.append(
        f"throughput: greedy {s['greedy_decode_tok_s']:.1f} tok/s, speculative {s['speculative_decode_tok_s']:.1f} "
        f"tok/s, speedup {s['speedup']:.2f}x (e2e {s['speedup_e2e']:.2f}x), acceptance length "
        f"{s['mean_acceptance_length']:.2f} (per draft position "
        f"{' '.join(f'{p:.2f}' for p in s['position_acceptance'])}), exact {s['exact_prompts']}/{s['prompts']}"
        + (f"; plot {png}" if png else "")
    )
    if sm := s.get("sampled"):
        out.append(
            f"sampling at temperature {sm['temperature']}: plain {sm['plain_decode_tok_s']:.1f} tok/s, speculative "
            f"{sm['speculative_decode_tok_s']:.1f} tok/s, speedup {sm['speedup']:.2f}x, acceptance length "
            f"{sm['mean_acceptance_length']:.2f} (no parity check: the draws differ)"
        )
    if report["batched"]:
        out.append("batch  greedy tok/s  speculative tok/s  speedup  acceptance length  per position")
        for row in report["batched"]:
            sp = row["speculative"]
            out.append(
                f"{row['batch']:>5}  {row['decode_tok_s']:>12.1f}  "
                + (
                    f"{sp['decode_tok_s']:>17.1f}  {sp['speedup']:>6.2f}x  {sp['acceptance_length']:>17.2f}  "
                    + " ".join(f"{p:.2f}" for p in sp["position_acceptance"])
                    if sp
                    else f"{'-':>17}"
                )
            )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_model_args(parser)
    parser.add_argument(
        "--policy", default="hybrid:4:64", help="full | sink_window:SINK:WINDOW | hybrid:SINK:WINDOW"
    )
    parser.add_argument(
        "--drafter",
        default="model:zoo:tiny-drafter",
        help="lookup | model:REF | block:REF | diffusion:REF[:steps=N] | gemma4-assistant:REF | a bare REF "
        "(its config.json says the kind)",
    )
    parser.add_argument(
        "--drafter-policy", default="auto", help="the drafter's cache policy (auto: see above)"
    )
    parser.add_argument("--k", type=int, default=4, help="tokens drafted per block")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-source", choices=("auto", "zoo", "humaneval"), default="auto")
    parser.add_argument("--prompt-tokens", type=int, default=96, help="zoo prompts: tokens each")
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument(
        "--repeats", type=int, default=2, help="runs per prompt and method; the fastest counts"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--batches",
        type=cli.int_list,
        default=[1, 8, 32],
        help="batch sizes of the batched greedy and speculative runs",
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="> 0: also plain vs speculative sampling per prompt at this temperature (--repeats runs, seeded "
        "--seed + i)",
    )
    parser.add_argument("--min-speedup", type=float, default=1.0, help="summary.speedup_ok: speedup >= this")
    parser.add_argument(
        "--plot", help="PNG path (default: <report stem>-tok_s.png next to the report; 'none')"
    )
    args = parser.parse_args(argv)

    try:
        policy = engine.parse_policy(args.policy)
        drafter = parse_drafter(args.drafter)
        dpolicy = drafter_policy(policy) if args.drafter_policy == "auto" else args.drafter_policy
        cli.set_threads(args.threads)
        cli.check_device(args.backend, args.device)
    except ValueError as exc:
        parser.error(str(exc))
    config = cli.make_config(parser, Config, args, policy=policy, drafter=drafter, drafter_policy=dpolicy)
    report, png = plots.write_plotted(args.out, "throughput", throughput(config), draw, "tok_s", args.plot)
    print(said(report, png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
