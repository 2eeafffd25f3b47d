"""Deterministic synthetic corpus of the model zoo (standard library only).

Every text is a sequence of words from a closed vocabulary (`VOCAB`) joined by single spaces;
the zoo tokenizer maps each word to one token and prepends `<bos>`, so a text of `w` words is
exactly `w + 1` tokens and token lengths are known without a tokenizer.

Needle in a haystack::

    from engine.zoo import corpus
    nd = corpus.haystack(n_tokens=1024, depth=0.25, seed=3)
    nd.prompt      # "<filler> ... k17 : 3 9 0 4 . <filler> ... ? k17 :"
    nd.answer      # "3 9 0 4"   (the model should then emit <eos>)
    nd.n_tokens    # 1024 == len(tokenizer(nd.prompt).input_ids), <bos> included
    nd.needle_pos  # index of the needle's first token (its key) in those input_ids
    nd.needle_end  # index one past the needle's last token
    nd.matches(tokenizer.decode(generated_ids, skip_special_tokens=True))  # exact match

`depth` places the needle between filler sentences at that fraction of the filler (0.0: right
after `<bos>`, 1.0: right before the query). A cache that keeps only the last W tokens has
evicted the needle when `n_tokens - needle_end > W` (the query itself is `QUERY_TOKENS` long), so
a workload can pick contexts and depths that put the needle outside a policy's window, or check
`needle_pos` directly. `n_distractors` adds other key/value needles at random sentence boundaries.

Code-like text for throughput runs::

    corpus.code_prompts(n=8, seed=0, n_tokens=96)   # list of prompts, each exactly n_tokens

Everything is a pure function of its arguments (a `random.Random(seed)` per call).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# --- closed vocabulary -------------------------------------------------------------------------

PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
SPECIALS = [PAD, EOS, BOS, UNK]  # ids 0, 1, 2, 3 as in Gemma configs
DIGITS = [str(d) for d in range(10)]
N_KEYS = 256
KEYS = [f"k{i}" for i in range(N_KEYS)]
PUNCT = [".", ",", ":", "?", ";", "(", ")", "[", "]", "=", "+", "-", "*", "<", ">", "==", "+=", "\n"]

DETS = ["the", "a", "this", "that", "every", "some", "one", "each"]
ADJS = [
    "old",
    "quiet",
    "green",
    "small",
    "bright",
    "cold",
    "long",
    "heavy",
    "soft",
    "dark",
    "warm",
    "tall",
    "slow",
    "quick",
    "empty",
    "busy",
    "plain",
    "round",
    "wild",
    "calm",
]
NOUNS = [
    "river",
    "house",
    "garden",
    "bridge",
    "road",
    "window",
    "stone",
    "tree",
    "field",
    "market",
    "boat",
    "train",
    "lamp",
    "door",
    "hill",
    "cloud",
    "wall",
    "village",
    "forest",
    "table",
    "letter",
    "song",
    "farmer",
    "child",
    "teacher",
    "painter",
    "bird",
    "horse",
    "city",
    "lake",
]
VERBS = [
    "crosses",
    "follows",
    "holds",
    "watches",
    "finds",
    "passes",
    "covers",
    "carries",
    "leaves",
    "meets",
    "builds",
    "opens",
    "reaches",
    "keeps",
    "turns",
    "shows",
    "fills",
    "joins",
    "waits",
    "rests",
]
PREPS = ["near", "under", "behind", "beside", "across", "over", "past", "beyond", "along", "inside"]
CONJ = ["and", "but", "while", "because", "then"]
ADVS = ["slowly", "again", "today", "often", "never", "always", "early", "late"]

CODE_KEYWORDS = [
    "def",
    "return",
    "if",
    "else",
    "for",
    "in",
    "range",
    "while",
    "print",
    "len",
    "total",
    "count",
    "result",
    "items",
    "item",
    "value",
]
CODE_VARS = ["a", "b", "c", "x", "y", "z", "i", "j", "n", "m"]
N_FUNCS = 32
CODE_FUNCS = [f"f{i}" for i in range(N_FUNCS)]

# Word lists may share words ("a" is a determiner and a variable); each word is one token.
WORDS = list(
    dict.fromkeys(DETS + ADJS + NOUNS + VERBS + PREPS + CONJ + ADVS + CODE_KEYWORDS + CODE_VARS + CODE_FUNCS)
)
VOCAB: list[str] = SPECIALS + DIGITS + PUNCT + KEYS + WORDS

NEEDLE_DIGITS = 4
QUERY_TOKENS = 3  # "? kN :"


# --- filler ------------------------------------------------------------------------------------


def _noun_phrase(rng: random.Random) -> list[str]:
    words = [rng.choice(DETS)]
    if rng.random() < 0.6:
        words.append(rng.choice(ADJS))
    words.append(rng.choice(NOUNS))
    return words


def sentence(rng: random.Random) -> list[str]:
    """One filler sentence (5-16 words, ends with '.')."""
    words = _noun_phrase(rng) + [rng.choice(VERBS)] + _noun_phrase(rng)
    if rng.random() < 0.5:
        words += [rng.choice(PREPS)] + _noun_phrase(rng)
    if rng.random() < 0.3:
        words.append(rng.choice(ADVS))
    if rng.random() < 0.25:
        words += [rng.choice(CONJ)] + _noun_phrase(rng) + [rng.choice(VERBS)] + _noun_phrase(rng)
    return words + ["."]


def filler(n_words: int, rng: random.Random) -> list[list[str]]:
    """Sentences totalling exactly `n_words` words; the last one is cut and ends with '.'."""
    out: list[list[str]] = []
    total = 0
    while total < n_words:
        s = sentence(rng)
        out.append(s)
        total += len(s)
    if out and total > n_words:
        last = out[-1][: len(out[-1]) - (total - n_words)]
        out[-1] = last[:-1] + ["."]
    return out


# --- needles -----------------------------------------------------------------------------------


def needle_words(key: str, value: list[str]) -> list[str]:
    return [key, ":", *value, "."]


def query_words(key: str) -> list[str]:
    return ["?", key, ":"]


@dataclass(frozen=True)
class Needle:
    """A haystack prompt and the answer a model must produce after it."""

    prompt: str
    answer: str  # space-separated digits, e.g. "3 9 0 4"
    key: str
    depth: float  # requested fractional depth
    n_tokens: int  # tokens of `prompt` with the zoo tokenizer, <bos> included
    needle_pos: int  # token index of the needle's key (<bos> is index 0)
    needle_end: int  # token index one past the needle's '.'
    seed: int

    def matches(self, generated: str) -> bool:
        """Exact match: the first words of `generated` are the answer's digits."""
        want = self.answer.split()
        return generated.split()[: len(want)] == want


