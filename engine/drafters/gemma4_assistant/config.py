"""What Gemma 4's assistant is (config.json model_type "gemma4_assistant") and which of the verifier's
layers it reads; no torch here."""

from __future__ import annotations

from typing import Any

from engine.geometry import FULL_ATTENTION, SLIDING_ATTENTION

MODEL_TYPE = "gemma4_assistant"


def shared_layers(config: Any) -> dict[str, int]:
    """The verifier layers whose K/V the assistant reads, by layer kind: the "store" layers of a config
    with KV-shared layers, else the last layer of each kind."""
    types = list(config.layer_types)
    modes = list(config.kv_sharing_modes)
    stored = {types[i]: i for i, mode in enumerate(modes) if mode == "store"}
    last = {t: i for i, t in enumerate(types)}
    out = stored or last
    if set(out) != {FULL_ATTENTION, SLIDING_ATTENTION}:
        raise ValueError(
            f"Gemma 4's assistant reads one full and one sliding attention layer; this verifier has {set(out)}"
        )
    return out
