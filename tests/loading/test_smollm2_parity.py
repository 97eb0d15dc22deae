"""Real weights: SmolLM2-135M-Instruct served from its Q4_1 GGUF file against HF transformers
loading the same file (`gguf_file=`, float32). Same dequantized weights bit for bit, same
tokenizer and chat template, and the same greedy tokens and top-5 logprobs with chunked
prefill, prefix caching and preemption on.

HF's reference is computed by teacher forcing: one forward over prompt + our 64 tokens gives
HF's next-token distribution at every step, and our token must be its argmax at each one.
By induction that is exactly HF's greedy output (each step's prefix is then HF's own), and it
costs one forward per prompt instead of 64; one chat prompt also runs through `generate` itself.
"""

import pytest
import torch

from infer_cluster.protocol import SamplingParams
from infer_cluster.worker import LLM
from infer_cluster.worker.text.chat import render_chat

MAX_TOKENS = 64
TOP = 5

PLAIN = ["The capital of France is", "Once upon a time, in a small village,", "def fibonacci(n):",
         "The three primary colors are"]
CHATS = [[{"role": "user", "content": "What is the capital of France?"}],
         [{"role": "user", "content": "Write a haiku about the sea."}],
         [{"role": "system", "content": "You answer in one short sentence."},
          {"role": "user", "content": "Explain recursion."}],
         [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello! How can I help?"},
          {"role": "user", "content": "List three fruits."}]]


@pytest.fixture(scope="module")
def hf_tokenizer(hf_smollm2_tokenizer):
    return hf_smollm2_tokenizer


@pytest.fixture(scope="module")
def hf_model(hf_smollm2):
    if hf_smollm2[1] is None:
        pytest.skip("transformers needs accelerate for gguf_file= (a test extra)")
    return hf_smollm2[1]


@pytest.fixture(scope="module")
def prompts(hf_tokenizer) -> list[list[int]]:
    plain = [hf_tokenizer.encode(p) for p in PLAIN]
    chats = [list(hf_tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True,
                                                   return_dict=True)["input_ids"]) for m in CHATS]
    return plain + chats


def test_hf_dequantizes_the_same_weights(hf_model, smollm2_dir):
    """transformers reads this file with gguf-py's dequantizer, as we do: every tensor equal."""
    from pathlib import Path

    from safetensors import safe_open

    ours = hf_model.state_dict()
    with safe_open(str(Path(smollm2_dir) / "model.safetensors"), "pt") as f:
        names = list(f.keys())
        for name in names:
            assert torch.equal(f.get_tensor(name), ours[name]), name
    assert set(ours) - set(names) == {"lm_head.weight"}  # tied to the embedding on both sides


def test_tokenizer_and_chat_template_match_hf(smollm2_dir, hf_tokenizer, prompts):
    from pathlib import Path

    from infer_cluster.worker.loading.loader import load_tokenizer

    llm_tok = load_tokenizer(Path(smollm2_dir))  # what the engine serves with
    text = ("Hello world!  Tabs\tand\nnewlines, numbers 3.14159 and 2048, café naïve 東京, "
            "<|im_start|>user\nspecial tokens<|im_end|>, code: def f(x): return x**2")
    assert llm_tok.encode(text) == hf_tokenizer.encode(text)
    assert llm_tok.chat_template == hf_tokenizer.chat_template
    assert (llm_tok.eos_token_id, llm_tok.bos_token_id) == (hf_tokenizer.eos_token_id, hf_tokenizer.bos_token_id)
    for messages, want in zip(CHATS, prompts[len(PLAIN):]):
        assert render_chat(llm_tok, messages) == want


@pytest.mark.slow  # about 2 minutes on a loaded 2-core CPU, most of it the 135M model's steps
def test_greedy_and_logprobs_match_hf(smollm2_dir, hf_model, prompts):
    # 16-token blocks, 40 of them (8 requests need ~50): preemption; 64-token steps: chunked
    # prefill; the chat prompts share the system turn: prefix-cache hits
    llm = LLM(smollm2_dir, block_size=16, num_kv_blocks=40, max_num_batched_tokens=64)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=TOP)
    outs = llm.generate(prompts, params, use_tqdm=False)
    stats = llm.stats()
    assert stats["num_preemptions"] > 0 and stats["prefix_cache_hit_tokens"] > 0
    worst = 0.0
    for i, (prompt, out) in enumerate(zip(prompts, outs)):
        seq = torch.tensor([prompt + out.token_ids])
        with torch.no_grad():
            logits = hf_model(seq, attention_mask=torch.ones_like(seq)).logits[0, len(prompt) - 1:-1]
        ref = torch.log_softmax(logits.float(), -1)
        assert out.token_ids == ref.argmax(-1).tolist(), f"prompt {i}: differs from HF's greedy choice"
        for step, (sampled_lp, top) in enumerate(out.logprobs):
            ref_top = torch.topk(ref[step], TOP)
            assert sorted(top) == sorted(ref_top.indices.tolist()), f"prompt {i} step {step}"
            for token, value in top.items():
                worst = max(worst, abs(value - ref[step, token].item()))
            assert abs(sampled_lp - ref[step, out.token_ids[step]].item()) < 1e-3
    print(f"largest top-{TOP} logprob difference from HF: {worst:.2e}")
    assert worst < 1e-3
    # HF's own generate loop on a chat prompt (its <|im_end|> = pad id 2: the explicit mask
    # keeps HF from masking those tokens out of the prompt)
    i = len(PLAIN) + 3
    seq = torch.tensor([prompts[i]])
    with torch.no_grad():
        gen = hf_model.generate(seq, attention_mask=torch.ones_like(seq), max_new_tokens=MAX_TOKENS,
                                do_sample=False, eos_token_id=None, pad_token_id=2)
    assert gen[0, len(prompts[i]):].tolist() == outs[i].token_ids
