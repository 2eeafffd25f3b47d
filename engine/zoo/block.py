"""Train and evaluate `zoo:tiny-block-drafter`, the block drafter (engine/drafters/block.py) on
zoo:tiny-hybrid's features, deterministically on the CPU.

    python -m engine.zoo.block --out engine/zoo/models/tiny-block-drafter   # minutes
    python -m engine.zoo.block --out /tmp/x --smoke                          # seconds: a few steps

Data: the verifier's own greedy continuations (the tokens speculative decoding must reproduce) of code
prompts and of haystack prompts, run once through the verifier with output_hidden_states to record the
features of `target_layers` and its greedy label at every position. Each training row is one sequence
with `anchors` blocks: block a = [token at p_a, MASK x k] at positions p_a..p_a+k attends to the context
features of positions [p_a - window, p_a) and to its own block; row j is trained toward the verifier's
greedy token at p_a + j (cross-entropy weighted exp(-(j - 1) / gamma): early rows decide acceptance).
Then the drafter is evaluated through the engine (speculative_generate, k = 8) and the card written.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict
from transformers import Gemma3ForCausalLM

import engine
from engine.drafters.block.config import BlockConfig
from engine.drafters.block.torch import BlockDrafter, BlockDrafterModel
from engine.models import resolve
from engine.policy import full
from engine.zoo import corpus, tokenizer
from engine.zoo.train import cosine_lr, greedy

VERIFIER = "zoo:tiny-hybrid"


class Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seed: int = 0
    threads: int = 2
    target_layers: list[int] = [2, 4, 6]
    hidden_size: int = 144
    intermediate_size: int = 384
    num_layers: int = 2
    num_heads: int = 4
    head_dim: int = 36
    block_size: int = 8
    window: int = 256
    code_prompt_lens: list[int] = [32, 96]
    code_prompts_per_len: int = 48
    code_new_tokens: int = 96
    haystack_prompt_lens: list[int] = [128]
    haystack_prompts_per_len: int = 16
    haystack_new_tokens: int = 48
    steps: int = 500
    rows_per_step: int = 8
    anchors: int = 16
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.01
    gamma: float = 4.0


def smoke(recipe: Recipe) -> Recipe:
    return recipe.model_copy(
        update={
            "code_prompt_lens": [24],
            "code_prompts_per_len": 8,
            "code_new_tokens": 24,
            "haystack_prompt_lens": [48],
            "haystack_prompts_per_len": 4,
            "haystack_new_tokens": 16,
            "steps": 4,
            "rows_per_step": 2,
            "anchors": 4,
        }
    )


class EvalRecord(BaseModel):
    text: str  # code / haystack
    prompts: int
    prompt_tokens: int
    new_tokens: int
    k: int
    acceptance_length: float  # tokens committed per verifier forward
    position_acceptance: list[float]  # per draft position: fraction of blocks accepting it


class Record(BaseModel):
    recipe: Recipe
    command: str
    wall_s: float
    final_loss: float
    final_row_acc: list[float]  # training-window accuracy per block row 1..k
    torch_version: str
    eval: list[EvalRecord]


# --- data --------------------------------------------------------------------------------------

Group = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # ids [N, T], features [N, T, F], labels [N, T]


def _ids(words_rows: list[list[str]]) -> torch.Tensor:
    return torch.tensor([tokenizer.encode_words([corpus.BOS, *w]) for w in words_rows])


@torch.no_grad()
def collect(verifier: Gemma3ForCausalLM, recipe: Recipe, log) -> list[Group]:
    """Verifier greedy continuations, their features and the verifier's greedy label per position
    (labels[t] = its argmax after position t, i.e. the token it would commit at t + 1)."""
    prompts: list[tuple[torch.Tensor, int]] = []
    for n in recipe.code_prompt_lens:
        texts = corpus.code_prompts(recipe.code_prompts_per_len, seed=recipe.seed + 5000 + n, n_tokens=n)
        prompts.append((_ids([t.split(" ") for t in texts]), recipe.code_new_tokens))
    for n in recipe.haystack_prompt_lens:
        rows = [
            corpus.haystack(n, (i % 5) / 4, seed=recipe.seed + 7000 + i).prompt.split(" ")
            for i in range(recipe.haystack_prompts_per_len)
        ]
        prompts.append((_ids(rows), recipe.haystack_new_tokens))
    groups = []
    for ids, new in prompts:
        full = torch.cat([torch.cat([c, greedy(verifier, c, new, stop=False)], 1) for c in ids.split(32)])
        feats, labels = [], []
        for chunk in full.split(32):
            out = verifier(input_ids=chunk, output_hidden_states=True, use_cache=False)
            feats.append(torch.cat([out.hidden_states[i] for i in recipe.target_layers], -1))
            labels.append(out.logits.argmax(-1))
        groups.append((full, torch.cat(feats), torch.cat(labels)))
        log(f"data: {len(full)} sequences of {full.shape[1]} tokens ({ids.shape[1]} prompt + {new} greedy)")
    return groups


def batch(
    groups: list[Group], recipe: Recipe, rng: random.Random
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of one group: features [B, T, F], block tokens [B, A], positions [B, A*(k+1)],
    labels [B, A, k], mask [B, 1, A*(k+1), T + A*(k+1)]."""
    ids, feats, labels = groups[rng.randrange(len(groups))]
    k, a, w = recipe.block_size, recipe.anchors, recipe.window
    n, t = ids.shape
    rows = rng.sample(range(n), min(recipe.rows_per_step, n))
    anchors = torch.tensor([sorted(rng.sample(range(4, t - k), min(a, t - k - 4))) for _ in rows])
    a = anchors.shape[1]
    r = torch.tensor(rows)[:, None]
    offs = torch.arange(k + 1)
    pos = (anchors[:, :, None] + offs).reshape(len(rows), -1)  # [B, A*(k+1)]
    tok = ids[r, anchors]
    lab = labels[r[:, :, None], anchors[:, :, None] + offs[:-1]]  # label of row j: argmax after p + j - 1
    ctx = torch.arange(t)
    p = anchors.repeat_interleave(k + 1, 1)[:, :, None]  # [B, Q, 1]
    see_ctx = (ctx < p) & (ctx >= p - w)
    blk = torch.arange(a).repeat_interleave(k + 1)
    see_blk = (blk[:, None] == blk[None, :]).expand(len(rows), -1, -1)
    mask = torch.cat((see_ctx, see_blk), -1)[:, None]
    return feats[rows], tok, pos, lab, mask


