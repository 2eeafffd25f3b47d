"""The zoo tokenizer: one token per word of `corpus.VOCAB`, saved as a transformers tokenizer."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from engine.zoo import corpus

TOKEN_IDS: dict[str, int] = {w: i for i, w in enumerate(corpus.VOCAB)}


def build() -> PreTrainedTokenizerFast:
    """WordLevel over the closed vocabulary; splits on spaces, keeps '\\n' as a token, adds <bos>."""
    tok = Tokenizer(models.WordLevel(TOKEN_IDS, unk_token=corpus.UNK))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(" ", "removed"), pre_tokenizers.Split("\n", "isolated")]
    )
    tok.post_processor = processors.TemplateProcessing(
        single=f"{corpus.BOS} $A", special_tokens=[(corpus.BOS, TOKEN_IDS[corpus.BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=corpus.BOS,
        eos_token=corpus.EOS,
        pad_token=corpus.PAD,
        unk_token=corpus.UNK,
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )


def save(directory: Path) -> None:
    build().save_pretrained(directory)


def encode_words(words: list[str]) -> list[int]:
    """Ids of already-split words (no <bos> added); raises on a word outside the vocabulary."""
    try:
        return [TOKEN_IDS[w] for w in words]
    except KeyError as e:
        raise ValueError(f"word {e.args[0]!r} is not in the zoo vocabulary") from None
