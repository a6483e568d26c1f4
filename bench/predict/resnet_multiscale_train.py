"""ResNet-50 multi-scale training: SGD with momentum, 12 steps at a random resolution 160..352
and batch 32..64, bf16 autocast.

The resnet_multiscale_train workload of ../shared/traces (record_torch_trace.py) as a user's
script: same model, seeds and steps. bench/predict_check.py predicts it and compares with the
real trace.
"""
import random

import torch

torch.manual_seed(0)


def main():
    import torchvision
    m = torchvision.models.resnet50().to("cuda")
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    rng = random.Random(3)
    for _ in range(12):
        s = rng.choice(range(160, 353, 32))
        b = rng.choice([32, 48, 64])
        x = torch.randn(b, 3, s, s, device="cuda")
        y = torch.randint(0, 1000, (b,), device="cuda")
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


if __name__ == "__main__":
    main()
