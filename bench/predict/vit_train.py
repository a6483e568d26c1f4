"""ViT-B/16 (timm) training: AdamW, batch 64 at 224x224, bf16 autocast, 4 steps.

The vit_train workload of ../shared/traces (record_torch_trace.py) as a user's script: same
model, seed and steps. bench/predict_check.py predicts it and compares with the real trace.
The environment variable BATCH sets another batch (docs/predict.md's --sweep).
"""
import os

import torch

torch.manual_seed(0)


def main():
    import timm
    m = timm.create_model("vit_base_patch16_224", pretrained=False).to("cuda")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    for _ in range(4):
        batch = int(os.environ.get("BATCH", "64"))
        x = torch.randn(batch, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (batch,), device="cuda")
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


if __name__ == "__main__":
    main()
