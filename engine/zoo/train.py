"""Train a zoo model on the CPU, deterministically.

    python -m engine.zoo.train --model tiny-hybrid            # the Gemma-3-style verifier
    python -m engine.zoo.train --model tiny-drafter           # 1-layer drafter, distilled from it
    python -m engine.zoo.train --model tiny-hybrid --smoke --out /tmp/x   # seconds: a few steps

Writes a Hugging Face model directory (config.json, model.safetensors, tokenizer files,
generation_config.json) plus train_record.json to engine/zoo/models/NAME/ (or --out).
Data come from `engine.zoo.corpus`, one `random.Random` per step seeded from the recipe's seed,
and the weights from `torch.manual_seed(seed)`, so a run is a function of the recipe (and of the
torch thread count, which changes float summation order).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from pydantic import BaseModel, ConfigDict
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from engine.models import ZOO_DIR, resolve
from engine.zoo import corpus, tokenizer


def model_dir(name: str) -> Path:
    """A model directory: a path with a config.json, or the name of a zoo model (`engine.resolve`)."""
    return resolve(name if (Path(name) / "config.json").is_file() else f"zoo:{name}")


class Arch(BaseModel):
    """Gemma-3 text architecture; layers alternate sliding/full with `pattern` (mlx-lm's
    `sliding_window_pattern`: layer i is full attention when (i + 1) % pattern == 0)."""

    model_config = ConfigDict(extra="forbid")
    hidden: int  # a perfect square <= 256^2 keeps sqrt(hidden) exact in bfloat16 (mlx-lm's embed scale)
    intermediate: int
    layers: int
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    # attention scale 1/sqrt(query_scalar): below head_dim so that q/k-normed heads can attend sharply
    # to one token among a thousand from the start (max logit head_dim/sqrt(query_scalar))
    query_scalar: int = 8
    sliding_window: int = 128
    pattern: int = 2
    rope_global: float = 1_000_000.0
    rope_local: float = 10_000.0
    max_positions: int = 8192


class Phase(BaseModel):
    model_config = ConfigDict(extra="forbid")
    steps: int
    min_len: int  # context length range (tokens, <bos> included), sampled per step
    max_len: int
    tokens_per_step: int  # rows per step = max(1, tokens_per_step // length)
    code_frac: float  # fraction of rows that are code-like text (the rest: haystacks or distilled)
    max_needles: int = 4  # needles per haystack row: 1..max_needles


class Distill(BaseModel):
    """Rows of verifier greedy continuations of corpus code prompts (for a drafter)."""

    model_config = ConfigDict(extra="forbid")
    verifier: str = "tiny-hybrid"
    prompts_per_len: int = 96
    prompt_lens: list[int] = [24, 48, 96, 160]
    new_tokens: int = 160
    frac: float = 0.6  # fraction of rows taken from the distilled pool


class Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    arch: Arch
    phases: list[Phase]
    lr: float = 1e-3
    min_lr_frac: float = 0.1
    warmup: int = 40
    weight_decay: float = 0.01
    # loss = mean CE over answer tokens + lm_weight * mean CE over all other tokens, so that the
    # retrieval signal is not drowned (in Adam's normalisation too) by the many filler/code tokens
    lm_weight: float = 0.2
    seed: int = 0
    distill: Distill | None = None


class TrainRun(BaseModel):
    """How a zoo model was trained, whatever its recipe (engine.zoo.train, engine.zoo.dlm): written next to
    the weights as train_record.json (`write`)."""

    command: str
    threads: int
    wall_s: float
    params: int
    final: dict[str, float]  # means over the last logged window of steps
    versions: dict[str, str]

    def write(self, out: Path) -> None:
        (out / "train_record.json").write_text(self.model_dump_json(indent=2) + "\n")


class TrainRecord(TrainRun):
    """What `train` did."""

    recipe: Recipe
    steps: int


RECIPES: dict[str, Recipe] = {
    "tiny-hybrid": Recipe(
        name="tiny-hybrid",
        arch=Arch(hidden=144, intermediate=288, layers=6),
        # single-needle rows first (retrieval takes off there), then distractors and longer contexts
        phases=[
            Phase(steps=300, min_len=48, max_len=160, tokens_per_step=3072, code_frac=0.1, max_needles=1),
            Phase(steps=250, min_len=96, max_len=384, tokens_per_step=3072, code_frac=0.1, max_needles=3),
            Phase(steps=200, min_len=384, max_len=896, tokens_per_step=4096, code_frac=0.05, max_needles=3),
            Phase(steps=150, min_len=896, max_len=1344, tokens_per_step=6144, code_frac=0.05, max_needles=3),
        ],
    ),
    "tiny-drafter": Recipe(
        name="tiny-drafter",
        arch=Arch(hidden=144, intermediate=288, layers=1, pattern=1),
        phases=[
            Phase(steps=500, min_len=64, max_len=256, tokens_per_step=2048, code_frac=0.5, max_needles=1)
        ],
        lr=2e-3,
        distill=Distill(),
    ),
}

SMOKE_ARCH = {
    "hidden": 16,
    "intermediate": 32,
    "heads": 2,
    "kv_heads": 1,
    "head_dim": 8,
    "sliding_window": 16,
}


def gemma_config(arch: Arch) -> Gemma3TextConfig:
    layer_types = [
        "full_attention" if (i + 1) % arch.pattern == 0 else "sliding_attention" for i in range(arch.layers)
    ]
    return Gemma3TextConfig(
        vocab_size=len(corpus.VOCAB),
        hidden_size=arch.hidden,
        intermediate_size=arch.intermediate,
        num_hidden_layers=arch.layers,
        num_attention_heads=arch.heads,
        num_key_value_heads=arch.kv_heads,
        head_dim=arch.head_dim,
        query_pre_attn_scalar=arch.query_scalar,
        sliding_window=arch.sliding_window,
        layer_types=layer_types,
        max_position_embeddings=arch.max_positions,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": arch.rope_global},
            "sliding_attention": {"rope_type": "default", "rope_theta": arch.rope_local},
        },
        pad_token_id=tokenizer.TOKEN_IDS[corpus.PAD],
        eos_token_id=tokenizer.TOKEN_IDS[corpus.EOS],
        bos_token_id=tokenizer.TOKEN_IDS[corpus.BOS],
        tie_word_embeddings=True,
    )


def save_model(model: Gemma3ForCausalLM, recipe: Recipe, out: Path) -> None:
    """An ordinary HF model directory, also loadable by mlx_lm.load (extra keys for mlx-lm)."""
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config.do_sample = False
    model.save_pretrained(out)
    tokenizer.save(out)
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    # mlx-lm's gemma3_text ignores layer_types/rope_parameters and reads these instead.
    cfg["sliding_window_pattern"] = recipe.arch.pattern
    cfg["rope_theta"] = recipe.arch.rope_global
    cfg["rope_local_base_freq"] = recipe.arch.rope_local
    cfg.pop("_sliding_window_pattern", None)  # private transformers attribute; the public key is above
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


# --- data --------------------------------------------------------------------------------------

Row = tuple[list[int], list[bool]]  # ids, answer mask


def _code_row(n: int, rng: random.Random) -> Row:
    ids = tokenizer.encode_words([corpus.BOS, *corpus.code_words(n - 1, rng)])
    return ids, [False] * n


def _haystack_row(n: int, rng: random.Random, phase: Phase) -> Row:
    words, mask = corpus.training_haystack(n, rng, phase.max_needles)
    return tokenizer.encode_words(words), mask


def make_batch(
    recipe: Recipe, phase: Phase, rng: random.Random, pool: dict[int, torch.Tensor] | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of one length (no padding): ids and the answer mask, both [B, L]."""
    distill = recipe.distill
    if pool and rng.random() < distill.frac:  # type: ignore[union-attr]
        seqs = pool[rng.choice(sorted(pool))]
        rows = max(1, min(len(seqs), phase.tokens_per_step // seqs.shape[1]))
        idx = rng.sample(range(len(seqs)), rows)
        ids = seqs[idx]
        return ids, torch.zeros(ids.shape, dtype=torch.bool)
    n = rng.randint(phase.min_len, phase.max_len)
    rows = max(1, phase.tokens_per_step // n)
    data = [
        _code_row(n, rng) if rng.random() < phase.code_frac else _haystack_row(n, rng, phase)
        for _ in range(rows)
    ]
    return torch.tensor([d[0] for d in data]), torch.tensor([d[1] for d in data])


@torch.no_grad()
def greedy(model: Gemma3ForCausalLM, ids: torch.Tensor, new_tokens: int, stop: bool = True) -> torch.Tensor:
    """Plain transformers greedy decoding with the full cache; returns only the new tokens.
    With stop=False exactly `new_tokens` tokens are produced (<eos> is not a stop)."""
    kw = {} if stop else {"min_new_tokens": new_tokens}
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.TOKEN_IDS[corpus.PAD],
        **kw,
    )
    return out[:, ids.shape[1] :]


def distill_pool(spec: Distill, seed: int, log) -> dict[int, torch.Tensor]:
    """Verifier greedy continuations of code prompts, grouped by total length."""
    try:
        vdir = model_dir(spec.verifier)
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"verifier: {exc} (train it first: python -m engine.zoo.train --model tiny-hybrid)"
        ) from None
    verifier = Gemma3ForCausalLM.from_pretrained(vdir, dtype=torch.float32).eval()
    pool: dict[int, torch.Tensor] = {}
    for plen in spec.prompt_lens:
        prompts = corpus.code_prompts(spec.prompts_per_len, seed=seed + 1000 + plen, n_tokens=plen)
        ids = torch.tensor([tokenizer.encode_words([corpus.BOS, *p.split(" ")]) for p in prompts])
        outs = [greedy(verifier, chunk, spec.new_tokens, stop=False) for chunk in ids.split(32)]
        pool[plen + spec.new_tokens] = torch.cat([ids, torch.cat(outs)], dim=1)
        log(f"distill: {len(prompts)} prompts of {plen} tokens + {spec.new_tokens} verifier tokens")
    return pool


# --- training ----------------------------------------------------------------------------------


def cosine_lr(step: int, total: int, lr: float, warmup: int, min_lr_frac: float) -> float:
    """The zoo trainers' schedule: linear warm-up to `lr` over `warmup` steps, then a cosine decay to
    min_lr_frac x lr at step `total`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return lr * (min_lr_frac + (1 - min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def adamw(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW (betas 0.9, 0.98) with weight decay on the weight matrices only (not on norms and biases)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.98),
    )


def lr_at(step: int, total: int, recipe: Recipe) -> float:
    return cosine_lr(step, total, recipe.lr, recipe.warmup, recipe.min_lr_frac)


def smoke_recipe(recipe: Recipe) -> Recipe:
    """The same code path in seconds: a tiny architecture, 2 short steps per phase."""
    arch = recipe.arch.model_copy(update={**SMOKE_ARCH, "layers": min(recipe.arch.layers, 2)})
    phases = [
        p.model_copy(update={"steps": 2, "max_len": p.min_len, "tokens_per_step": 2 * p.min_len})
        for p in recipe.phases
    ]
    distill = recipe.distill and recipe.distill.model_copy(
        update={"prompts_per_len": 2, "prompt_lens": [24], "new_tokens": 8}
    )
    return recipe.model_copy(update={"arch": arch, "phases": phases, "distill": distill, "warmup": 1})


def train(recipe: Recipe, out: Path, command: str = "", log=print) -> TrainRecord:
    t0 = time.time()
    torch.manual_seed(recipe.seed)
    model = Gemma3ForCausalLM(gemma_config(recipe.arch))
    model.set_attn_implementation("sdpa")
    pool = distill_pool(recipe.distill, recipe.seed, log) if recipe.distill else None
    model.train()
    opt = adamw(model, recipe.lr, recipe.weight_decay)
    total = sum(p.steps for p in recipe.phases)
    step = 0
    window: list[tuple[float, float, float, float]] = []
    final: dict[str, float] = {}
    for pi, phase in enumerate(recipe.phases):
        for _ in range(phase.steps):
            rng = random.Random(f"{recipe.name}:{recipe.seed}:{step}")
            ids, answers = make_batch(recipe, phase, rng, pool)
            for g in opt.param_groups:
                g["lr"] = lr_at(step, total, recipe)
            logits = model(input_ids=ids).logits[:, :-1]
            ans = answers[:, 1:]
            ce = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
            ).view_as(ans)
            loss = recipe.lm_weight * ce[~ans].mean()
            if ans.any():
                loss = loss + ce[ans].mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            with torch.no_grad():
                hit = logits.argmax(-1) == ids[:, 1:]
                acc = hit[ans].float().mean().item() if ans.any() else float("nan")
            window.append((loss.item(), acc, hit.float().mean().item(), float(ids.shape[1])))
            step += 1
            if step % 25 == 0 or step == total:
                accs = [x[1] for x in window if not math.isnan(x[1])]
                final = {
                    "loss": sum(x[0] for x in window) / len(window),
                    "answer_token_acc": sum(accs) / len(accs) if accs else float("nan"),
                    "token_acc": sum(x[2] for x in window) / len(window),
                    "mean_len": sum(x[3] for x in window) / len(window),
                }
                log(
                    f"step {step}/{total} phase {pi} loss {final['loss']:.4f} "
                    f"ans_acc {final['answer_token_acc']:.3f} tok_acc {final['token_acc']:.3f} "
                    f"len {final['mean_len']:.0f} "
                    f"lr {lr_at(step - 1, total, recipe):.2e} {time.time() - t0:.0f}s"
                )
                window = []
        model.eval()
        save_model(model, recipe, out)  # usable checkpoint after every phase
        model.train()
        log(f"phase {pi} done, saved {out}")
    model.eval()
    record = TrainRecord(
        recipe=recipe,
        command=command,
        threads=torch.get_num_threads(),
        wall_s=round(time.time() - t0, 1),
        steps=total,
        params=sum(p.numel() for p in model.parameters()),
        final=final,
        versions=versions(),
    )
    record.write(out)
    return record


def versions() -> dict[str, str]:
    """The tool versions a train record names (a run is a function of the recipe and of these)."""
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.zoo.train", description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, choices=sorted(RECIPES))
    ap.add_argument("--out", type=Path, help="output directory (default engine/zoo/models/NAME)")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    ap.add_argument("--seed", type=int, help="override the recipe's seed")
    ap.add_argument("--step-scale", type=float, default=1.0, help="multiply every phase's steps")
    ap.add_argument("--verifier", help="drafter only: verifier directory or zoo name to distill from")
    ap.add_argument("--smoke", action="store_true", help="tiny architecture, 2 steps per phase")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    recipe = RECIPES[args.model]
    if args.seed is not None:
        recipe = recipe.model_copy(update={"seed": args.seed})
    if args.step_scale != 1.0:
        recipe = recipe.model_copy(
            update={
                "phases": [
                    p.model_copy(update={"steps": max(1, round(p.steps * args.step_scale))})
                    for p in recipe.phases
                ]
            }
        )
    if args.verifier and recipe.distill:
        recipe = recipe.model_copy(
            update={"distill": recipe.distill.model_copy(update={"verifier": args.verifier})}
        )
    if args.smoke:
        recipe = smoke_recipe(recipe)
    out = args.out or ZOO_DIR / recipe.name
    command = "python -m engine.zoo.train " + " ".join(argv if argv is not None else sys.argv[1:])
    record = train(recipe, out, command=command, log=lambda s: print(s, flush=True))
    print(f"wrote {out} ({record.params} parameters, {record.wall_s:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
