"""Measure a zoo verifier's needle recall and a drafter's acceptance, with plain transformers.

    python -m engine.zoo.evaluate --model tiny-hybrid --drafter tiny-drafter
    python -m engine.zoo.evaluate --model tiny-hybrid --drafter tiny-drafter --write   # + cards

Recall: exact match of greedy decoding (full cache) after `corpus.haystack` prompts, per context
length x needle depth. Acceptance: on `corpus.code_prompts`, the verifier decodes greedily; the
drafter, fed the same tokens, proposes its argmax at every position; a block of k proposals is
accepted up to the first disagreement, and each verifier forward commits the accepted tokens plus
one of its own. `--write` stores eval_record.json in each model directory and renders README.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel
from transformers import AutoModelForCausalLM, PreTrainedModel

from engine.zoo import corpus, tokenizer
from engine.zoo.train import TrainRecord, greedy, model_dir

DEPTHS = [0.0, 0.25, 0.5, 0.75, 1.0]


class RecallCell(BaseModel):
    context: int
    depth: float
    distractors: int = 0  # other key/value needles in the haystack
    samples: int
    correct: int

    @property
    def recall(self) -> float:
        return self.correct / self.samples


class Acceptance(BaseModel):
    verifier: str
    drafter: str
    prompts: int
    prompt_tokens: int
    new_tokens: int
    seed: int
    token_agreement: float  # drafter argmax == verifier greedy token, over all positions
    tokens_per_verify: dict[int, float]  # block size k -> committed tokens per verifier forward
    mean_accepted: dict[int, float]  # block size k -> accepted draft tokens per block


class EvalRecord(BaseModel):
    model: str
    command: str
    threads: int
    wall_s: float
    seed: int
    recall: list[RecallCell]
    acceptance: Acceptance | None = None


def load(path: Path) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def needle_recall(
    model: PreTrainedModel,
    contexts: list[int],
    depths: list[float],
    samples: int,
    seed: int,
    n_distractors: int = 0,
) -> list[RecallCell]:
    """Exact-match recall per (context, depth) with `samples` haystacks each (seeds seed..)."""
    cells = []
    for n in contexts:
        for depth in depths:
            needles = [corpus.haystack(n, depth, seed + i, n_distractors) for i in range(samples)]
            ids = torch.tensor(
                [tokenizer.encode_words([corpus.BOS, *nd.prompt.split(" ")]) for nd in needles]
            )
            rows = max(1, 16384 // n)
            outs = torch.cat([greedy(model, chunk, corpus.NEEDLE_DIGITS + 1) for chunk in ids.split(rows)])
            correct = sum(
                nd.matches(" ".join(corpus.VOCAB[t] for t in out.tolist()))
                for nd, out in zip(needles, outs, strict=True)
            )
            cells.append(
                RecallCell(
                    context=n, depth=depth, distractors=n_distractors, samples=samples, correct=correct
                )
            )
    return cells


@torch.no_grad()
def acceptance(
    verifier: PreTrainedModel,
    drafter: PreTrainedModel,
    prompts: int,
    prompt_tokens: int,
    new_tokens: int,
    seed: int,
    blocks: tuple[int, ...] = (2, 4, 8),
) -> tuple[float, dict[int, float], dict[int, float]]:
    texts = corpus.code_prompts(prompts, seed, prompt_tokens)
    ids = torch.tensor([tokenizer.encode_words([corpus.BOS, *t.split(" ")]) for t in texts])
    cont = greedy(verifier, ids, new_tokens, stop=False)
    full = torch.cat([ids, cont], dim=1)
    guess = drafter(input_ids=full).logits[:, prompt_tokens - 1 : -1].argmax(-1)
    agree = (guess == cont).tolist()
    per_verify: dict[int, float] = {}
    accepted: dict[int, float] = {}
    for k in blocks:
        forwards = acc = 0
        for row in agree:
            t = 0
            while t < len(row):
                n = 0
                while n < k and t + n < len(row) and row[t + n]:
                    n += 1
                forwards += 1
                acc += n
                t += n + 1
        per_verify[k] = len(agree) * len(agree[0]) / forwards
        accepted[k] = acc / forwards
    rate = sum(map(sum, agree)) / (len(agree) * len(agree[0]))
    return rate, per_verify, accepted


def recall_table(cells: list[RecallCell]) -> str:
    """Markdown: one row per (distractors, context), one column per depth."""
    depths = sorted({c.depth for c in cells})
    by = {(c.distractors, c.context, c.depth): c for c in cells}
    lines = [
        "| distractors | context | " + " | ".join(f"depth {d:.0%}" for d in depths) + " | all |",
        "|---:|---:|" + "---:|" * (len(depths) + 1),
    ]
    for nd, n in sorted({(c.distractors, c.context) for c in cells}):
        row = [by[(nd, n, d)] for d in depths]
        total = sum(c.correct for c in row) / sum(c.samples for c in row)
        lines.append(f"| {nd} | {n} | " + " | ".join(f"{c.recall:.2f}" for c in row) + f" | {total:.2f} |")
    return "\n".join(lines)


def render_card(directory: Path) -> str:
    """README.md of a zoo model from its config, train_record.json and eval_record.json."""
    cfg = json.loads((directory / "config.json").read_text())
    tr = TrainRecord.model_validate_json((directory / "train_record.json").read_text())
    ev_path = directory / "eval_record.json"
    ev = EvalRecord.model_validate_json(ev_path.read_text()) if ev_path.is_file() else None
    out = [*_architecture(directory, cfg, tr), *_training(tr)]
    if ev and ev.recall:
        out += _recall(ev)
    if ev and ev.acceptance:
        out += _acceptance(ev.acceptance, ev.command)
    return "\n".join([*out, *_use(directory, ev)])


def _architecture(directory: Path, cfg: dict[str, Any], tr: TrainRecord) -> list[str]:
    kinds = ", ".join("S" if t == "sliding_attention" else "F" for t in cfg["layer_types"])
    return [
        f"# {directory.name}",
        "",
        "A tiny model of the Kakeya model zoo, trained on the CPU from scratch on the synthetic corpus of "
        "`engine/zoo/corpus.py` (needle-in-a-haystack retrieval and short code-like text). "
        "It is an ordinary Hugging Face model directory (`Gemma3ForCausalLM`, float32 safetensors, a "
        "WordLevel tokenizer) that `transformers` and `mlx_lm.load` both load by path. "
        "This card is generated by `python -m engine.zoo.evaluate ... --write`; every number below "
        "comes from the records next to it (train_record.json, eval_record.json).",
        "",
        "## Architecture",
        "",
        f"- {tr.params:,} parameters, float32, tied embeddings, vocabulary {cfg['vocab_size']} words",
        f"- {cfg['num_hidden_layers']} layer{'s' if cfg['num_hidden_layers'] > 1 else ''} ({kinds}; S = sliding window {cfg['sliding_window']}, "
        f"F = full attention; mlx-lm `sliding_window_pattern` = {cfg['sliding_window_pattern']})",
        f"- hidden {cfg['hidden_size']}, MLP {cfg['intermediate_size']}, {cfg['num_attention_heads']} query "
        f"heads / {cfg['num_key_value_heads']} K/V heads of {cfg['head_dim']}",
        f"- RoPE theta {cfg['rope_theta']:g} (full layers) / {cfg['rope_local_base_freq']:g} (sliding layers); "
        "no logit soft-capping",
        "",
    ]


def _training(tr: TrainRecord) -> list[str]:
    r = tr.recipe
    out = [
        "## Training",
        "",
        f"    {tr.command}",
        "",
        "(`--out` only chooses where the directory is written; its default is engine/zoo/models/NAME.) "
        f"Seed {r.seed}, {tr.threads} torch threads, {tr.steps} AdamW steps (lr {r.lr:g}, warm-up {r.warmup}, "
        f"cosine to {r.min_lr_frac:g} x lr, weight decay {r.weight_decay:g}), wall time {tr.wall_s / 60:.1f} min "
        f"on a shared 2-core CPU ({', '.join(f'{k} {v}' for k, v in tr.versions.items())}).",
        "",
        "| phase | steps | context tokens | tokens/step | code rows | needles per haystack row |",
        "|---:|---:|---|---:|---:|---:|",
        *[
            f"| {i} | {p.steps} | {p.min_len}-{p.max_len} | {p.tokens_per_step} | {p.code_frac:.0%} | "
            f"{'' if p.max_needles == 1 else '1-'}{p.max_needles} |"
            for i, p in enumerate(r.phases)
        ],
        "",
        "Haystack rows (`corpus.training_haystack`) hold needles `kN : d d d d .` at random sentence "
        "boundaries (at most one per 30 tokens) and queries `? kN : d d d d <eos>` for some of them at the "
        "end; code rows are `corpus.code_words`. The loss is the mean "
        f"cross-entropy over answer digits and their <eos> plus {r.lm_weight:g} x the mean over all other "
        "tokens.",
    ]
    if r.distill:
        d = r.distill
        out += [
            "",
            f"Distillation: {d.frac:.0%} of steps use rows of `{d.verifier}`'s greedy continuations "
            f"({d.new_tokens} tokens) of {d.prompts_per_len} code prompts of each length {d.prompt_lens}.",
        ]
    out += [
        "",
        "Last logged training window: " + ", ".join(f"{k} {v:.3f}" for k, v in tr.final.items()) + ".",
    ]
    return out


def _recall(ev: EvalRecord) -> list[str]:
    n = ev.recall[0].samples
    out = [
        "",
        "## Needle recall",
        "",
        f"    {ev.command}",
        "",
        f"Exact match of the 4 answer digits, plain transformers greedy decoding with the full cache, "
        f"{n} haystacks per cell (`corpus.haystack(context, depth, seed, n_distractors)`, "
        f"seeds {ev.seed}-{ev.seed + n - 1}):",
        "",
        recall_table(ev.recall),
    ]
    crowded = [c for c in ev.recall if c.distractors]
    if crowded:
        rate = sum(c.correct for c in crowded) / sum(c.samples for c in crowded)
        if rate < 0.9:
            out += [
                "",
                f"With distractor needles (other keys and values) in the haystack recall is {rate:.2f}: "
                "the model often answers with another needle's value, i.e. it does not reliably select "
                "a needle by its key. The workloads use haystacks without distractors.",
            ]
    return out


def _acceptance(a: Acceptance, command: str) -> list[str]:
    return [
        "",
        "## Drafter acceptance",
        "",
        f"    {command}",
        "",
        f"`{a.drafter}` drafting for `{a.verifier}` on {a.prompts} code prompts "
        f"(`corpus.code_prompts({a.prompts}, seed={a.seed}, n_tokens={a.prompt_tokens})`), "
        f"{a.new_tokens} greedy tokens each: the drafter's argmax equals the verifier's greedy token "
        f"at {a.token_agreement:.1%} of positions.",
        "",
        "| block k | accepted drafts per block | tokens per verifier forward |",
        "|---:|---:|---:|",
        *[f"| {k} | {a.mean_accepted[k]:.2f} | {a.tokens_per_verify[k]:.2f} |" for k in a.tokens_per_verify],
    ]


def _use(directory: Path, ev: EvalRecord | None) -> list[str]:
    out = [
        "",
        "## Use",
        "",
        "    from transformers import AutoModelForCausalLM, AutoTokenizer",
        "    from engine.zoo import corpus",
        f'    path = "engine/zoo/models/{directory.name}"',
        "    tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)",
    ]
    if ev and ev.recall:
        out += [
            "    nd = corpus.haystack(n_tokens=512, depth=0.5, seed=0)",
            '    ids = tok(nd.prompt, return_tensors="pt").input_ids',
            "    out = model.generate(ids, max_new_tokens=5, do_sample=False)",
            "    assert nd.matches(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))",
            "",
        ]
    else:
        out += [
            '    ids = tok(corpus.code_prompts(1, seed=0)[0], return_tensors="pt").input_ids',
            "    out = model.generate(ids, max_new_tokens=32, do_sample=False)",
            "    print(tok.decode(out[0, ids.shape[1]:]))",
            "",
        ]
    return out


def write_card(directory: Path) -> None:
    (directory / "README.md").write_text(render_card(directory))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.zoo.evaluate", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-hybrid", help="verifier: zoo name or directory")
    ap.add_argument("--drafter", help="drafter: zoo name or directory (measures acceptance)")
    ap.add_argument("--contexts", default="256,512,1024,2048")
    ap.add_argument("--depths", default=",".join(str(d) for d in DEPTHS))
    ap.add_argument("--samples", type=int, default=20, help="haystacks per context x depth")
    ap.add_argument("--seed", type=int, default=10_000)
    ap.add_argument("--distractors", default="0", help="comma list: other key/value needles per haystack")
    ap.add_argument("--prompts", type=int, default=32, help="code prompts for acceptance")
    ap.add_argument("--prompt-tokens", type=int, default=96)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--write", action="store_true", help="write eval_record.json and README.md cards")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.time()
    vdir = model_dir(args.model)
    verifier = load(vdir)
    cells = [
        cell
        for nd in args.distractors.split(",")
        for cell in needle_recall(
            verifier,
            [int(c) for c in args.contexts.split(",")],
            [float(d) for d in args.depths.split(",")],
            args.samples,
            args.seed,
            int(nd),
        )
    ]
    print(f"needle recall of {vdir.name} (exact match, greedy, full cache, {args.samples} samples per cell)")
    print(recall_table(cells))
    acc = None
    if args.drafter:
        ddir = model_dir(args.drafter)
        rate, per_verify, accepted = acceptance(
            verifier, load(ddir), args.prompts, args.prompt_tokens, args.new_tokens, args.seed
        )
        acc = Acceptance(
            verifier=vdir.name,
            drafter=ddir.name,
            prompts=args.prompts,
            prompt_tokens=args.prompt_tokens,
            new_tokens=args.new_tokens,
            seed=args.seed,
            token_agreement=rate,
            tokens_per_verify=per_verify,
            mean_accepted=accepted,
        )
        print(
            f"drafter {ddir.name} vs {vdir.name} on {args.prompts} code prompts: token agreement {rate:.3f}; "
            + ", ".join(f"k={k}: {per_verify[k]:.2f} tokens/verify" for k in per_verify)
        )
    command = "python -m engine.zoo.evaluate " + " ".join(argv if argv is not None else sys.argv[1:])
    record = EvalRecord(
        model=vdir.name,
        command=command,
        threads=torch.get_num_threads(),
        wall_s=round(time.time() - t0, 1),
        seed=args.seed,
        recall=cells,
        acceptance=acc,
    )
    print(f"{record.wall_s:.0f} s")
    if args.write:
        (vdir / "eval_record.json").write_text(record.model_dump_json(indent=2) + "\n")
        write_card(vdir)
        if acc:
            drec = record.model_copy(update={"model": ddir.name, "recall": []})
            (ddir / "eval_record.json").write_text(drec.model_dump_json(indent=2) + "\n")
            write_card(ddir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
