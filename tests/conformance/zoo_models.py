"""The model zoo: real PyTorch models, as people run them, for the conformance suite (zoo.py).

Each entry builds a torch.nn.Module (seeded, on the CPU, small enough for a real CPU step here:
small resolution, small batch; the Hugging Face models from their config classes, few layers,
small hidden size, no weights downloaded), its example inputs, its target and its loss. zoo.py
traces it with memest.trace and compares memest's estimate of the traced graph with the same
model measured by real PyTorch 1.13 on the CPU (zoo_measure.py).

Groups: torchvision classification (every architecture torchvision 0.14 has that runs a training
step at a small resolution on this machine in reasonable time: EXCLUDED says why the others are
left out), torchvision segmentation and detection, RNN language models, UNets with an up-path,
nn.Transformer models, and Hugging Face transformers models.

`ci=True` marks the representative subset scripts/test.sh runs (zoo.py --ci).
"""
import dataclasses
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

TRAIN = "training"
INFER = "inference"


@dataclasses.dataclass
class ZooModel:
    name: str
    group: str
    make: object            # () -> nn.Module
    inputs: object          # (batch, generator) -> tuple of tensors (the forward's arguments)
    target: object = None   # (batch, generator) -> the loss target, or None
    loss: object = "cross_entropy"  # what memest.trace takes: a name or a callable
    batch: int = 2
    modes: tuple = (TRAIN, INFER)
    ci: bool = False
    note: str = ""


MODELS = []

# Model modes of the CI subset that do not pass yet, and why (docs/fidelity.md's zoo section
# has every model's numbers). zoo.py does not fail on them, and says when one passes.
KNOWN = {
    ("hf_gemma", TRAIN): "saved 4 bytes short: the embedding normalizer, a 0-dim "
                         "torch.tensor(hidden_size ** 0.5) made in forward, traces as a constant "
                         "that its multiplication's saved tensors do not count",
    ("hf_gemma2", TRAIN): "saved 4 bytes short: the embedding normalizer, as hf_gemma's",
}


def add(name, group, make, inputs, **kw):
    MODELS.append(ZooModel(name, group, make, inputs, **kw))


def image(shape, high=None):
    """Inputs: a batch of images [B, *shape] (one allocation: the data phase measures it)."""
    def make(b, gen):
        return (torch.empty([b] + list(shape)).normal_(0.0, 1.0, generator=gen),)
    return make


def classes(n, extra=()):
    def make(b, gen):
        return torch.randint(0, n, [b] + list(extra), generator=gen)
    return make


def tokens(vocab, seq, n=1):
    def make(b, gen):
        return tuple(torch.randint(0, vocab, (b, seq), generator=gen) for _ in range(n))
    return make


def tokens_and_mask(vocab, seq):
    """Token ids and an attention mask of ones, as an encoder's training loop passes them."""
    def make(b, gen):
        return torch.randint(0, vocab, (b, seq), generator=gen), torch.ones(b, seq, dtype=torch.int64)
    return make


# ------------------------------------------------------------------ torchvision classification

# torchvision 0.14's classification models, each at num_classes=10 and the smallest input its
# architecture takes here (32 x 32 unless said), batch 2.
RESOLUTION = {"alexnet": 64, "inception_v3": 75, "googlenet": 32}
VIT_IMAGE = {"vit_b_16": 32, "vit_b_32": 32}
# Left out, with the reason: more than 150 M parameters, or more than 5 s for one training
# step at 32 x 32, batch 2, on this machine (2 shared cores, one thread; build/zoo.json of a run
# has each model's time).
EXCLUDED = {
    "convnext_large": "196 M parameters",
    "efficientnet_v2_l": "5.1 s a training step",
    "maxvit_t": "takes 224 x 224 only (a 7 x 7 window partition at every stage)",
    "regnet_x_32gf": "7.4 s a training step",
    "regnet_y_128gf": "638 M parameters",
    "regnet_y_16gf": "6.7 s a training step",
    "regnet_y_32gf": "8.5 s a training step",
    "resnext101_32x8d": "8.2 s a training step",
    "resnext101_64x4d": "6.7 s a training step",
    "swin_b": "18 s a training step",
    "swin_s": "6.3 s a training step",
    "swin_v2_b": "20 s a training step",
    "swin_v2_s": "over 6 s a training step (as swin_s)",
    "vit_h_14": "632 M parameters",
    "vit_l_16": "304 M parameters",
    "vit_l_32": "306 M parameters",
}
CI_TORCHVISION = {"resnet18", "mobilenet_v3_small", "squeezenet1_1", "shufflenet_v2_x0_5",
                  "densenet121", "regnet_x_400mf"}


