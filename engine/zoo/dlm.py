"""Train `zoo:tiny-dlm`, the masked-diffusion drafter, on the CPU, deterministically.

    python -m engine.zoo.dlm                          # writes engine/zoo/models/tiny-dlm/
    python -m engine.zoo.dlm --smoke --out /tmp/dlm   # seconds: a tiny model, a few steps

A small bidirectional transformer (engine/drafters/diffusion/torch.py) with the zoo tokenizer. Rows
are windows of the verifier's (`zoo:tiny-hybrid`) greedy continuations of code prompts, mixed with
plain `corpus.code_words` text. Masked-diffusion objective as the drafter uses it: per row a block of
b trailing positions (b uniform in 1..max_block) and a mask rate t uniform in (0, 1]; each block
position is masked with probability t (at least one), and the loss is the mean cross-entropy over
the masked positions, the LM head run at those positions only. Data come from one `random.Random`
per step seeded from the recipe, weights from `torch.manual_seed(seed)`: a run is a function of the
recipe and the thread count.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict
from transformers import AutoModelForCausalLM

from engine.drafters.diffusion.config import DiffusionConfig
from engine.drafters.diffusion.torch import TinyDLM, save_model
from engine.models import ZOO_DIR, resolve
from engine.zoo import corpus, tokenizer
from engine.zoo.train import TrainRun, adamw, cosine_lr, versions


class Distill(BaseModel):
    model_config = ConfigDict(extra="forbid")
    verifier: str = "zoo:tiny-hybrid"
    prompts_per_len: int = 128
    prompt_lens: list[int] = [24, 64, 96]
    new_tokens: int = 128
    frac: float = 0.75  # fraction of rows taken from the distilled pool (the rest: corpus code text)


class Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = "tiny-dlm"
    config: DiffusionConfig
    steps: int
    rows: int  # rows per step
    min_len: int = 16
    max_block: int = 16  # largest masked block (the drafter's k)
    lr: float = 2e-3
    min_lr_frac: float = 0.1
    warmup: int = 50
    weight_decay: float = 0.01
    seed: int = 0
    distill: Distill = Distill()


class TrainRecord(TrainRun):
    recipe: Recipe


VOCAB = len(corpus.VOCAB)
RECIPE = Recipe(
    config=DiffusionConfig(
        vocab_size=VOCAB, hidden=96, layers=3, heads=4, intermediate=192, max_positions=64, context=48
    ),
    steps=2500,
    rows=64,
)
SMOKE = RECIPE.model_copy(
    update={
        "config": RECIPE.config.model_copy(
            update={
                "hidden": 16,
                "layers": 1,
                "heads": 2,
                "intermediate": 32,
                "max_positions": 24,
                "context": 16,
            }
        ),
        "max_block": 8,
        "steps": 3,
        "rows": 4,
        "warmup": 1,
        "distill": Distill(prompts_per_len=2, prompt_lens=[24], new_tokens=8),
    }
)


@torch.no_grad()
def distill_pool(spec: Distill, seed: int, log) -> list[list[int]]:
    """<bos> + code prompt + the verifier's greedy continuation (full cache), one list per row."""
    verifier = AutoModelForCausalLM.from_pretrained(resolve(spec.verifier), dtype=torch.float32).eval()
    pool: list[list[int]] = []
    for plen in spec.prompt_lens:
        prompts = corpus.code_prompts(spec.prompts_per_len, seed=seed + 2000 + plen, n_tokens=plen)
        ids = torch.tensor([tokenizer.encode_words([corpus.BOS, *p.split(" ")]) for p in prompts])
        for chunk in ids.split(32):
            out = verifier.generate(
                chunk,
                attention_mask=torch.ones_like(chunk),
                max_new_tokens=spec.new_tokens,
                min_new_tokens=spec.new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.TOKEN_IDS[corpus.PAD],
            )
            pool += out.tolist()
        log(f"distill: {len(prompts)} prompts of {plen} tokens + {spec.new_tokens} verifier tokens")
    return pool