def loss_of(
    model: BlockDrafterModel, recipe: Recipe, data: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    feats, tok, pos, lab, mask = data
    k = recipe.block_size
    ctx = model.context(feats)
    cpos = torch.arange(feats.shape[1])
    kv = [layer.kv(ctx, cpos) for layer in model.layers]
    x = model.block_input(tok, k).flatten(1, 2)  # [B, A*(k+1), hidden]
    logits = model.logits(x, pos, kv, mask).unflatten(1, (tok.shape[1], k + 1))[:, :, 1:]
    ce = F.cross_entropy(logits.flatten(0, 2), lab.flatten(), reduction="none").view(lab.shape)
    weight = torch.exp(-torch.arange(k) / recipe.gamma)
    loss = (ce * weight).mean((0, 1)).sum() / weight.sum()
    acc = (logits.argmax(-1) == lab).float().mean((0, 1))
    return loss, acc


def init_from_verifier(model: BlockDrafterModel, verifier: Gemma3ForCausalLM) -> None:
    """Start the token embedding and the output head from the verifier's (tied) embedding."""
    emb = verifier.get_input_embeddings().weight
    if emb.shape[1] == model.config.hidden_size:
        with torch.no_grad():
            model.embed.weight.copy_(emb)
            model.lm_head.weight.copy_(emb)


def train(recipe: Recipe, out: Path, command: str, log=print) -> Record:
    torch.set_num_threads(recipe.threads)
    torch.manual_seed(recipe.seed)
    t0 = time.perf_counter()
    vpath = resolve(VERIFIER)
    verifier = Gemma3ForCausalLM.from_pretrained(vpath, dtype=torch.float32).eval()
    vc = verifier.config
    config = BlockConfig(
        verifier=VERIFIER,
        vocab_size=vc.vocab_size,
        target_layers=recipe.target_layers,
        target_hidden_size=vc.hidden_size,
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_layers=recipe.num_layers,
        num_heads=recipe.num_heads,
        head_dim=recipe.head_dim,
        block_size=recipe.block_size,
        window=recipe.window,
    )
    model = BlockDrafterModel(config)
    init_from_verifier(model, verifier)
    groups = collect(verifier, recipe, log)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    model.train()
    window_loss, window_acc = [], []
    for step in range(recipe.steps):
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, recipe.steps, recipe.lr, recipe.warmup, 0.1)
        loss, acc = loss_of(model, recipe, batch(groups, recipe, random.Random(f"{recipe.seed}:{step}")))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        window_loss.append(loss.item())
        window_acc.append(acc)
        if (step + 1) % 100 == 0 or step + 1 == recipe.steps:
            rows = torch.stack(window_acc[-50:]).mean(0).tolist()
            log(
                f"step {step + 1}: loss {sum(window_loss[-50:]) / len(window_loss[-50:]):.3f} "
                f"row acc {' '.join(f'{r:.2f}' for r in rows)}"
            )
    model.eval()
    model.save(out)
    tokenizer.save(out)
    evals = evaluate(BlockDrafter(model), recipe)
    record = Record(
        recipe=recipe,
        command=command,
        wall_s=time.perf_counter() - t0,
        final_loss=sum(window_loss[-50:]) / len(window_loss[-50:]),
        final_row_acc=torch.stack(window_acc[-50:]).mean(0).tolist(),
        torch_version=torch.__version__,
        eval=evals,
    )
    (out / "train_record.json").write_text(record.model_dump_json(indent=2) + "\n")
    (out / "README.md").write_text(card(record))
    return record