def _torchvision(name):
    def make():
        from torchvision import models
        kw = {"num_classes": 10}
        if name in VIT_IMAGE:
            kw["image_size"] = VIT_IMAGE[name]
        if name in ("inception_v3", "googlenet"):
            kw.update(aux_logits=False, init_weights=False)
        return getattr(models, name)(**kw)
    return make


def _torchvision_classification():
    from torchvision import models
    for name in models.list_models(module=models):
        if name in EXCLUDED:
            continue
        r = RESOLUTION.get(name, 32)
        add(name, "torchvision classification", _torchvision(name), image([3, r, r]),
            target=classes(10), ci=name in CI_TORCHVISION,
            note=f"num_classes=10, input [2, 3, {r}, {r}]")


# ------------------------------------------------------------------ segmentation and detection

def _pixel_ce(out, tgt):
    return F.cross_entropy(out, tgt)


def _segmentation(name):
    def make():
        from torchvision.models import segmentation
        kw = {"num_classes": 5, "weights_backbone": None}
        if not name.startswith("lraspp"):
            kw["aux_loss"] = False
        return getattr(segmentation, name)(**kw)
    return make


class Detector(nn.Module):
    """A torchvision detector in inference on a batch tensor (its forward takes a list of
    images): the scores of every detection, concatenated."""

    def __init__(self, name):
        super().__init__()
        from torchvision.models import detection
        self.model = getattr(detection, name)(num_classes=5, weights_backbone=None)

    def forward(self, images):
        out = self.model(list(images.unbind(0)))
        return torch.cat([d["scores"] for d in out])


def _segmentation_and_detection():
    for name in ("fcn_resnet50", "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large"):
        add(name, "torchvision segmentation", _segmentation(name), image([3, 64, 64]),
            target=classes(5, (64, 64)), loss=_pixel_ce, note="num_classes=5, input [2, 3, 64, 64]")
    for name in ("ssdlite320_mobilenet_v3_large", "fasterrcnn_mobilenet_v3_large_320_fpn"):
        add(name, "torchvision detection", (lambda n=name: Detector(n)), image([3, 96, 96]),
            loss=None, modes=(INFER,), note="inference, num_classes=5, input [2, 3, 96, 96]")


# ------------------------------------------------------------------ RNN language models

class RnnLM(nn.Module):
    """Embedding -> 2-layer nn.LSTM / nn.GRU (batch_first) -> linear decoder over the vocab."""

    def __init__(self, cell, vocab=256, emb=32, hidden=64, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, emb)
        self.rnn = getattr(nn, cell)(emb, hidden, layers, batch_first=True)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, ids):
        h, _ = self.rnn(self.embed(ids))
        return self.decoder(h)


class EmbeddingBagClassifier(nn.Module):
    """torchtext's text classifier: nn.EmbeddingBag (mean) over each sample's tokens -> linear."""

    def __init__(self, vocab=256, emb=32, n=4):
        super().__init__()
        self.bag = nn.EmbeddingBag(vocab, emb, mode="mean")
        self.fc = nn.Linear(emb, n)

    def forward(self, ids):
        return self.fc(self.bag(ids))


def _rnns():
    for cell in ("LSTM", "GRU"):
        add(f"{cell.lower()}_lm", "RNN language models", (lambda c=cell: RnnLM(c)),
            tokens(256, 16), target=classes(256, (16,)), ci=cell == "LSTM",
            note="vocab 256, embedding 32, 2 layers of 64, sequence 16")
    add("embedding_bag_classifier", "RNN language models", EmbeddingBagClassifier, tokens(256, 16),
        target=classes(4), note="nn.EmbeddingBag(mean), vocab 256, 16 tokens a sample")


# ------------------------------------------------------------------ UNets

