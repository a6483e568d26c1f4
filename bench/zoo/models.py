"""The models of the corpus: one row per architecture, with how to build it from a config (random
weights, nothing downloaded), the shape of its inputs and its two batch sizes.

A row is a `Model`: `name` (unique over the table; a small configuration of a large model says
so in its name, e.g. `llama2-7b-2l` is Llama 2 7B's widths with 2 of its 32 layers), `library`
(torchvision, timm, transformers, diffusers), `kind` (which inputs and which loss, see
`inputs()` and `loss()`), `build` (a function returning the module on the CPU), `batches` (the
two batch sizes) and `modes` (every model has `train` and `infer`; some also `train-ckpt`,
activation checkpointing, `train-varlen`, a new sequence length or image size at every step, and
`generate`). bench/zoo/build.py runs them.
`opts` holds the sizes the kind needs (`size`, `seq`, `vocab`, `classes`, ...).

Imports of torch and the model libraries happen inside the functions: `MODELS` and the names
are readable without them (tests/python/test_zoo.py reads the table where torch is absent).
"""

import random
from dataclasses import dataclass, field

TRAIN_STEPS = 3     # optimizer state appears at the first step, the steady peak at the second
VARLEN_STEPS = 3
INFER_STEPS = 2


@dataclass
class Model:
    name: str
    library: str
    kind: str
    build: object
    batches: tuple
    modes: tuple = ("train", "infer")
    opts: dict = field(default_factory=dict)


def tv(name, **kw):
    def build():
        import torchvision
        return torchvision.models.get_model(name, weights=None, **kw)
    return build


def tm(name, **kw):
    def build():
        import timm
        return timm.create_model(name, pretrained=False, **kw)
    return build


def hf(model_class, config_class, **config):
    """A transformers model of class `model_class` from `config_class(**config)`, its default
    attention (SDPA where the model has it). A value `("XxxConfig", {...})` is that config."""
    def build():
        import transformers
        kw = {k: getattr(transformers, v[0])(**v[1]) if isinstance(v, tuple) else v
              for k, v in config.items()}
        cfg = getattr(transformers, config_class)(**kw)
        return getattr(transformers, model_class)(cfg)
    return build


def df(model_class, **config):
    """A diffusers model of class `model_class` from `config`."""
    def build():
        import diffusers
        return getattr(diffusers, model_class)(**config)
    return build


def layers(n):
    """The name suffix of a small configuration: n layers of a deeper model."""
    return f"-{n}l"


MODELS = []


def add(name, library, kind, build, batches, modes=("train", "infer"), **opts):
    MODELS.append(Model(name, library, kind, build, tuple(batches), tuple(modes), opts))


# ---- torchvision: image classification (224 x 224 unless said), segmentation, video ----------
IMG = (32, 128)
for n in ["alexnet", "vgg16_bn", "squeezenet1_1", "resnet18", "resnet50", "resnet152",
          "resnext50_32x4d", "wide_resnet50_2", "densenet121", "googlenet", "mobilenet_v2",
          "mobilenet_v3_large", "mnasnet1_0", "shufflenet_v2_x1_0", "efficientnet_b0",
          "efficientnet_v2_s", "regnet_y_16gf", "convnext_tiny", "vit_b_16", "vit_l_16", "swin_t",
          "swin_v2_t", "maxvit_t"]:
    add(n, "torchvision", "image", tv(n), IMG)
add("resnet50-multiscale", "torchvision", "image", tv("resnet50"), IMG,
    modes=("train-varlen", "infer"), sizes=(160, 192, 224, 256, 288, 320))
add("inception_v3", "torchvision", "image", tv("inception_v3", init_weights=False), IMG, size=299)
add("vit_h_14", "torchvision", "image", tv("vit_h_14"), (8, 32))
for n in ["fcn_resnet50", "deeplabv3_resnet50", "lraspp_mobilenet_v3_large"]:
    add(n, "torchvision", "segment", tv(n, weights_backbone=None, num_classes=21), (8, 16),
        size=512, classes=21)
