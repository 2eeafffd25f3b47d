"""The support matrix, generated from transformers itself (issue 32): every causal-LM model type
transformers ships (`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`) built as a tiny random model from its own config
class, then checked on the torch backend for

    greedy       `engine.generate` under `full` == transformers `generate` (greedy)
    hybrid       under a covering `hybrid` policy (window past the sequence) == `generate`
    speculative  speculative decoding after the window wraps (sink_window, a narrower copy of the model
                 as drafter, blocks partly rejected) == greedy under the same policy

each recorded as `exact`, `refused: <the one-line reason given at load>` or `broken: <what went wrong>`; a
type that cannot be built small (or needs what is not installed) is `skipped` with the reason.

    python -m tests.engine.model_matrix            # print the matrix
    python -m tests.engine.model_matrix --write    # write docs/models.md and tests/engine/model_matrix.json

tests/engine/test_model_matrix.py checks the committed expectation: a family that drops (exact ->
refused -> broken) fails it. Tiny means: hidden 64, 4 layers, 4 heads, vocabulary 256, 12 prompt tokens.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict

import engine
from engine.backends.torch.session import TorchModel
from engine.policy import Policy, hybrid, sink_window
from tests.engine.tiny_models import VOCAB, hf_greedy, prompt

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = Path(__file__).with_name("model_matrix.json")
DOC = ROOT / "docs" / "models.md"
COLUMNS = ("greedy", "hybrid", "speculative")
PROMPT, NEW = 12, 12
WRAPS = sink_window(2, 8)  # PROMPT + NEW > 2 + 8: the window wraps during decoding
K = 3

# Every config gets these where it has such a field (under its own name, via attribute_map).
TINY: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "initializer_range": 0.2,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": None,
    "tie_word_embeddings": False,
    "is_decoder": True,  # BERT-style models are causal LMs only as decoders
    # encoder-decoder families (BART, Pegasus, Marian, ...) used as decoders: num_hidden_layers and
    # num_attention_heads name the encoder's (attribute_map), the decoder's are their own fields
    "decoder_layers": 4,
    "decoder_attention_heads": 4,
    "decoder_ffn_dim": 128,
    "encoder_ffn_dim": 128,
    "rotary_dim": 8,  # partial rotary (GPT-J, CodeGen): within the head
    # mixture of experts: few and small
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "n_group": 1,
    "topk_group": 1,
    # multi-head latent attention
    "kv_lora_rank": 16,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 8,
    # linear attention / state-space mixers
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "mamba_n_heads": 4,
    "mamba_d_head": 32,  # heads x head = expand x hidden
    "mamba_expand": 2,
    "mamba_d_ssm": 128,
    "mamba_d_state": 16,
    "mamba_n_groups": 1,
    "mamba_num_heads": 4,
    "mamba_head_dim": 32,
    "ssm_state_size": 16,
    "mamba_chunk_size": 16,
    "sliding_window": 64,
    "default_language": "en_XX",  # X-MOD: the language adapter a forward uses
}

# Per type: what its defaults need to be a hybrid at 4 layers (attention beside the Mamba-2 layers).
PER_TYPE: dict[str, dict[str, Any]] = {
    "bamba": {"attn_layer_indices": [1, 3]},
    "granitemoehybrid": {"layer_types": ["mamba", "mamba", "mamba", "attention"]},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2},
    "nemotron_h": {"n_groups": 1},
    "zamba": {"layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"], "n_mamba_heads": 2},
    "zamba2": {"layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"], "n_mamba_heads": 4},
}
MAX_PARAMETERS = 10_000_000


class TooBig(Exception):
    pass


Status = str  # "exact" | "refused: ..." | "broken: ..."


class Family(BaseModel):
    model_config = ConfigDict(extra="forbid")
    architecture: str
    skipped: str | None = None
    greedy: Status | None = None
    hybrid: Status | None = None
    speculative: Status | None = None


class Matrix(BaseModel):
    model_config = ConfigDict(extra="forbid")
    transformers: str
    families: dict[str, Family]

    def counts(self) -> dict[str, int]:
        """Families by their worst column: exact, refused, broken (and skipped)."""
        out = dict.fromkeys(("exact", "refused", "broken", "skipped"), 0)
        for f in self.families.values():
            out["skipped" if f.skipped else worst(f)] += 1
        return out


RANK = {"broken": 0, "refused": 1, "exact": 2}


def kind(status: Status | None) -> Literal["exact", "refused", "broken"]:
    head = (status or "broken").split(":", 1)[0]
    return head if head in RANK else "broken"  # type: ignore[return-value]


def worst(f: Family) -> str:
    return min((kind(getattr(f, c)) for c in COLUMNS), key=RANK.__getitem__)


def drops(expected: Family, got: Family) -> list[str]:
    """The columns where `got` is worse than `expected` (exact -> refused -> broken), each as one line. A
    family expected skipped (it could not be built small) has nothing to drop."""
    if expected.skipped:
        return []
    if got.skipped:
        return [f"could be built before, now skipped: {got.skipped}"]
    out = []
    for c in COLUMNS:
        was, now = getattr(expected, c), getattr(got, c)
        if RANK[kind(now)] < RANK[kind(was)]:
            out.append(f"{c}: was {was!r}, now {now!r}")
    return out


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:160]}"


def tiny_config(model_type: str) -> Any:
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    mapped = getattr(cls, "attribute_map", {}) or {}
    given = {mapped.get(k, k): v for k, v in TINY.items() if mapped.get(k, k) in fields}
    given.update(PER_TYPE.get(model_type, {}))
    if "kv_lora_rank" in fields:  # MLA expands the latent to every attention head: no K/V head groups
        given.pop(mapped.get("num_key_value_heads", "num_key_value_heads"), None)
    subs = getattr(cls, "sub_configs", {}) or {}
    if "text_config" in subs:  # a multimodal wrapper: the text model tiny, the rest left as it is
        text_cls = subs["text_config"]
        if isinstance(text_cls, type) and dataclasses.is_dataclass(text_cls):
            tf = {f.name for f in dataclasses.fields(text_cls)}
            tmap = getattr(text_cls, "attribute_map", {}) or {}
            given["text_config"] = {tmap.get(k, k): v for k, v in TINY.items() if tmap.get(k, k) in tf}
    return cls(**given)


def build(model_type: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    config = tiny_config(model_type)
    with torch.device("meta"):  # counted before anything is allocated
        size = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    if size > MAX_PARAMETERS:
        raise TooBig(f"{size / 1e6:.0f}M parameters at the tiny sizes (parts the tiny keys do not reach)")
    torch.manual_seed(0)
    try:
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    except ValueError:  # a model without sdpa (MPT, ...): eager
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model.generation_config.eos_token_id = None
    model.generation_config.forced_eos_token_id = None  # BART-style: the last new token forced to EOS
    return model.float().eval()


def check(model_type: str, architecture: str) -> Family:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module = build(model_type)
    except TooBig as exc:
        return Family(architecture=architecture, skipped=f"cannot build small: {exc}")
    except Exception as exc:  # noqa: BLE001 - any failure to build small is a skip, with its reason
        return Family(architecture=architecture, skipped=f"cannot build small: {one_line(exc)}")
    try:
        tm = TorchModel(module)
    except Exception as exc:  # noqa: BLE001 - the one-line refusal at load (UnsupportedModelError), or not
        reason = failed(exc, "at load: ")
        return Family(architecture=architecture, greedy=reason, hybrid=reason, speculative=reason)
    ids = prompt(PROMPT, seed=1)
    try:
        oracle: list[int] | None = hf_greedy(tm, ids, NEW)
        oracle_error = ""
    except Exception as exc:  # noqa: BLE001
        oracle, oracle_error = None, one_line(exc)
    out = {}
    for column, policy in (("greedy", engine.full()), ("hybrid", hybrid(4, 256))):
        if oracle is None:
            out[column] = f"broken: transformers generate fails: {oracle_error}"
            continue
        out[column] = _compare(lambda p=policy: _greedy(tm, p, ids), oracle, "generate")
    out["speculative"] = _speculative(tm, ids)
    return Family(architecture=architecture, **out)


def _greedy(tm: TorchModel, policy: Policy, ids: list[int]) -> list[int]:
    return engine.generate(tm.session(policy, prefill_chunk=8), ids, engine.Stop(NEW)).tokens


def failed(exc: BaseException, where: str = "") -> Status:
    """`refused: ...` for a ValueError the engine raised itself (a check, one line); else `broken: ...`."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    engine_dir = str(ROOT / "engine")
    if (
        isinstance(exc, ValueError)
        and tb is not None
        and tb.tb_frame.f_code.co_filename.startswith(engine_dir)
    ):
        return f"refused: {' '.join(str(exc).split())[:200]}"
    return f"broken: {where}{one_line(exc)}"


