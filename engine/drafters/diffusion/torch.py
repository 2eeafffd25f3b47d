"""The masked-diffusion drafter's model in PyTorch (training and drafting); see drafter.py."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from engine.drafters.diffusion.config import DiffusionConfig, build_block, build_model


class Block(nn.Module):
    def __init__(self, cfg: DiffusionConfig) -> None:
        super().__init__()
        build_block(self, nn, cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v)  # bidirectional: no mask
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Head(nn.Module):
    """The LM head, tied to the token embedding; a module so that what it is fed can be observed."""

    def forward(self, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.linear(h, weight)


class TinyDLM(nn.Module):
    def __init__(self, cfg: DiffusionConfig) -> None:
        super().__init__()
        build_model(self, nn, cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.head = Head()

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """[B, L] ids -> [B, L, hidden] final-normed states."""
        self.config.check_positions(ids.shape[1])
        x = self.embed(ids) + self.pos.weight[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Logits over the real vocabulary (never the mask token) for the states given."""
        return self.head(h, self.embed.weight[: self.config.vocab_size])

    def forward(self, ids: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        """Logits at the masked positions only: [masked.sum(), vocab] for a boolean [B, L] `masked`."""
        return self.logits(self.hidden(ids)[masked])


class TorchDiffusionModel:
    """`DiffusionModel` (engine/drafters/diffusion/drafter.py) over a TinyDLM."""

    def __init__(self, model: TinyDLM) -> None:
        self.model = model.eval()
        self.config = model.config

    @torch.inference_mode()
    def masked_logits(self, context: Sequence[int], block: Sequence[int], masked: Sequence[int]) -> Any:
        """The logits [len(masked), vocab] of one forward at the masked slots."""
        h = self.model.hidden(torch.tensor([[*context, *block]]))[0, [len(context) + i for i in masked]]
        return self.model.logits(h)

    @torch.inference_mode()
    def predict(
        self, context: Sequence[int], block: Sequence[int], masked: Sequence[int]
    ) -> tuple[list[int], list[float]]:
        probs = self.masked_logits(context, block, masked).softmax(-1)
        conf, tokens = probs.max(-1)
        return tokens.tolist(), conf.tolist()


def save_model(model: TinyDLM, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(model.config.model_dump_json(indent=2) + "\n")
    tensors = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def load_model(path: Path, config: DiffusionConfig) -> TorchDiffusionModel:
    model = TinyDLM(config)
    model.load_state_dict(load_file(str(path / "model.safetensors")))
    return TorchDiffusionModel(model)
