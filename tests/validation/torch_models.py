"""The models of the three-way validation in plain torch.nn, as memest's presets describe them
(engine/models/presets.cc), and the training step three_way.py measures.

Each model takes the preset's parameter values and a device ("meta" to count without memory);
its forward takes (inputs, labels) and returns the loss, as Hugging Face models do when given
labels. Standard library and torch only (no torchvision, no transformers: the GPU image may
lack them); tests/validation/test_three_way_models.py checks them against memest on the CPU.
"""
import contextlib
import math

try:
    import torch
    from torch import nn
    import torch.nn.functional as F
except ImportError:  # three_way.py's estimate column needs no torch
    torch = nn = F = None

# The models below subclass this; without torch they can still be defined (not built).
_Module = nn.Module if nn is not None else object


def _causal_mask(positions, device):
    if torch.device(device).type == "meta":
        return torch.empty((1, 1, positions, positions), dtype=torch.bool, device=device)
    mask = torch.tril(torch.ones((positions, positions), dtype=torch.bool, device=device))
    return mask.view(1, 1, positions, positions)


class Conv1D(_Module):
    """HF's Conv1D: a linear layer with its weight stored [in, out], computed with addmm."""

    def __init__(self, nf, nx, device):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf, device=device))
        self.bias = nn.Parameter(torch.zeros(nf, device=device))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


def gelu_new(x):
    """HF's NewGELUActivation (ACT2FN["gelu_new"]): the tanh GELU, written out as HF does."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class Gpt2Attention(_Module):
    """HF GPT2Attention with eager attention: a causal `bias` buffer per layer, torch.where with
    finfo.min, softmax, the cast back to the values' dtype, dropout."""

    def __init__(self, d, heads, positions, p, device):
        super().__init__()
        self.heads, self.head_dim = heads, d // heads
        self.register_buffer("bias", _causal_mask(positions, device), persistent=False)
        self.c_attn = Conv1D(3 * d, d, device)
        self.c_proj = Conv1D(d, d, device)
        self.attn_dropout = nn.Dropout(p)
        self.resid_dropout = nn.Dropout(p)

    def forward(self, x):
        n, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q = q.view(n, t, -1, self.head_dim).transpose(1, 2)
        k = k.view(n, t, -1, self.head_dim).transpose(1, 2)
        v = v.view(n, t, -1, self.head_dim).transpose(1, 2)
        w = torch.matmul(q, k.transpose(-1, -2))
        w = w / torch.full([], v.size(-1) ** 0.5, dtype=w.dtype, device=w.device)
        causal = self.bias[:, :, :t, :t]
        mask_value = torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype, device=w.device)
        w = torch.where(causal, w, mask_value)
        w = F.softmax(w, dim=-1)
        w = w.type(v.dtype)  # under autocast softmax returns float32; HF casts it back
        w = self.attn_dropout(w)
        out = torch.matmul(w, v).transpose(1, 2)
        out = out.reshape(n, t, d).contiguous()
        return self.resid_dropout(self.c_proj(out))


class Gpt2Block(_Module):
    def __init__(self, d, heads, positions, p, device):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d, eps=1e-5, device=device)
        self.attn = Gpt2Attention(d, heads, positions, p, device)
        self.ln_2 = nn.LayerNorm(d, eps=1e-5, device=device)
        self.c_fc = Conv1D(4 * d, d, device)  # mlp.c_fc
        self.c_proj = Conv1D(d, 4 * d, device)  # mlp.c_proj
        self.dropout = nn.Dropout(p)  # mlp.dropout

    def forward(self, x):
        x = self.attn(self.ln_1(x)) + x
        h = self.dropout(self.c_proj(gelu_new(self.c_fc(self.ln_2(x)))))
        return x + h


class Gpt2LMHead(_Module):
    """HF GPT2LMHeadModel: wte + wpe (n_positions = max(1024, seq)), dropout, pre-LN blocks,
    ln_f, lm_head tied to wte; the loss as HF's ForCausalLMLoss computes it (logits.float(),
    cross_entropy over the vocabulary; the label shift, a few int64 bytes, is left out)."""

    def __init__(self, v, device):
        super().__init__()
        d, heads, vocab = v["d_model"], v["heads"], v["vocab"]
        positions = max(1024, v["seq"])
        self.wte = nn.Embedding(vocab, d, device=device)
        self.wpe = nn.Embedding(positions, d, device=device)
        self.drop = nn.Dropout(0.1)
        self.h = nn.ModuleList(Gpt2Block(d, heads, positions, 0.1, device) for _ in range(v["layers"]))
        self.ln_f = nn.LayerNorm(d, eps=1e-5, device=device)
        self.lm_head = nn.Linear(d, vocab, bias=False, device="meta")
        self.tie_weights()

    def tie_weights(self):
        self.lm_head.weight = self.wte.weight

    def forward(self, input_ids, labels):
        t = input_ids.size(1)
        position_ids = torch.arange(0, t, dtype=torch.long, device=input_ids.device).unsqueeze(0)
        h = self.drop(self.wte(input_ids) + self.wpe(position_ids))
        for block in self.h:
            h = block(h)
        logits = self.lm_head(self.ln_f(h)).float()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1))