def make_batch(
    recipe: Recipe, pool: list[list[int]], rng: random.Random
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(noised ids, masked [B, L] bool, targets at the masked positions), rows of one length."""
    n = rng.randint(recipe.min_len, recipe.config.max_positions)
    rows = []
    for _ in range(recipe.rows):
        if pool and rng.random() < recipe.distill.frac:
            seq = rng.choice(pool)
            start = rng.randint(0, len(seq) - n)
            rows.append(seq[start : start + n])
        else:
            rows.append(tokenizer.encode_words([corpus.BOS, *corpus.code_words(n - 1, rng)]))
    masked = []
    for _ in rows:
        block, rate = rng.randint(1, min(recipe.max_block, n - 1)), 1.0 - rng.random()
        row = [False] * (n - block) + [rng.random() < rate for _ in range(block)]
        if not any(row):
            row[n - block + rng.randrange(block)] = True
        masked.append(row)
    ids, mask = torch.tensor(rows), torch.tensor(masked)
    targets = ids[mask]
    return ids.masked_fill(mask, recipe.config.mask_id), mask, targets


def train(recipe: Recipe, out: Path, command: str = "", log=print) -> TrainRecord:
    t0 = time.time()
    torch.manual_seed(recipe.seed)
    model = TinyDLM(recipe.config)
    with torch.no_grad():  # small embeddings: the tied head starts near uniform
        model.embed.weight.normal_(0.0, 0.02)
        model.pos.weight.normal_(0.0, 0.02)
    pool = distill_pool(recipe.distill, recipe.seed, log) if recipe.distill.frac > 0 else []
    opt = adamw(model, recipe.lr, recipe.weight_decay)
    model.train()
    window: list[tuple[float, float]] = []
    final: dict[str, float] = {}
    for step in range(recipe.steps):
        ids, mask, targets = make_batch(recipe, pool, random.Random(f"{recipe.name}:{recipe.seed}:{step}"))
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, recipe.steps, recipe.lr, recipe.warmup, recipe.min_lr_frac)
        logits = model(ids, mask)
        loss = F.cross_entropy(logits, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        window.append((loss.item(), (logits.argmax(-1) == targets).float().mean().item()))
        if (step + 1) % 50 == 0 or step + 1 == recipe.steps:
            final = {
                "loss": sum(w[0] for w in window) / len(window),
                "masked_token_acc": sum(w[1] for w in window) / len(window),
            }
            log(
                f"step {step + 1}/{recipe.steps} loss {final['loss']:.4f} "
                f"acc {final['masked_token_acc']:.3f} {time.time() - t0:.0f}s"
            )
            window = []
    model.eval()
    save_model(model, out)
    tokenizer.save(out)
    record = TrainRecord(
        recipe=recipe,
        command=command,
        threads=torch.get_num_threads(),
        wall_s=round(time.time() - t0, 1),
        params=sum(p.numel() for p in model.parameters()),
        final=final,
        versions=versions(),
    )
    record.write(out)
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.zoo.dlm", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="output directory (default engine/zoo/models/tiny-dlm)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--steps", type=int, help="override the recipe's steps")
    ap.add_argument("--smoke", action="store_true", help="a tiny model, 3 steps (seconds)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    recipe = SMOKE if args.smoke else RECIPE
    if args.steps is not None:
        if args.steps < 1:
            raise SystemExit("--steps must be >= 1")
        recipe = recipe.model_copy(update={"steps": args.steps})
    out = args.out or ZOO_DIR / recipe.name
    command = "python -m engine.zoo.dlm " + " ".join(argv if argv is not None else sys.argv[1:])
    record = train(recipe, out, command=command.strip(), log=lambda s: print(s, flush=True))
    print(f"wrote {out} ({record.params} parameters, {record.wall_s:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