def _sample_layout(
    rng: random.Random, n_tokens: int, depth: float, n_distractors: int
) -> tuple[list[str], str, list[str], int, int]:
    """Words of a haystack prompt (without <bos>), the key, its value and the needle's span."""
    keys = rng.sample(KEYS, 1 + n_distractors)
    values = [[rng.choice(DIGITS) for _ in range(NEEDLE_DIGITS)] for _ in keys]
    needles = [needle_words(k, v) for k, v in zip(keys, values, strict=True)]
    n_filler = n_tokens - 1 - sum(len(nd) for nd in needles) - QUERY_TOKENS
    if n_filler < 1:
        raise ValueError(f"n_tokens={n_tokens} is too short for {1 + n_distractors} needle(s)")
    sents = filler(n_filler, rng)
    bounds = [0]
    for s in sents:
        bounds.append(bounds[-1] + len(s))
    # sentence index before which the target needle goes: the boundary nearest to depth
    target = min(range(len(bounds)), key=lambda b: (abs(bounds[b] - depth * n_filler), b))
    slots: dict[int, list[list[str]]] = {target: [needles[0]]}
    for nd in needles[1:]:
        slots.setdefault(rng.randrange(len(bounds)), []).append(nd)
    words: list[str] = []
    start = end = -1
    for b in range(len(bounds)):
        for nd in slots.get(b, []):
            if nd is needles[0]:
                start = len(words) + 1  # +1 for <bos>
                end = start + len(nd)
            words += nd
        if b < len(sents):
            words += sents[b]
    words += query_words(keys[0])
    assert len(words) + 1 == n_tokens
    return words, keys[0], values[0], start, end


def haystack(n_tokens: int, depth: float, seed: int, n_distractors: int = 0) -> Needle:
    """A prompt of exactly `n_tokens` zoo tokens (<bos> included) with one needle at `depth`.

    The needle is `kN : d d d d .` (a unique key token, four digits); the prompt ends with the
    query `? kN :` and the answer is `d d d d` (followed by <eos>).
    """
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    rng = random.Random(f"haystack:{n_tokens}:{depth}:{seed}:{n_distractors}")
    words, key, value, start, end = _sample_layout(rng, n_tokens, depth, n_distractors)
    return Needle(
        prompt=" ".join(words),
        answer=" ".join(value),
        key=key,
        depth=depth,
        n_tokens=n_tokens,
        needle_pos=start,
        needle_end=end,
        seed=seed,
    )


# --- code-like text ----------------------------------------------------------------------------


def _expr(rng: random.Random, names: list[str]) -> list[str]:
    op = rng.choice(["+", "-", "*"])
    left = rng.choice(names)
    right = rng.choice(names + DIGITS[1:])
    return [left, op, right]