def _compare(run: Any, oracle: list[int], what: str) -> Status:
    try:
        ours = run()
    except Exception as exc:  # noqa: BLE001
        return failed(exc)
    if ours == oracle:
        return "exact"
    at = next((i for i, (a, b) in enumerate(zip(ours, oracle, strict=False)) if a != b), len(ours))
    return f"broken: differs from {what} at token {at}"


def _speculative(tm: TorchModel, ids: list[int]) -> Status:
    try:
        greedy = _greedy(tm, WRAPS, ids)
    except Exception as exc:  # noqa: BLE001
        return failed(exc, f"greedy under {WRAPS}: ")

    def run() -> list[int]:
        drafter = engine.ModelDrafter(tm.session(sink_window(1, 3), max_block=K + 1))
        verifier = tm.session(WRAPS, max_block=K + 1, prefill_chunk=8)
        return engine.speculative_generate(verifier, drafter, ids, K, engine.Stop(NEW)).tokens

    return _compare(run, greedy, "greedy")


def walk(types: list[str] | None = None) -> Matrix:
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    torch.set_num_threads(1)
    names = dict(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    families = {}
    for model_type in types or sorted(names):
        if model_type not in names:
            continue
        t0 = time.monotonic()
        families[model_type] = check(model_type, names[model_type])
        print(f"{model_type:28s} {time.monotonic() - t0:5.1f}s {_row(families[model_type])}", file=sys.stderr)
    return Matrix(transformers=transformers.__version__, families=families)


def _row(f: Family) -> str:
    if f.skipped:
        return f"skipped ({f.skipped})"
    return " | ".join(f"{c}: {getattr(f, c)}" for c in COLUMNS)


def markdown(m: Matrix) -> str:
    c = m.counts()
    lines = [
        "# Model families: what the engine decodes exactly",
        "",
        "Generated by `python -m tests.engine.model_matrix --write` from transformers "
        f"{m.transformers} (do not edit by hand). Every causal-LM model type transformers ships, built as a tiny "
        "random model from its own config class (hidden 64, 4 layers, vocabulary 256), on the torch backend:",
        "",
        "- **greedy**: `engine.generate` under `full` equals transformers `generate` (greedy);",
        "- **hybrid**: under a covering `hybrid` policy, equals `generate`;",
        f"- **speculative**: speculative decoding (k={K}, a narrower copy of the model drafting) under "
        f"`{WRAPS}` after the window wraps equals greedy under the same policy.",
        "",
        "`refused` is the one line the engine gives at load; `broken` is a failure or a difference (to fix).",
        "",
        f"Families by their worst column: **{c['exact']} exact, {c['refused']} refused, {c['broken']} broken**, "
        f"{c['skipped']} skipped (cannot be built small here).",
        "",
        "| model type | greedy | hybrid | speculative |",
        "|---|---|---|---|",
    ]
    for name, f in m.families.items():
        if f.skipped:
            continue
        cells = [(getattr(f, col) or "").replace("|", "/") for col in COLUMNS]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    lines += ["", "Skipped:", ""]
    lines += [f"- `{name}`: {f.skipped}" for name, f in m.families.items() if f.skipped]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write docs/models.md and the expectation file")
    parser.add_argument("types", nargs="*", help="model types (default: all)")
    args = parser.parse_args(argv)
    m = walk(args.types or None)
    if args.write:
        if args.types:
            parser.error("--write takes the whole walk (no model types)")
        EXPECTED.write_text(m.model_dump_json(indent=1, exclude_none=True) + "\n")
        DOC.write_text(markdown(m))
    print(m.counts())
    return 0


if __name__ == "__main__":
    sys.exit(main())