for n in ["r3d_18", "r2plus1d_18", "s3d", "mvit_v2_s", "swin3d_t"]:
    add(n, "torchvision", "video", tv(n), (8, 16), frames=16, size=224 if n in (
        "mvit_v2_s", "swin3d_t", "s3d") else 112)
for n in ["fasterrcnn_resnet50_fpn", "retinanet_resnet50_fpn", "ssd300_vgg16",
          "maskrcnn_resnet50_fpn"]:
    add(n, "torchvision", "detect", tv(n, weights_backbone=None), (2, 8),
        size=300 if n.startswith("ssd") else 800)
add("raft_small", "torchvision", "flow", tv("raft_small"), (4, 8), size=(368, 496))

# ---- timm: image classification at each model's own input size --------------------------------
for n in ["vit_small_patch16_224", "beit_base_patch16_224", "eva02_small_patch14_224",
          "convnextv2_tiny", "mixnet_s", "ghostnet_100", "hrnet_w18", "dla34", "cspdarknet53",
          "resnest50d", "seresnext50_32x4d", "dm_nfnet_f0", "repvgg_a2", "fastvit_t8",
          "mobilevit_s", "efficientformer_l1", "levit_128", "crossvit_tiny_240",
          "cait_xxs24_224", "xcit_tiny_12_p16_224", "twins_svt_small", "poolformer_s12",
          "mixer_b16_224", "convmixer_768_32", "inception_v4", "xception41", "efficientvit_b0",
          "botnet26t_256", "coatnet_0_rw_224", "davit_tiny", "focalnet_tiny_srf",
          "hiera_tiny_224", "pvt_v2_b0", "sequencer2d_s", "tiny_vit_5m_224",
          "inception_next_tiny", "mambaout_femto", "vitamin_small_224",
          "mobilenetv4_hybrid_medium"]:
    ckpt = n in ("vit_small_patch16_224", "convnextv2_tiny", "beit_base_patch16_224",
                 "eva02_small_patch14_224", "davit_tiny", "hiera_tiny_224", "resnest50d")
    add(n, "timm", "image", tm(n), IMG,
        modes=("train", "train-ckpt", "infer") if ckpt else ("train", "infer"))
add("samvit_base_patch16", "timm", "image", tm("samvit_base_patch16", num_classes=1000),
    (4, 16), size=1024)

# ---- transformers: encoders, decoders, encoder-decoders, speech, vision ------------------------
ENC = (8, 32)
add("bert-base", "transformers", "mlm", hf("BertForMaskedLM", "BertConfig"), ENC,
    modes=("train", "train-ckpt", "train-varlen", "infer"), seq=512, vocab=30522)
add("bert-large", "transformers", "mlm", hf(
    "BertForMaskedLM", "BertConfig", hidden_size=1024, num_hidden_layers=24,
    num_attention_heads=16, intermediate_size=4096), ENC,
    modes=("train", "train-ckpt", "infer"), seq=512, vocab=30522)
ROBERTA = dict(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1,
               bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5)
add("roberta-base", "transformers", "mlm", hf("RobertaForMaskedLM", "RobertaConfig", **ROBERTA),
    ENC, modes=("train", "train-varlen", "infer"), seq=512, vocab=50265)
add("xlm-roberta-base", "transformers", "mlm", hf(
    "XLMRobertaForMaskedLM", "XLMRobertaConfig", vocab_size=250002, max_position_embeddings=514,
    type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5), ENC, seq=512, vocab=250002)
add("deberta-base", "transformers", "cls", hf(
    "DebertaForSequenceClassification", "DebertaConfig", relative_attention=True,
    pos_att_type=["c2p", "p2c"], max_relative_positions=-1, position_biased_input=False,
    max_position_embeddings=512, type_vocab_size=0), ENC,
    modes=("train", "train-varlen", "infer"), seq=512, vocab=50265)