class UNet(nn.Module):
    """The UNet of Ronneberger et al., small: double conv (conv3x3-BN-ReLU x 2) blocks, max-pool
    down, up by ConvTranspose2d(2, stride 2) or bilinear upsampling + conv1x1, skip connections
    concatenated, 1x1 head to per-pixel classes."""

    def __init__(self, widths=(8, 16, 32, 64), classes=3, bilinear=False):
        super().__init__()

        def double(cin, cout):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                                 nn.ReLU(inplace=True), nn.Conv2d(cout, cout, 3, padding=1, bias=False),
                                 nn.BatchNorm2d(cout), nn.ReLU(inplace=True))
        self.down = nn.ModuleList()
        cin = 3
        for w in widths:
            self.down.append(double(cin, w))
            cin = w
        self.up = nn.ModuleList()
        self.dec = nn.ModuleList()
        for w in reversed(widths[:-1]):
            if bilinear:
                self.up.append(nn.Sequential(nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False),
                                             nn.Conv2d(cin, w, 1)))
            else:
                self.up.append(nn.ConvTranspose2d(cin, w, 2, stride=2))
            self.dec.append(double(2 * w, w))
            cin = w
        self.head = nn.Conv2d(cin, classes, 1)

    def forward(self, x):
        skips = []
        for i, block in enumerate(self.down):
            x = block(x)
            if i < len(self.down) - 1:
                skips.append(x)
                x = F.max_pool2d(x, 2)
        for up, dec in zip(self.up, self.dec):
            x = dec(torch.cat([skips.pop(), up(x)], dim=1))
        return self.head(x)


def _unets():
    add("unet_transposed", "UNets", UNet, image([3, 32, 32]), target=classes(3, (32, 32)),
        loss=_pixel_ce, ci=True, note="widths 8-16-32-64, ConvTranspose2d up-path, input [2, 3, 32, 32]")
    add("unet_bilinear", "UNets", (lambda: UNet(bilinear=True)), image([3, 32, 32]),
        target=classes(3, (32, 32)), loss=_pixel_ce,
        note="widths 8-16-32-64, bilinear upsampling + 1x1 conv up-path, input [2, 3, 32, 32]")


# ------------------------------------------------------------------ nn.Transformer

class EncoderClassifier(nn.Module):
    """Token embedding + learned positions -> nn.TransformerEncoder -> mean over tokens -> linear."""

    def __init__(self, vocab=256, d=64, heads=4, layers=2, seq=16, n=4, **layer_kw):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(1, seq, d))
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, batch_first=True, **layer_kw)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(d, n)

    def forward(self, ids):
        return self.head(self.encoder(self.embed(ids) + self.pos).mean(dim=1))


class SelfAttentionClassifier(nn.Module):
    """Token embedding -> nn.MultiheadAttention over itself (batch first, no dropout: in
    inference 1.13 runs _native_multi_head_attention), its weights kept as a local until
    forward returns -> mean over tokens -> linear."""

    def __init__(self, vocab=256, d=64, heads=4, n=4, average=True):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.head = nn.Linear(d, n)
        self.average = average

    def forward(self, ids):
        x = self.embed(ids)
        out, weights = self.attn(x, x, x, average_attn_weights=self.average)
        return self.head(out.mean(dim=1))


class Seq2Seq(nn.Module):
    """nn.Transformer (encoder and decoder, batch_first) over source and target token ids, a
    causal mask on the target (nn.Transformer.generate_square_subsequent_mask), a linear
    decoder over the vocab."""

    def __init__(self, vocab=256, d=64, heads=4, layers=2):
        super().__init__()
        self.src_embed = nn.Embedding(vocab, d)
        self.tgt_embed = nn.Embedding(vocab, d)
        self.transformer = nn.Transformer(d, heads, layers, layers, 4 * d, dropout=0.1, batch_first=True)
        self.out = nn.Linear(d, vocab)

    def forward(self, src, tgt):
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        h = self.transformer(self.src_embed(src), self.tgt_embed(tgt), tgt_mask=mask)
        return self.out(h)


