#!/usr/bin/env python3
"""PyTorch reference for loom's GPT model (run with /usr/bin/python3, Debian python3-torch).

Builds GPT-2 (pre-LN blocks, causal attention, GELU tanh, tied LM head) with random weights,
runs one forward/backward on a fixed batch and then 10 AdamW steps, and writes a JSON
fixture: config, tokens, targets, every parameter in loom's order and layout
(docs/architecture.md: units), logits, loss, every parameter's gradient, and the 10 losses.

    /usr/bin/python3 gpt_fixture.py OUT.json
"""
import json
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(1234)
torch.set_num_threads(1)
cfg = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=97, padded_vocab_size=128)
B, T = 2, 12
L, NH, C, V = cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["vocab_size"]


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.attproj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C)
        self.fcproj = nn.Linear(4 * C, C)

    def forward(self, x):
        h = self.ln1(x)
        q, k, v = self.qkv(h).split(C, dim=2)
        hs = C // NH
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.attproj(y)
        x = x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(cfg["block_size"], C)
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.lnf = nn.LayerNorm(C)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.T  # tied head
        return logits, F.cross_entropy(logits.view(-1, V), targets.view(-1))


model = GPT()
with torch.no_grad():  # random everything, so every gradient is exercised
    for name, p in model.named_parameters():
        if "ln" in name and name.endswith("weight"):
            p.copy_(1 + 0.1 * torch.randn_like(p))
        elif name.endswith("bias"):
            p.copy_(0.1 * torch.randn_like(p))
        else:
            p.copy_(0.1 * torch.randn_like(p))


def loom_order(m):
    """(name, tensor) in loom's flat layout: wte, wpe, blocks (12 each), lnf w and b."""
    out = [("wte", m.wte.weight), ("wpe", m.wpe.weight)]
    for i, b in enumerate(m.blocks):
        for n, t in [("ln1w", b.ln1.weight), ("ln1b", b.ln1.bias), ("qkvw", b.qkv.weight),
                     ("qkvb", b.qkv.bias), ("attprojw", b.attproj.weight), ("attprojb", b.attproj.bias),
                     ("ln2w", b.ln2.weight), ("ln2b", b.ln2.bias), ("fcw", b.fc.weight),
                     ("fcb", b.fc.bias), ("fcprojw", b.fcproj.weight), ("fcprojb", b.fcproj.bias)]:
            out.append((f"h{i}.{n}", t))
    out += [("lnfw", m.lnf.weight), ("lnfb", m.lnf.bias)]
    return out


tokens = torch.randint(0, V, (B, T))
targets = torch.randint(0, V, (B, T))
params = {n: t.detach().flatten().tolist() for n, t in loom_order(model)}
logits, loss = model(tokens, targets)
loss.backward()
fixture = dict(config=cfg, B=B, T=T, tokens=tokens.flatten().tolist(),
               targets=targets.flatten().tolist(), params=params,
               logits=logits.detach().flatten().tolist(), loss=loss.item(),
               grads={n: t.grad.flatten().tolist() for n, t in loom_order(model)})

# 10 AdamW steps on the same batch: decay on matrices and embeddings, not biases or norms.
decay = [t for n, t in loom_order(model) if t.dim() >= 2]
no_decay = [t for n, t in loom_order(model) if t.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                         {"params": no_decay, "weight_decay": 0.0}],
                        lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
losses = []
for step in range(10):
    opt.zero_grad()
    _, l = model(tokens, targets)
    losses.append(l.item())
    l.backward()
    opt.step()
fixture["adamw"] = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, losses=losses)
with open(sys.argv[1], "w") as f:
    json.dump(fixture, f)
print(f"wrote {sys.argv[1]}: loss {loss.item():.6f}, {sum(len(v) for v in params.values())} parameters")
