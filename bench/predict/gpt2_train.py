"""GPT-2 small (124M) training step: AdamW, batch 8 x 1024 tokens, bf16 autocast, 4 steps.

The gpt2_train workload of ../shared/traces (record_torch_trace.py) as a user's script: same
model, seed and steps. bench/predict_check.py predicts it and compares with the real trace.
"""
import torch

torch.manual_seed(0)


def main():
    from transformers import GPT2Config, GPT2LMHeadModel
    m = GPT2LMHeadModel(GPT2Config()).to("cuda")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    for _ in range(4):
        x = torch.randint(0, 50257, (8, 1024), device="cuda")
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = m(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


if __name__ == "__main__":
    main()