def code_block(rng: random.Random) -> list[str]:
    """One short, regular code-like block; lines end with the word '\\n'."""
    kind = rng.random()
    if kind < 0.45:
        fn = rng.choice(CODE_FUNCS)
        a, b = rng.sample(CODE_VARS[:6], 2)
        out = rng.choice([v for v in CODE_VARS[:6] if v not in (a, b)])
        lines = [["def", fn, "(", a, ",", b, ")", ":"], [out, "=", *_expr(rng, [a, b])]]
        if rng.random() < 0.5:
            lines.append([out, "=", out, rng.choice(["+", "*"]), rng.choice(DIGITS[1:])])
        lines += [
            ["return", out],
            [rng.choice(CODE_VARS[:6]), "=", fn, "(", rng.choice(DIGITS), ",", rng.choice(DIGITS), ")"],
        ]
    elif kind < 0.7:
        var = rng.choice(["i", "j", "n"])
        acc = rng.choice(["total", "count", "result"])
        lines = [
            [acc, "=", "0"],
            ["for", var, "in", "range", "(", rng.choice(DIGITS[1:]), ")", ":"],
            [
                acc,
                "+=",
                var,
                *([rng.choice(["*", "+"]), rng.choice(DIGITS[1:])] if rng.random() < 0.5 else []),
            ],
            ["print", "(", acc, ")"],
        ]
    elif kind < 0.85:
        vals = [rng.choice(DIGITS) for _ in range(rng.randint(2, 5))]
        lst: list[str] = ["items", "=", "["]
        for k, v in enumerate(vals):
            lst += ([","] if k else []) + [v]
        lines = [lst + ["]"], ["for", "item", "in", "items", ":"], ["print", "(", "item", ")"]]
    else:
        v = rng.choice(["x", "y", "z"])
        w = rng.choice(["value", "result"])
        d = rng.choice(DIGITS[1:])
        lines = [
            ["if", v, rng.choice([">", "<", "=="]), d, ":"],
            [w, "=", v, "+", "1"],
            ["else", ":"],
            [w, "=", v, "-", "1"],
            ["print", "(", w, ")"],
        ]
    return [w for line in lines for w in [*line, "\n"]]


def code_words(n_words: int, rng: random.Random) -> list[str]:
    """Exactly `n_words` words of code-like text (whole blocks, the last one cut)."""
    words: list[str] = []
    while len(words) < n_words:
        words += code_block(rng)
    return words[:n_words]


def code_prompts(n: int, seed: int, n_tokens: int = 96) -> list[str]:
    """`n` code-like prompts of exactly `n_tokens` zoo tokens each (<bos> included)."""
    if n_tokens < 2:
        raise ValueError(f"n_tokens must be >= 2, got {n_tokens}")
    rng = random.Random(f"code:{seed}:{n_tokens}")
    return [" ".join(code_words(n_tokens - 1, rng)) for _ in range(n)]


# --- training examples -------------------------------------------------------------------------


def training_haystack(
    n_tokens: int, rng: random.Random, max_needles: int = 4
) -> tuple[list[str], list[bool]]:
    """A training row of exactly `n_tokens` tokens (<bos> included) and its answer mask.

    Like `haystack`, with 1..max_needles needles (at most one per 30 tokens, so needles and
    queries take at most half the row) at random sentence boundaries (depth 0 and 1 included) and
    one query per needle for a random subset of them, each answered and closed by <eos>:
    `<bos> ... ? kA : d d d d <eos> ? kB : d d d d <eos>`. The first query sits exactly where
    `haystack` puts its query. The mask marks answer digits and their <eos> (targets of the
    retrieval loss); words[0] is <bos>.
    """
    m = rng.randint(1, max(1, min(max_needles, n_tokens // 30)))
    keys = rng.sample(KEYS, m)
    values = [[rng.choice(DIGITS) for _ in range(NEEDLE_DIGITS)] for _ in keys]
    asked = rng.sample(range(m), rng.randint(1, m))
    q_len = QUERY_TOKENS + NEEDLE_DIGITS + 1
    n_filler = n_tokens - 1 - m * (NEEDLE_DIGITS + 3) - len(asked) * q_len
    if n_filler < 1:
        raise ValueError(f"n_tokens={n_tokens} is too short for a training haystack")
    sents = filler(n_filler, rng)
    slots: dict[int, list[int]] = {}
    for i in range(m):
        r = rng.random()
        b = 0 if r < 0.1 else len(sents) if r < 0.2 else rng.randrange(len(sents) + 1)
        slots.setdefault(b, []).append(i)
    words = [BOS]
    for b in range(len(sents) + 1):
        for i in slots.get(b, []):
            words += needle_words(keys[i], values[i])
        if b < len(sents):
            words += sents[b]
    mask = [False] * len(words)
    for i in asked:
        words += query_words(keys[i])
        words += [*values[i], EOS]
        mask += [False] * QUERY_TOKENS + [True] * (NEEDLE_DIGITS + 1)
    assert len(words) == n_tokens == len(mask)
    return words, mask
