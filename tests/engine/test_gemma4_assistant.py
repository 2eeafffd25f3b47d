"""Gemma 4's assistant as a drafter (engine/drafters/gemma4_assistant/): it proposes what transformers'
own assisted generation proposes, and speculative decoding with it is exactly greedy under every policy,
after the windows wrap."""

from __future__ import annotations

import pytest
import torch

from engine.decode import Stop, generate
from engine.drafters.gemma4_assistant.torch import Gemma4AssistantDrafter
from engine.policy import Policy, full, hybrid, sink_window
from engine.speculative import speculative_generate
from tests.engine.tiny_models import gemma4, gemma4_assistant, prompt


def _first_block(tm, assistant, ids: list[int], k: int) -> tuple[int, list[int]]:
    session = tm.session(full(), max_block=k + 1)
    drafter = Gemma4AssistantDrafter(assistant, session)
    drafter.begin(ids)
    step = session.forward(ids, hidden=drafter.layers)
    drafter.observe(step.hidden, len(step.tokens))
    return step.tokens[-1], drafter.propose(step.tokens[-1], k)


def _transformers_first_block(tm, assistant, ids: list[int], k: int) -> tuple[int, list[int]]:
    """transformers' SinglePositionMultiTokenCandidateGenerator on the target's prefill outputs, as
    `generate(assistant_model=...)` runs it for the first drafted block."""
    from transformers import GenerationConfig
    from transformers.generation.candidate_generator import SinglePositionMultiTokenCandidateGenerator

    model = tm.model
    assistant.generation_config.num_assistant_tokens = k
    gen = SinglePositionMultiTokenCandidateGenerator(
        assistant, model.get_input_embeddings(), GenerationConfig(max_length=1000)
    )
    with torch.inference_mode():
        out = model(torch.tensor([ids]), output_hidden_states=True, return_shared_kv_states=True)
        first = int(out.logits[0, -1].argmax())
        seen = torch.tensor([[*ids, first]])
        cand, _ = gen.get_candidates(
            seen, {"attention_mask": torch.ones_like(seen)}, out, is_first_iteration=False, n_last_matches=0
        )
    return first, cand[0, seen.shape[1] :].tolist()


@pytest.mark.parametrize("n", [6, 30])
def test_first_block_is_transformers_assisted_generation(n: int) -> None:
    # n=30 > the sliding layer's ring (window 8 - 1 + slack 5): its slots are out of position order.
    tm, assistant = gemma4(), gemma4_assistant()
    ids = prompt(n, seed=3)
    ours = _first_block(tm, assistant, ids, 4)
    assert ours == _transformers_first_block(tm, assistant, ids, 4)
    assert len(ours[1]) == 4


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("policy", [full(), sink_window(4, 12), hybrid(2, 6)], ids=str)
def test_speculative_with_assistant_is_greedy(policy: Policy, k: int) -> None:
    tm, assistant = gemma4(), gemma4_assistant()
    ids, new = prompt(30, seed=5), 40
    # Far past every window (sliding 8, policy windows 12 and 6) and every ring: the buffers have wrapped.
    assert len(ids) + new > 2 * (12 + k + 1)
    greedy = generate(tm.session(policy), ids, Stop(new)).tokens
    session = tm.session(policy, max_block=k + 1)
    spec = speculative_generate(session, Gemma4AssistantDrafter(assistant, session), ids, k, Stop(new))
    assert spec.tokens == greedy
    assert spec.drafted > 0 and spec.forwards < new


def test_assistant_refuses_what_it_cannot_read() -> None:
    tm, assistant = gemma4(), gemma4_assistant()
    with pytest.raises(ValueError, match="without :qN"):
        Gemma4AssistantDrafter(assistant, tm.session(Policy("full", precision="q8"), max_block=5))
    from tests.engine.tiny_models import gemma

    with pytest.raises(ValueError, match="Gemma 4 verifiers"):
        Gemma4AssistantDrafter(assistant, gemma().session(full(), max_block=5))


def test_attended_kv_is_what_the_newest_position_attended() -> None:
    """`TorchSession.attended_kv`, the session method the assistant reads instead of the cache's internals.
    Layer 0 (sliding, native window 16; its K/V depend on the tokens alone, not on the policy) after 40
    positions: full gives the native window, positions 24..39; sink_window(2, 6) (its ring wrapped) the
    sinks and the last 6 within the native window, 34..39, in position order and equal to those."""
    from tests.engine.tiny_models import gemma

    tm, ids = gemma(), prompt(40, seed=9)
    bounded, oracle = tm.session(sink_window(2, 6), max_block=5), tm.session(full())
    bounded.prefill(ids)
    oracle.prefill(ids)
    k, v = bounded.attended_kv(0)
    kf, vf = oracle.attended_kv(0)
    assert kf.shape[2] == 16 and k.shape[2] == 6
    torch.testing.assert_close(k, kf[:, :, 10:])
    torch.testing.assert_close(v, vf[:, :, 10:])
    quantized = tm.session(Policy("full", precision="q8"))
    quantized.prefill(ids)
    with pytest.raises(ValueError, match="QuantizedKV"):
        quantized.attended_kv(0)