add("deberta-v3-base", "transformers", "cls", hf(
    "DebertaV2ForSequenceClassification", "DebertaV2Config", vocab_size=128100,
    relative_attention=True, position_buckets=256, norm_rel_ebd="layer_norm", share_att_key=True,
    pos_att_type=["p2c", "c2p"], position_biased_input=False, max_relative_positions=-1,
    max_position_embeddings=512, type_vocab_size=0, layer_norm_eps=1e-7), ENC,
    modes=("train", "train-ckpt", "infer"), seq=512, vocab=128100)
add("distilbert-base", "transformers", "mlm", hf("DistilBertForMaskedLM", "DistilBertConfig"),
    ENC, seq=512, vocab=30522)
add("albert-base-v2", "transformers", "mlm", hf(
    "AlbertForMaskedLM", "AlbertConfig", hidden_size=768, num_attention_heads=12,
    intermediate_size=3072), ENC, seq=512, vocab=30000)
add("electra-base", "transformers", "cls", hf(
    "ElectraForSequenceClassification", "ElectraConfig", hidden_size=768, embedding_size=768,
    num_attention_heads=12, intermediate_size=3072), ENC, seq=512, vocab=30522)
add("funnel-small", "transformers", "cls", hf(
    "FunnelForSequenceClassification", "FunnelConfig", block_sizes=[4, 4, 4]), ENC, seq=512,
    vocab=30522)
add("longformer-base", "transformers", "cls", hf(
    "LongformerForSequenceClassification", "LongformerConfig", vocab_size=50265,
    max_position_embeddings=4098, type_vocab_size=1, pad_token_id=1, attention_window=512),
    (2, 8), seq=4096, vocab=50265)
add("bigbird-roberta-base", "transformers", "cls", hf(
    "BigBirdForSequenceClassification", "BigBirdConfig", vocab_size=50358,
    max_position_embeddings=4096), (2, 8), seq=4096, vocab=50358)
add("modernbert-base", "transformers", "mlm", hf(
    "ModernBertForMaskedLM", "ModernBertConfig"), ENC,
    modes=("train", "train-varlen", "infer"), seq=1024, vocab=50368)
add("xlnet-base", "transformers", "cls", hf(
    "XLNetForSequenceClassification", "XLNetConfig", d_model=768, n_layer=12, n_head=12,
    d_inner=3072), ENC, seq=512, vocab=32000)

DEC = (4, 16)
BIG = (2, 8)
add("gpt2", "transformers", "causal", hf("GPT2LMHeadModel", "GPT2Config"), DEC,
    modes=("train", "train-ckpt", "train-varlen", "infer", "generate"), seq=1024, vocab=50257)
add("gptj-6b-2l", "transformers", "causal", hf(
    "GPTJForCausalLM", "GPTJConfig", n_layer=2), BIG, seq=2048, vocab=50400)
add("opt-125m", "transformers", "causal", hf(
    "OPTForCausalLM", "OPTConfig", hidden_size=768, num_hidden_layers=12, ffn_dim=3072,
    num_attention_heads=12, word_embed_proj_dim=768), DEC,
    modes=("train", "train-varlen", "infer", "generate"), seq=2048, vocab=50272)
add("bloom-560m", "transformers", "causal", hf(
    "BloomForCausalLM", "BloomConfig", vocab_size=250880, hidden_size=1024, n_layer=24,
    n_head=16), DEC, seq=2048, vocab=250880)
add("pythia-160m", "transformers", "causal", hf(
    "GPTNeoXForCausalLM", "GPTNeoXConfig", vocab_size=50304, hidden_size=768,
    num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, rotary_pct=0.25),
    DEC, modes=("train", "train-ckpt", "infer"), seq=2048, vocab=50304)
LLAMA2 = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
              num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096)
