"""GPT-2 small fp16 inference: 6 rounds of greedy generation with a KV cache, random batch
1..32, prompt 16..512 tokens, 32..200 new tokens.

The gpt2_generate workload of ../shared/traces (record_torch_trace.py) as a user's script: same
model, seeds and rounds. bench/predict_check.py predicts it and compares with the real trace.
"""
import random

import torch

torch.manual_seed(0)


def main():
    from transformers import GPT2Config, GPT2LMHeadModel
    m = GPT2LMHeadModel(GPT2Config()).to("cuda").eval().half()
    rng = random.Random(2)
    with torch.no_grad():
        for _ in range(6):
            B = rng.choice([1, 4, 8, 16, 32])
            P = rng.randint(16, 512)
            N = rng.randint(32, 200)
            x = torch.randint(0, 50257, (B, P), device="cuda")
            m.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=N,
                       min_new_tokens=N, do_sample=False, pad_token_id=0)


if __name__ == "__main__":
    main()