class BertLayer(_Module):
    """HF BertLayer (post-LN), eager attention without an attention mask (no padding)."""

    def __init__(self, d, heads, p, device):
        super().__init__()
        self.heads, self.head_dim = heads, d // heads
        self.query = nn.Linear(d, d, device=device)
        self.key = nn.Linear(d, d, device=device)
        self.value = nn.Linear(d, d, device=device)
        self.attn_dropout = nn.Dropout(p)
        self.attn_dense = nn.Linear(d, d, device=device)  # attention.output.dense
        self.attn_ln = nn.LayerNorm(d, eps=1e-12, device=device)
        self.intermediate = nn.Linear(d, 4 * d, device=device)
        self.output = nn.Linear(4 * d, d, device=device)
        self.out_ln = nn.LayerNorm(d, eps=1e-12, device=device)
        self.dropout = nn.Dropout(p)

    def _heads(self, x):
        n, t, _ = x.shape
        return x.view(n, t, self.heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, h):
        n, t, d = h.shape
        q = self.query(h)
        k = self._heads(self.key(h))
        v = self._heads(self.value(h))
        q = self._heads(q)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        probs = self.attn_dropout(F.softmax(scores, dim=-1))
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous().view(n, t, d)
        h = self.attn_ln(self.dropout(self.attn_dense(ctx)) + h)
        f = self.dropout(self.output(F.gelu(self.intermediate(h))))
        return self.out_ln(f + h)


class BertForMaskedLM(_Module):
    """HF BertForMaskedLM: embeddings (word, token type, position; position_ids and
    token_type_ids buffers of 512), post-LN encoder, cls.predictions (dense, GELU, LayerNorm,
    decoder tied to the word embeddings with its own bias); cross_entropy at every position."""

    def __init__(self, v, device):
        super().__init__()
        d, vocab, positions = v["d_model"], v["vocab"], 512
        self.register_buffer("position_ids", torch.arange(positions, device=device).expand((1, -1)),
                             persistent=False)
        self.register_buffer("token_type_ids", torch.zeros((1, positions), dtype=torch.long, device=device),
                             persistent=False)
        self.word_embeddings = nn.Embedding(vocab, d, padding_idx=0, device=device)
        self.position_embeddings = nn.Embedding(positions, d, device=device)
        self.token_type_embeddings = nn.Embedding(2, d, device=device)
        self.emb_ln = nn.LayerNorm(d, eps=1e-12, device=device)
        self.emb_dropout = nn.Dropout(0.1)
        self.layer = nn.ModuleList(BertLayer(d, v["heads"], 0.1, device) for _ in range(v["layers"]))
        self.transform = nn.Linear(d, d, device=device)
        self.transform_ln = nn.LayerNorm(d, eps=1e-12, device=device)
        self.decoder = nn.Linear(d, vocab, bias=False, device="meta")
        self.bias = nn.Parameter(torch.zeros(vocab, device=device))
        self.tie_weights()

    def tie_weights(self):
        self.decoder.weight = self.word_embeddings.weight
        self.decoder.bias = self.bias

    def forward(self, input_ids, labels):
        n, t = input_ids.shape
        token_type_ids = self.token_type_ids[:, :t].expand(n, t)
        e = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        e += self.position_embeddings(self.position_ids[:, :t])
        h = self.emb_dropout(self.emb_ln(e))
        for layer in self.layer:
            h = layer(h)
        h = self.transform_ln(F.gelu(self.transform(h)))
        logits = self.decoder(h)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1))


class BasicBlock(_Module):
    """torchvision BasicBlock."""
    expansion = 1

    def __init__(self, inplanes, planes, stride, device):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False, device=device)
        self.bn1 = nn.BatchNorm2d(planes, device=device)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False, device=device)
        self.bn2 = nn.BatchNorm2d(planes, device=device)
        self.downsample = _downsample(inplanes, planes, stride, device)

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class Bottleneck(_Module):
    """torchvision Bottleneck (stride on the 3x3 conv)."""
    expansion = 4

    def __init__(self, inplanes, planes, stride, device):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False, device=device)
        self.bn1 = nn.BatchNorm2d(planes, device=device)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False, device=device)
        self.bn2 = nn.BatchNorm2d(planes, device=device)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False, device=device)
        self.bn3 = nn.BatchNorm2d(planes * 4, device=device)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _downsample(inplanes, planes * 4, stride, device)

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