add("llama2-7b" + layers(2), "transformers", "causal", hf(
    "LlamaForCausalLM", "LlamaConfig", num_hidden_layers=2, **LLAMA2), BIG,
    modes=("train", "train-ckpt", "train-varlen", "infer", "generate"), seq=4096, vocab=32000)
add("llama3-8b" + layers(2), "transformers", "causal", hf(
    "LlamaForCausalLM", "LlamaConfig", vocab_size=128256, hidden_size=4096,
    intermediate_size=14336, num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=8,
    rope_theta=500000.0, max_position_embeddings=8192), BIG, seq=8192, vocab=128256)
add("mistral-7b" + layers(2), "transformers", "causal", hf(
    "MistralForCausalLM", "MistralConfig", num_hidden_layers=2, sliding_window=4096), BIG,
    modes=("train", "train-ckpt", "infer"), seq=4096, vocab=32000)
add("qwen2-0.5b", "transformers", "causal", hf(
    "Qwen2ForCausalLM", "Qwen2Config", vocab_size=151936, hidden_size=896,
    intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
    tie_word_embeddings=True, max_position_embeddings=32768), DEC,
    modes=("train", "train-varlen", "infer", "generate"), seq=2048, vocab=151936)
add("qwen3-0.6b", "transformers", "causal", hf(
    "Qwen3ForCausalLM", "Qwen3Config", vocab_size=151936, hidden_size=1024,
    intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
    head_dim=128, tie_word_embeddings=True, max_position_embeddings=40960), DEC,
    modes=("train", "train-ckpt", "infer"), seq=2048, vocab=151936)
add("gemma2-2b" + layers(4), "transformers", "causal", hf(
    "Gemma2ForCausalLM", "Gemma2Config", vocab_size=256000, hidden_size=2304,
    intermediate_size=9216, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
    head_dim=256, sliding_window=4096), BIG, seq=4096, vocab=256000)
add("phi-1.5", "transformers", "causal", hf(
    "PhiForCausalLM", "PhiConfig", vocab_size=51200, hidden_size=2048, intermediate_size=8192,
    num_hidden_layers=24, num_attention_heads=32, partial_rotary_factor=0.5), DEC, seq=2048,
    vocab=51200)
add("phi3-mini" + layers(4), "transformers", "causal", hf(
    "Phi3ForCausalLM", "Phi3Config", num_hidden_layers=4, max_position_embeddings=4096,
    original_max_position_embeddings=4096), BIG, seq=4096, vocab=32064)
add("falcon-7b" + layers(2), "transformers", "causal", hf(
    "FalconForCausalLM", "FalconConfig", vocab_size=65024, hidden_size=4544,
    num_hidden_layers=2, num_attention_heads=71, multi_query=True, parallel_attn=True,
    new_decoder_architecture=False, bias=False), BIG, seq=2048, vocab=65024)
add("starcoder2-3b" + layers(2), "transformers", "causal", hf(
    "Starcoder2ForCausalLM", "Starcoder2Config", vocab_size=49152, hidden_size=3072,
    intermediate_size=12288, num_hidden_layers=2, num_attention_heads=24, num_key_value_heads=2,
    sliding_window=4096), BIG, seq=4096, vocab=49152)
add("mamba-130m", "transformers", "causal", hf(
    "MambaForCausalLM", "MambaConfig", vocab_size=50280, hidden_size=768,
    num_hidden_layers=24), DEC, seq=256, vocab=50280)
# Mixture of experts, small configurations: routing is data dependent. Mixtral and Qwen2-MoE
# run their experts one by one ("eager"); OLMoE keeps the default grouped_mm, which under
# autocast gets the fp32 weights' dtype and runs on CUDA's fallback (one GEMM per expert).
add("mixtral-8x7b-small", "transformers", "causal", hf(
    "MixtralForCausalLM", "MixtralConfig", vocab_size=32000, hidden_size=1024,
    intermediate_size=3584, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
    num_local_experts=8, num_experts_per_tok=2, experts_implementation="eager"), DEC,
    seq=2048, vocab=32000)
