"""ResNet-50 training: SGD with momentum, batch 128 at 224x224, channels_last, bf16 autocast,
4 steps.

The resnet50_train workload of ../shared/traces (record_torch_trace.py) as a user's script: same
model, seed and steps. bench/predict_check.py predicts it and compares with the real trace.
"""
import torch

torch.manual_seed(0)


def main():
    import torchvision
    m = torchvision.models.resnet50().to("cuda").to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    for _ in range(4):
        x = torch.randn(128, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (128,), device="cuda")
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


if __name__ == "__main__":
    main()