# --- evaluation through the engine --------------------------------------------------------------


def evaluate(drafter: BlockDrafter, recipe: Recipe, k: int = 8) -> list[EvalRecord]:
    verifier = engine.load(VERIFIER)
    smoke = recipe.steps < 100
    n_code, n_hay, new = (2, 2, 16) if smoke else (32, 16, 128)
    cases = [
        ("code", [verifier.encode(t) for t in corpus.code_prompts(n_code, seed=10000, n_tokens=96)], 96),
        (
            "haystack",
            [verifier.encode(corpus.haystack(256, (i % 5) / 4, seed=20000 + i).prompt) for i in range(n_hay)],
            256,
        ),
    ]
    out = []
    for text, prompts, plen in cases:
        forwards = committed = 0
        drafted = [0] * k
        accepted = [0] * k
        for ids in prompts:
            gen = engine.speculative_generate(
                verifier.session(full(), max_block=k + 1), drafter, ids, k, engine.Stop(new)
            )
            forwards += gen.forwards
            committed += len(gen.tokens) - 1
            for i, (d, a) in enumerate(zip(gen.position_drafted, gen.position_accepted, strict=True)):
                drafted[i] += d
                accepted[i] += a
        out.append(
            EvalRecord(
                text=text,
                prompts=len(prompts),
                prompt_tokens=plen,
                new_tokens=new,
                k=k,
                acceptance_length=committed / forwards,
                position_acceptance=[a / d if d else 0.0 for a, d in zip(accepted, drafted, strict=True)],
            )
        )
    return out


def card(r: Record) -> str:
    rc = r.recipe
    rows = "\n".join(
        f"| {e.text} | {e.prompts} x {e.prompt_tokens} | {e.new_tokens} | {e.acceptance_length:.2f} | "
        + " ".join(f"{p:.2f}" for p in e.position_acceptance)
        + " |"
        for e in r.eval
    )
    return f"""# tiny-block-drafter

A block drafter (engine/drafters/block.py, DFlash-style) for `{VERIFIER}`: it reads the verifier's hidden
states {rc.target_layers} (0 = embeddings, 6 = after the final norm) of every committed position, projected
into its own cached context K/V, and proposes up to {rc.block_size} tokens in one forward from
[last token, MASK x k]. Not a transformers model: load it with
`engine.drafters.load.load_block_drafter("zoo:tiny-block-drafter")`.

## Architecture

- {rc.num_layers} layers, hidden {rc.hidden_size}, SwiGLU-style MLP {rc.intermediate_size} (gelu-tanh gate),
  {rc.num_heads} heads of {rc.head_dim}, RoPE theta 10000; context window {rc.window} positions
- input projection {len(rc.target_layers)} x 144 -> {rc.hidden_size} (+ RMSNorm); embedding and head
  initialised from the verifier's tied embedding, all trained

## Training

    {r.command}

Seed {rc.seed}, {rc.threads} torch threads, {rc.steps} AdamW steps (lr {rc.lr}, warm-up {rc.warmup}, cosine
to 0.1 x lr, weight decay {rc.weight_decay}), {rc.rows_per_step} sequences x {rc.anchors} blocks per step,
row weights exp(-(j - 1) / {rc.gamma}); wall time {r.wall_s / 60:.1f} min on a shared 2-core CPU (torch
{r.torch_version}). Data: the verifier's greedy continuations ({rc.code_new_tokens} tokens) of
{rc.code_prompts_per_len} code prompts of each length {rc.code_prompt_lens} and ({rc.haystack_new_tokens}
tokens) of {rc.haystack_prompts_per_len} haystack prompts of each length {rc.haystack_prompt_lens}; labels are
the verifier's greedy tokens. Last training window: loss {r.final_loss:.3f}, accuracy per block row
{" ".join(f"{a:.2f}" for a in r.final_row_acc)}.

## Acceptance (through the engine)

`engine.speculative_generate` with the verifier under the full policy, k = 8, greedy (exact output);
code prompts `corpus.code_prompts(n, seed=10000, n_tokens=96)`, haystack prompts
`corpus.haystack(256, depth, seed=20000 + i)`. Acceptance length = tokens committed per verifier
forward; per position i = the fraction of blocks drafting position i whose draft i was accepted.

| text | prompts x tokens | new tokens | acceptance length | acceptance per draft position 1..8 |
|---|---|---:|---:|---|
{rows}

Records: train_record.json.
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.zoo.block", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="directory to write the drafter to")
    ap.add_argument("--smoke", action="store_true", help="a few steps on a little data (seconds)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default 2)")
    args = ap.parse_args(argv)
    recipe = Recipe()
    if args.smoke:
        recipe = smoke(recipe)
    if args.threads:
        recipe = recipe.model_copy(update={"threads": args.threads})
    cmd = "python -m engine.zoo.block " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        train(recipe, args.out, cmd, log=lambda msg: print(msg, flush=True))
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"out": str(args.out)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