add("qwen2-moe-small", "transformers", "causal", hf(
    "Qwen2MoeForCausalLM", "Qwen2MoeConfig", vocab_size=151936, hidden_size=1024,
    intermediate_size=2816, moe_intermediate_size=512, shared_expert_intermediate_size=2048,
    num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=16, num_experts=16,
    num_experts_per_tok=4, experts_implementation="eager"), DEC, seq=2048, vocab=151936)
add("olmoe-small", "transformers", "causal", hf(
    "OlmoeForCausalLM", "OlmoeConfig", vocab_size=50304, hidden_size=1024,
    intermediate_size=1024, num_hidden_layers=2, num_attention_heads=16, num_experts=16,
    num_experts_per_tok=4), DEC, seq=2048, vocab=50304)

S2S = (8, 32)
T5 = dict(pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
add("t5-small", "transformers", "seq2seq", hf(
    "T5ForConditionalGeneration", "T5Config", d_model=512, d_ff=2048, num_layers=6, num_heads=8,
    **T5), S2S, modes=("train", "train-varlen", "infer"), seq=512, tgt=128, vocab=32128)
add("t5-base", "transformers", "seq2seq", hf(
    "T5ForConditionalGeneration", "T5Config", d_model=768, d_ff=3072, num_layers=12,
    num_heads=12, **T5), S2S, modes=("train", "train-ckpt", "infer"), seq=512, tgt=128, vocab=32128)
add("mt5-small", "transformers", "seq2seq", hf(
    "MT5ForConditionalGeneration", "MT5Config", vocab_size=250112, **T5), S2S, seq=512, tgt=128,
    vocab=250112)
add("bart-base", "transformers", "seq2seq", hf(
    "BartForConditionalGeneration", "BartConfig", d_model=768, encoder_layers=6,
    decoder_layers=6, encoder_attention_heads=12, decoder_attention_heads=12,
    encoder_ffn_dim=3072, decoder_ffn_dim=3072), S2S, seq=512, tgt=128, vocab=50265)
add("marian-en-de", "transformers", "seq2seq", hf(
    "MarianMTModel", "MarianConfig", vocab_size=58101, decoder_vocab_size=58101,
    pad_token_id=58100, decoder_start_token_id=58100), S2S, seq=256, tgt=256, vocab=58100)
add("switch-base-8", "transformers", "seq2seq", hf(
    "SwitchTransformersForConditionalGeneration", "SwitchTransformersConfig", **T5), S2S, seq=512,
    tgt=128, vocab=32128)
add("whisper-base", "transformers", "whisper", hf(
    "WhisperForConditionalGeneration", "WhisperConfig", d_model=512, encoder_layers=6,
    decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8,
    encoder_ffn_dim=2048, decoder_ffn_dim=2048), S2S, tgt=128, vocab=51865)
add("wav2vec2-base", "transformers", "audio", hf(
    "Wav2Vec2ForSequenceClassification", "Wav2Vec2Config"), ENC, samples=160000)
add("ast-base", "transformers", "audio-spec", hf(
    "ASTForAudioClassification", "ASTConfig"), ENC, frames=1024, bins=128)

HFIMG = (32, 128)
add("dinov2-small", "transformers", "hf-image", hf(
    "Dinov2ForImageClassification", "Dinov2Config", hidden_size=384, num_attention_heads=6),
    HFIMG, modes=("train", "train-ckpt", "infer"), size=224)
add("segformer-b0", "transformers", "hf-segment", hf(
    "SegformerForSemanticSegmentation", "SegformerConfig", num_labels=150), (8, 16), size=512,
    classes=150)
add("clip-vit-b32", "transformers", "clip", hf("CLIPModel", "CLIPConfig"), (64, 256),
    size=224, seq=77, vocab=49408)
add("detr-resnet50", "transformers", "hf-detect", hf(
    "DetrForObjectDetection", "DetrConfig", use_timm_backbone=False,
    use_pretrained_backbone=False, backbone=None,
    backbone_config=("ResNetConfig", {"out_features": ["stage4"]})), (2, 8), size=800)

# ---- diffusers (not among the pinned packages: see bench/zoo/README.md) ----------------------
add("sd15-unet", "diffusers", "unet", df("UNet2DConditionModel", sample_size=64,
                                          cross_attention_dim=768), (8, 32),
    modes=("train", "train-ckpt", "infer"), latent=64, channels=4, context=(77, 768))
add("ddpm-unet-256", "diffusers", "unet", df(
    "UNet2DModel", sample_size=256, block_out_channels=(128, 128, 256, 256, 512, 512),
    down_block_types=("DownBlock2D",) * 4 + ("AttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "AttnUpBlock2D") + ("UpBlock2D",) * 4), (8, 32),
    latent=256, channels=3)


def by_name(name):
    for m in MODELS:
        if m.name == name:
            return m
    raise KeyError(name)


def workloads(models=None):
    """Every (model, mode, batch) of the corpus, in table order."""
    for m in models or MODELS:
        for mode in m.modes:
            for b in m.batches:
                yield m, mode, b


def trace_name(m, mode, batch):
    """The trace's path under bench/zoo/traces, gzip-compressed."""
    return f"{m.library}/{m.name}.{mode}.b{batch}.rep.gz"


# ---- inputs and losses -----------------------------------------------------------------------

def seq_lengths(m, steps):
    """The sequence lengths (or image sizes) of a train-varlen run: a fixed seed per model."""
    rng = random.Random(m.name)
    if "sizes" in m.opts:
        return [rng.choice(m.opts["sizes"]) for _ in range(steps)]
    top = m.opts["seq"]
    return [rng.randrange(top // 8, top + 1, 8) for _ in range(steps)]


def inputs(m, batch, dev, length=None):
    """The keyword inputs of one step (the targets included) on device `dev`."""
    import torch
    o, B, k = m.opts, batch, m.kind
    if k in ("image", "segment", "hf-image", "hf-segment", "detect", "hf-detect"):
        s = length or o.get("size") or image_size(m)
        h, w = (s, s) if isinstance(s, int) else s
        x = torch.randn(B, 3, h, w, device=dev)
        if k == "image":
            return {"x": x, "y": torch.randint(0, 1000, (B,), device=dev)}
        if k == "segment":
            return {"x": x, "y": torch.randint(0, o["classes"], (B, h, w), device=dev)}
        if k == "hf-image":
            return {"pixel_values": x, "labels": torch.randint(0, 2, (B,), device=dev)}
        if k == "hf-segment":
            return {"pixel_values": x,
                    "labels": torch.randint(0, o["classes"], (B, h, w), device=dev)}
        boxes = torch.tensor([[10.0, 20.0, 200.0, 240.0], [50.0, 60.0, 300.0, 280.0]],
                             device=dev)
        if k == "detect":
            t = {"boxes": boxes, "labels": torch.tensor([1, 2], device=dev)}
            if m.name.startswith("mask"):
                t["masks"] = torch.zeros(2, h, w, dtype=torch.uint8, device=dev)
            return {"x": list(x), "y": [dict(t) for _ in range(B)]}
        t = {"boxes": boxes / s, "class_labels": torch.tensor([1, 2], device=dev)}
        return {"pixel_values": x, "labels": [dict(t) for _ in range(B)]}
    if k == "flow":
        h, w = o["size"]
        return {"x": torch.randn(B, 3, h, w, device=dev), "x2": torch.randn(B, 3, h, w, device=dev),
                "y": torch.randn(B, 2, h, w, device=dev)}
    if k in ("video", "hf-video"):
        s, t = o["size"], o["frames"]
        if k == "video":
            return {"x": torch.randn(B, 3, t, s, s, device=dev),
                    "y": torch.randint(0, 400, (B,), device=dev)}
        return {"pixel_values": torch.randn(B, t, 3, s, s, device=dev),
                "labels": torch.randint(0, 2, (B,), device=dev)}
    if k in ("mlm", "cls", "causal", "seq2seq"):
        L = length or o["seq"]
        ids = torch.randint(0, o["vocab"], (B, L), device=dev)
        d = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if k == "cls":
            d["labels"] = torch.randint(0, 2, (B,), device=dev)
        elif k == "seq2seq":
            T = o["tgt"] if length is None else max(8, length // 4)
            d["labels"] = torch.randint(0, o["vocab"], (B, T), device=dev)
        else:
            d["labels"] = ids
        return d
    if k == "whisper":
        return {"input_features": torch.randn(B, 80, 3000, device=dev),
                "labels": torch.randint(0, o["vocab"], (B, o["tgt"]), device=dev)}
    if k == "audio":
        return {"input_values": torch.randn(B, o["samples"], device=dev),
                "labels": torch.randint(0, 2, (B,), device=dev)}
    if k == "audio-spec":
        return {"input_values": torch.randn(B, o["frames"], o["bins"], device=dev),
                "labels": torch.randint(0, 2, (B,), device=dev)}
    if k == "clip":
        s, L = o["size"], o["seq"]
        ids = torch.randint(0, o["vocab"], (B, L), device=dev)
        return {"input_ids": ids, "pixel_values": torch.randn(B, 3, s, s, device=dev),
                "return_loss": True} if m.name.startswith("clip") else {
            "input_ids": ids, "pixel_values": torch.randn(B, 3, s, s, device=dev)}
    if k == "unet":
        s, c = o["latent"], o["channels"]
        d = {"sample": torch.randn(B, c, s, s, device=dev),
             "timestep": torch.randint(0, 1000, (B,), device=dev),
             "noise": torch.randn(B, c, s, s, device=dev)}
        if "context" in o:
            d["encoder_hidden_states"] = torch.randn(B, *o["context"], device=dev)
        return d
    raise ValueError(f"{m.name}: unknown kind {k}")


def image_size(m):
    """A timm model's own input size; 224 otherwise."""
    if m.library == "timm":
        import timm
        cfg = timm.get_pretrained_cfg(m.name.split(".")[0])
        if cfg is not None and cfg.input_size:
            return cfg.input_size[-1]
    return 224


def forward(m, model, d):
    """The model's output for inputs `d` (targets left out)."""
    k = m.kind
    if k in ("image", "segment", "video"):
        return model(d["x"])
    if k == "detect":
        return model(d["x"], d["y"]) if model.training else model(d["x"])
    if k == "flow":
        return model(d["x"], d["x2"])
    if k == "unet":
        return model(**{key: v for key, v in d.items() if key != "noise"}).sample
    if not model.training:
        out = {key: v for key, v in d.items() if key not in ("labels", "return_loss")}
        if k in ("seq2seq", "whisper"):  # the decoder reads the targets, no loss
            out["decoder_input_ids"] = d["labels"]
        d = out
    return model(**d)


def loss(m, out, d):
    """The scalar training loss of output `out` for inputs `d`."""
    import torch
    import torch.nn.functional as F
    k = m.kind
    if k in ("image", "video"):
        if isinstance(out, tuple):   # inception's and googlenet's auxiliary logits
            return sum(F.cross_entropy(o, d["y"]) for o in out if o is not None)
        return F.cross_entropy(out, d["y"])
    if k == "segment":
        return sum(F.cross_entropy(o, d["y"]) for o in out.values())
    if k == "detect":
        return sum(out.values())
    if k == "flow":
        return sum((p - d["y"]).abs().mean() for p in out)
    if k == "unet":
        return F.mse_loss(out.float(), d["noise"])
    if k == "clip" and getattr(out, "loss", None) is None:
        return out.logits_per_image.float().logsumexp(-1).mean()
    return out.loss if isinstance(out.loss, torch.Tensor) else out["loss"]
