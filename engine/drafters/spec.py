"""Which drafter to run, as one value: `DrafterSpec` (no torch or mlx here).

    lookup                          prompt lookup (engine/drafters/lookup)
    model:REF                       a small causal LM sharing the verifier's tokenizer (engine/drafters/model)
    block:REF                       a block drafter on the verifier's hidden states (engine/drafters/block)
    diffusion:REF[:steps=N]         a masked-diffusion drafter, N denoising forwards per block at most
                                    (engine/drafters/diffusion; the zoo's TinyDLM or a DiffusionGemma)
    gemma4-assistant:REF            Gemma 4's assistant on a Gemma 4 verifier (engine/drafters/gemma4_assistant)

REF is a model reference (`zoo:NAME`, a directory, or a NAME under $KAKEYA_MODELS; engine.models.resolve).
`str(spec)` prints the form `parse` reads, every option spelled out (`diffusion:zoo:tiny-dlm:steps=4`), so
`DrafterSpec.parse(str(spec)) == spec`. At the edge (a workload's flag) `parse_drafter` also takes a bare
REF and reads the kind from the model's config.json, and refuses a REF of the wrong kind in one line that
names what it is. `engine.drafters.load.load_drafter` turns a spec into drafters.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, ValidationError

from engine.drafters.block.config import MODEL_TYPE as BLOCK_MODEL_TYPE
from engine.drafters.diffusion.config import GEMMA_MODEL_TYPE as DIFFUSION_GEMMA_MODEL_TYPE
from engine.drafters.diffusion.config import MODEL_TYPE as DIFFUSION_MODEL_TYPE
from engine.drafters.diffusion.config import DiffusionOptions
from engine.drafters.gemma4_assistant.config import MODEL_TYPE as GEMMA4_ASSISTANT_MODEL_TYPE
from engine.models import Backend, ModelNotFoundError, resolve

DrafterKind = Literal["lookup", "model", "block", "diffusion", "gemma4-assistant"]
KINDS: tuple[DrafterKind, ...] = get_args(DrafterKind)

# config.json model_type -> the kind of drafter that model is (any other model_type: a causal LM, `model`)
MODEL_TYPES: dict[str, DrafterKind] = {
    BLOCK_MODEL_TYPE: "block",
    DIFFUSION_MODEL_TYPE: "diffusion",
    DIFFUSION_GEMMA_MODEL_TYPE: "diffusion",
    GEMMA4_ASSISTANT_MODEL_TYPE: "gemma4-assistant",
}

# each kind's spec options (none: the kind takes none)
OPTIONS: dict[DrafterKind, type[BaseModel]] = {"diffusion": DiffusionOptions}

# What the engine cannot run yet, by (kind or model_type, backend), in one place: engine.drafters.load
# refuses it with this line. Every other kind runs on both backends.
NOT_YET: dict[tuple[str, Backend], str] = {
    ("gemma4-assistant", "mlx"): "Gemma 4's assistant runs on the torch backend only (no MLX twin yet)",
    (DIFFUSION_GEMMA_MODEL_TYPE, "mlx"): "DiffusionGemma runs on the torch backend only (mlx-lm has none)",
}

# How each kind proposes under speculative sampling (engine/sampling.py's rule), in one place:
# "distribution": it draws its drafts from its own distribution and returns it (q; engine.speculative's
# `SamplingDrafter`: the model drafter and Gemma 4's assistant, draft by draft; the block drafter, every row
# of its one block forward; the diffusion drafter, its denoising steps unmasking left to right);
# "deterministic": it proposes as under greedy decoding (prompt lookup) and counts as q = one-hot,
# accepting a draft with the verifier's own probability of it. tests/engine/test_sampling.py checks the
# loaded drafters agree.
PROPOSALS: dict[DrafterKind, Literal["distribution", "deterministic"]] = {
    "lookup": "deterministic",
    "model": "distribution",
    "block": "distribution",
    "diffusion": "distribution",
    "gemma4-assistant": "distribution",
}

_OPTION = re.compile(r"([a-z_]+)=([^:=]*)")
USAGE = "lookup, model:REF, block:REF, diffusion:REF[:steps=N] or gemma4-assistant:REF"


@dataclass(frozen=True)
class DrafterSpec:
    kind: DrafterKind
    ref: str = ""  # the model reference ("" for lookup)
    options: tuple[tuple[str, int], ...] = field(default=())  # every option of the kind, in field order

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown drafter kind {self.kind!r}: use {USAGE}")
        if (self.kind == "lookup") != (not self.ref):
            raise ValueError(
                "lookup takes no model reference"
                if self.ref
                else f"{self.kind} needs a model: {self.kind}:REF"
            )
        schema = OPTIONS.get(self.kind)
        given = dict(self.options)
        if schema is None:
            if given:
                raise ValueError(f"{self.kind} takes no options (got {', '.join(given)})")
            return
        try:
            full = schema.model_validate(given).model_dump()
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise ValueError(f"{self.kind} option {where}: {err['msg']}") from None
        object.__setattr__(self, "options", tuple(full.items()))

    @classmethod
    def parse(cls, text: str) -> DrafterSpec:
        """`KIND[:REF][:key=value...]` (the form `str` prints); a ValueError naming the grammar otherwise."""
        parts = text.strip().split(":")
        kind, rest = parts[0], parts[1:]
        if kind not in KINDS:
            raise ValueError(f"bad drafter {text!r}: start with a kind ({USAGE})")
        options: dict[str, int] = {}
        while rest and (m := _OPTION.fullmatch(rest[-1])):
            name, value = m.groups()
            if name in options:
                raise ValueError(f"bad drafter {text!r}: option {name} given twice")
            try:
                options[name] = int(value)
            except ValueError:
                raise ValueError(f"bad drafter {text!r}: option {name} takes a whole number") from None
            rest.pop()
        try:
            return cls(kind, ":".join(rest), tuple(reversed(options.items())))  # type: ignore[arg-type]
        except ValueError as exc:
            raise ValueError(f"bad drafter {text!r}: {exc}") from None

    def __str__(self) -> str:
        return ":".join(
            [self.kind, *([self.ref] if self.ref else []), *(f"{k}={v}" for k, v in self.options)]
        )

    def option(self, name: str) -> int:
        return dict(self.options)[name]

    def path(self) -> Path:
        """The model directory of `ref`, checked to hold a drafter of this kind (`check_kind`)."""
        path = resolve(self.ref)
        check_kind(self, path)
        return path


def model_type(path: Path) -> str:
    try:
        return str(json.loads((path / "config.json").read_text()).get("model_type", ""))
    except (OSError, ValueError, AttributeError):
        return ""


def kind_of(path: Path) -> DrafterKind:
    """The kind of drafter a model directory holds, by its config.json's model_type."""
    return MODEL_TYPES.get(model_type(path), "model")


def check_kind(spec: DrafterSpec, path: Path) -> None:
    """Refuse, in one line naming what it is, a model that is not a drafter of the spec's kind."""
    actual = kind_of(path)
    if actual != spec.kind:
        what = "a causal LM; " if actual == "model" else ""
        raise ValueError(
            f"{spec.ref} is a {actual} drafter ({what}config.json model_type {model_type(path) or 'missing'!r}), "
            f"not a {spec.kind} drafter: use {actual}:{spec.ref}"
        )


def parse_drafter(text: str) -> DrafterSpec:
    """A workload's drafter flag: a spec (`DrafterSpec.parse`), or a bare model reference whose kind its
    config.json says (`zoo:tiny-dlm` is `diffusion:zoo:tiny-dlm:steps=4`); a model reference is checked to
    be of its kind. ValueError (one line) otherwise."""
    text = text.strip()
    try:
        spec = (
            DrafterSpec.parse(text)
            if text.split(":", 1)[0] in KINDS
            else DrafterSpec(kind_of(resolve(text)), text)
        )
        if spec.ref:
            spec.path()
    except ModelNotFoundError as exc:
        raise ValueError(f"drafter {text!r}: {exc}") from None
    return spec
