"""The Kakeya model zoo: tiny models trained here, small enough to commit, on a synthetic corpus.

- `engine.zoo.corpus` (standard library only): the closed word vocabulary and deterministic texts.
  `corpus.haystack(n_tokens, depth, seed, n_distractors=0) -> Needle` (prompt, answer, needle_pos,
  needle_end, n_tokens, `Needle.matches(text)`), `corpus.code_prompts(n, seed, n_tokens=96)`.
- `engine.zoo.tokenizer`: the WordLevel tokenizer over `corpus.VOCAB` (one token per word, <bos>
  prepended), saved as a transformers tokenizer in every model directory.
- `python -m engine.zoo.train --model tiny-hybrid|tiny-drafter`: deterministic CPU training.
- `python -m engine.zoo.evaluate --model tiny-hybrid --drafter tiny-drafter [--write]`: needle
  recall per context x depth and drafter acceptance; `--write` renders the model cards.
- `models/tiny-hybrid/`: Gemma-3-style verifier, sliding-window and full-attention layers alternating.
  `models/tiny-drafter/`: one layer, same tokenizer, distilled from tiny-hybrid on code-like text.
  Both are ordinary Hugging Face model directories (`engine.load("zoo:NAME")`, transformers or
  `mlx_lm.load` by path); each README.md says how it was trained and what it measured.
"""
