"""A transformers DiffusionGemma (`DiffusionGemmaForBlockDiffusion`) as the masked-diffusion drafter's model.

Its encoder reads the committed tail (filling a K/V cache that this model drops after the forward,
so nothing is held between blocks) and its decoder denoises the block bidirectionally as the
"canvas". DiffusionGemma has no mask token (its own sampler renoises slots with random tokens); a
still-masked slot is fed as `filler` (the pad token) so that proposals are deterministic. The LM head
and the final soft-capping run on the masked slots only. Torch only (mlx-lm has no DiffusionGemma).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import DiffusionGemmaForBlockDiffusion

from engine.drafters.diffusion.config import DiffusionConfig


class DiffusionGemmaModel:
    """`DiffusionModel` (engine/drafters/diffusion/drafter.py) over a `DiffusionGemmaForBlockDiffusion` (one batch row)."""

    def __init__(self, model: Any, context: int = 64) -> None:
        tc = model.config.text_config
        self.model = model.eval()
        self.filler = tc.pad_token_id if tc.pad_token_id is not None else 0
        self.config = DiffusionConfig(
            vocab_size=tc.vocab_size,
            hidden=tc.hidden_size,
            layers=tc.num_hidden_layers,
            heads=tc.num_attention_heads,
            intermediate=tc.intermediate_size,
            max_positions=context + model.config.canvas_length,
            context=context,
        )

    @torch.inference_mode()
    def masked_logits(self, context: Sequence[int], block: Sequence[int], masked: Sequence[int]) -> Any:
        """The logits [len(masked), vocab] of one forward at the masked slots (soft-capped as the model's)."""
        canvas = [self.filler if t == self.config.mask_id else t for t in block]
        out = self.model.model(
            input_ids=torch.tensor([list(context)]), decoder_input_ids=torch.tensor([canvas])
        )
        logits = self.model.lm_head(out.last_hidden_state[0, list(masked)]).float()
        cap = self.model.final_logit_softcapping
        return torch.tanh(logits / cap) * cap if cap else logits

    @torch.inference_mode()
    def predict(
        self, context: Sequence[int], block: Sequence[int], masked: Sequence[int]
    ) -> tuple[list[int], list[float]]:
        conf, tokens = self.masked_logits(context, block, masked).softmax(-1).max(-1)
        return tokens.tolist(), conf.tolist()


def load_model(path: Path, context: int = 64) -> DiffusionGemmaModel:
    """A DiffusionGemma directory (config model_type "diffusion_gemma") as the drafter's model, on the cpu
    in its stored dtype (transformers)."""
    return DiffusionGemmaModel(DiffusionGemmaForBlockDiffusion.from_pretrained(str(path)), context)