def _transformers_nn():
    add("transformer_encoder", "nn.Transformer", EncoderClassifier, tokens(256, 16), target=classes(4),
        ci=True, note="d_model 64, 4 heads, 2 layers, sequence 16")
    add("transformer_encoder_prenorm", "nn.Transformer",
        lambda: EncoderClassifier(norm_first=True, activation="gelu"), tokens(256, 16),
        target=classes(4), ci=True, note="as transformer_encoder, norm_first and gelu")
    add("self_attention", "nn.Transformer", SelfAttentionClassifier, tokens(256, 16),
        target=classes(4), ci=True, note="nn.MultiheadAttention d 64, 4 heads, weights averaged")
    add("self_attention_heads", "nn.Transformer",
        lambda: SelfAttentionClassifier(average=False), tokens(256, 16), target=classes(4),
        note="as self_attention, the weights per head")
    add("transformer_seq2seq", "nn.Transformer", Seq2Seq, tokens(256, 16, n=2),
        target=classes(256, (16,)), note="nn.Transformer d_model 64, 4 heads, 2+2 layers, sequence 16")


# ------------------------------------------------------------------ Hugging Face transformers

class HFSeq2Seq(nn.Module):
    """An encoder-decoder (T5, BART) called as a training loop calls it: input ids and decoder
    input ids, the logits out."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.full_output = False  # the whole Seq2SeqLMOutput (the cache, the encoder's output)

    def forward(self, input_ids, decoder_input_ids):
        out = self.model(input_ids=input_ids, decoder_input_ids=decoder_input_ids)
        return out if self.full_output else out.logits


def route_experts(model, load):
    """Makes the routers of a Hugging Face MoE model (Mixtral, Qwen2-MoE) route as memest's
    config.expert_load `load` assumes, whatever the data: a forward hook on every router (`gate`)
    rewrites its logits in place under no_grad, with fill_ on views, so that nothing is allocated
    and autograd keeps what it keeps for a real router (the router's backward needs its input
    and weight, not its output). "worst": every token's largest logits are the last k experts;
    "balanced": token i's are the k experts of group i % (E / k), each expert taking N * k / E
    tokens (E a multiple of k, N a multiple of E / k)."""
    import torch

    def hook(block):
        e, k = block.num_experts, block.top_k

        def rewrite(module, args, out):
            with torch.no_grad():
                out.zero_()
                if load == "worst":
                    out[:, e - k:].fill_(1.0)
                else:
                    groups = e // k
                    grouped = out.view(out.shape[0] // groups, groups, e)
                    for g in range(groups):
                        grouped[:, g, g * k:(g + 1) * k].fill_(1.0)
        return rewrite

    blocks = [m for m in model.modules() if type(m).__name__.endswith("SparseMoeBlock")]
    for block in blocks:
        block.gate.register_forward_hook(hook(block))
    return model


def _hf(cls_name, cfg_name, seq2seq=False, route=None, **cfg):
    def make():
        import transformers
        transformers.logging.set_verbosity_error()
        config = getattr(transformers, cfg_name)(**cfg)
        config.use_cache = False  # training and a single forward: no KV cache
        model = getattr(transformers, cls_name)(config)
        if route:
            route_experts(model, route)
        return HFSeq2Seq(model) if seq2seq else model
    return make


HF_VOCAB = 512
HF_SMALL = dict(vocab_size=HF_VOCAB)
# Encoders get the attention mask too (what their loops pass: the models check the ids for
# padding when it is missing); decoders run without one (packed sequences, causal mask only).
HF_MASKED = {"bert", "roberta", "distilbert"}
HF = [
    # name, model class, config class, config, ci
    ("bert", "BertForMaskedLM", "BertConfig",
     dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
          max_position_embeddings=64), True),
    ("roberta", "RobertaForMaskedLM", "RobertaConfig",
     dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
          max_position_embeddings=80), False),
    ("distilbert", "DistilBertForMaskedLM", "DistilBertConfig",
     dict(dim=64, n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=64), False),
    ("gpt2", "GPT2LMHeadModel", "GPT2Config", dict(n_embd=64, n_layer=2, n_head=4, n_positions=64), True),
    ("gpt_neo", "GPTNeoForCausalLM", "GPTNeoConfig",
     dict(hidden_size=64, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]],
          window_size=8, max_position_embeddings=64), False),
    ("opt", "OPTForCausalLM", "OPTConfig",
     dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=128,
          word_embed_proj_dim=64, max_position_embeddings=64), False),
    ("opt_350m", "OPTForCausalLM", "OPTConfig",
     dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=128,
          word_embed_proj_dim=32, do_layer_norm_before=False, max_position_embeddings=64), False),
    ("falcon", "FalconForCausalLM", "FalconConfig",
     dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4), False),
    ("falcon_40b", "FalconForCausalLM", "FalconConfig",
     dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_kv_heads=2,
          new_decoder_architecture=True, bias=True), False),
    ("llama", "LlamaForCausalLM", "LlamaConfig",
     dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
          intermediate_size=128, max_position_embeddings=64), True),
    ("mistral", "MistralForCausalLM", "MistralConfig",
     dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
          intermediate_size=128, max_position_embeddings=64, sliding_window=8), False),
    ("qwen2", "Qwen2ForCausalLM", "Qwen2Config",
     dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
          intermediate_size=128, max_position_embeddings=64), False),
    ("gemma", "GemmaForCausalLM", "GemmaConfig",
     dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
          head_dim=16, intermediate_size=128, max_position_embeddings=64), False),
    ("gemma2", "Gemma2ForCausalLM", "Gemma2Config",
     dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
          head_dim=16, intermediate_size=128, max_position_embeddings=64, sliding_window=8),
     False),
    ("phi3", "Phi3ForCausalLM", "Phi3Config",
     dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
          intermediate_size=128, max_position_embeddings=64, pad_token_id=0), False),
    ("gpt_neox", "GPTNeoXForCausalLM", "GPTNeoXConfig",
     dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
          max_position_embeddings=64), False),
    ("mixtral", "MixtralForCausalLM", "MixtralConfig",
     dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
          intermediate_size=96, max_position_embeddings=64, num_local_experts=4,
          num_experts_per_tok=2), False),
    ("qwen2_moe", "Qwen2MoeForCausalLM", "Qwen2MoeConfig",
     dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
          intermediate_size=128, max_position_embeddings=64, num_experts=4, num_experts_per_tok=2,
          moe_intermediate_size=48, shared_expert_intermediate_size=96, norm_topk_prob=True),
     False),
    ("phi", "PhiForCausalLM", "PhiConfig",
     dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
          max_position_embeddings=64), False),
]
HF_SEQ2SEQ = [
    ("t5", "T5ForConditionalGeneration", "T5Config",
     dict(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4), True),
    ("bart", "BartForConditionalGeneration", "BartConfig",
     dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
          decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
          max_position_embeddings=64), False),
]
HF_SEQ = 16
# How the zoo's MoE models route (route_experts), and memest's matching --expert-load.
HF_ROUTES = {"mixtral": "worst", "qwen2_moe": "balanced"}


def _hugging_face():
    for name, cls, cfg, kw, ci in HF:
        masked = name in HF_MASKED
        add(f"hf_{name}", "Hugging Face transformers",
            _hf(cls, cfg, route=HF_ROUTES.get(name), **HF_SMALL, **kw),
            tokens_and_mask(HF_VOCAB, HF_SEQ) if masked else tokens(HF_VOCAB, HF_SEQ),
            target=classes(HF_VOCAB, (HF_SEQ,)), ci=ci,
            note=f"{cls}, vocab {HF_VOCAB}, {', '.join(f'{k}={v}' for k, v in kw.items())}, sequence {HF_SEQ}"
                 + (", input_ids and attention_mask" if masked else ", input_ids"))
    for name, cls, cfg, kw, ci in HF_SEQ2SEQ:
        add(f"hf_{name}", "Hugging Face transformers", _hf(cls, cfg, seq2seq=True, **HF_SMALL, **kw),
            tokens(HF_VOCAB, HF_SEQ, n=2), target=classes(HF_VOCAB, (HF_SEQ,)), ci=ci,
            note=f"{cls}, vocab {HF_VOCAB}, {', '.join(f'{k}={v}' for k, v in kw.items())}, sequence {HF_SEQ}")
    add("hf_vit", "Hugging Face transformers",
        _hf("ViTForImageClassification", "ViTConfig", hidden_size=64, num_hidden_layers=2,
            num_attention_heads=4, intermediate_size=128, image_size=32, patch_size=8, num_labels=10),
        image([3, 32, 32]), target=classes(10), ci=True,
        note="ViTForImageClassification, hidden 64, 2 layers, 4 heads, patch 8, input [2, 3, 32, 32]")


def all_models():
    if not MODELS:
        _torchvision_classification()
        _segmentation_and_detection()
        _rnns()
        _unets()
        _transformers_nn()
        _hugging_face()
    return MODELS


def find(name):
    for m in all_models():
        if m.name == name:
            return m
    raise KeyError(name)