def _downsample(inplanes, out_channels, stride, device):
    if stride == 1 and inplanes == out_channels:
        return None
    return nn.Sequential(nn.Conv2d(inplanes, out_channels, 1, stride, bias=False, device=device),
                         nn.BatchNorm2d(out_channels, device=device))


class ResNet(_Module):
    """torchvision ResNet: conv 7x7/2, BatchNorm, in-place ReLU, max pool 3x3/2, four stages,
    adaptive average pool, flatten, fc; cross_entropy over the classes."""

    def __init__(self, block, depths, v, device):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False, device=device)
        self.bn1 = nn.BatchNorm2d(64, device=device)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages, inplanes = [], 64
        for i, depth in enumerate(depths):
            planes = 64 << i
            blocks = []
            for j in range(depth):
                blocks.append(block(inplanes, planes, 2 if (i > 0 and j == 0) else 1, device))
                inplanes = planes * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(inplanes, v["classes"], device=device)

    def forward(self, images, labels):
        x = self.maxpool(self.relu(self.bn1(self.conv1(images))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        logits = self.fc(torch.flatten(self.avgpool(x), 1))
        return F.cross_entropy(logits, labels)


class Mlp(_Module):
    """memest's mlp preset: `layers` x (Linear(width), ReLU), then Linear(classes)."""

    def __init__(self, v, device):
        super().__init__()
        widths = [v["input"]] + [v["width"]] * v["layers"]
        self.layers = nn.ModuleList(nn.Linear(a, b, device=device) for a, b in zip(widths, widths[1:]))
        self.head = nn.Linear(widths[-1], v["classes"], device=device)

    def forward(self, x, labels):
        for fc in self.layers:
            x = F.relu(fc(x))
        return F.cross_entropy(self.head(x), labels)


def build_model(preset, values, device):
    """The PyTorch model of a memest preset, with the preset's parameter values."""
    if preset.startswith("gpt2"):
        return Gpt2LMHead(values, device)
    if preset.startswith("bert"):
        return BertForMaskedLM(values, device)
    if preset == "resnet18":
        return ResNet(BasicBlock, [2, 2, 2, 2], values, device)
    if preset == "resnet50":
        return ResNet(Bottleneck, [3, 4, 6, 3], values, device)
    if preset == "mlp":
        return Mlp(values, device)
    raise ValueError(f"no PyTorch model for preset {preset!r}")


def make_batch(preset, values, batch, device):
    """(inputs, labels) of one step, as memest's preset declares them."""
    if preset.startswith(("gpt2", "bert")):
        shape = (batch, values["seq"])
        return (torch.randint(0, values["vocab"], shape, device=device),
                torch.randint(0, values["vocab"], shape, device=device))
    if preset.startswith("resnet"):
        image = values["image"]
        return (torch.randn(batch, 3, image, image, device=device),
                torch.randint(0, values["classes"], (batch,), device=device))
    if preset == "mlp":
        return (torch.randn(batch, values["input"], device=device),
                torch.randint(0, values["classes"], (batch,), device=device))
    raise ValueError(f"no batch for preset {preset!r}")


def parameter_count(model):
    return sum(p.numel() for p in model.parameters())  # tied weights counted once


def state_bytes(model):
    """Bytes of the parameters and buffers (what memest's `parameters` category holds)."""
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


def make_optimizer(kind, params):
    """memest's --optimizer with its defaults: foreach, no weight decay."""
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0, foreach=True)
    if kind == "momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, weight_decay=0.0, foreach=True)
    raise ValueError(f"no PyTorch optimizer for {kind!r}")


def train_step(model, optimizer, preset, values, batch, device, autocast_dtype):
    """One step as memest's step model runs it: data, forward + loss (under autocast for
    bf16), backward, drop the batch and the loss, optimizer.step(), zero_grad(set_to_none)."""
    inputs, labels = make_batch(preset, values, batch, device)
    autocast = (torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype is not None
                else contextlib.nullcontext())
    with autocast:
        loss = model(inputs, labels)
    loss.backward()
    value = loss.detach().item() if device.type != "cuda" else None
    del inputs, labels, loss
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return value
