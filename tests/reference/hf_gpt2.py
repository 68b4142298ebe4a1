"""An independent reader of Hugging Face GPT-2 folders, for checking `loom export --format hf`
(run with /usr/bin/python3: Debian python3-torch; transformers and safetensors are not
packaged, so neither is used).

read_safetensors() parses the file from its documented layout (8-byte header length, JSON
header, raw little-endian data) without any loom code; gpt2_logits() is GPT2LMHeadModel's
forward written from Hugging Face's modeling_gpt2 conventions: Conv1D weights are (in, out)
and applied as x @ W + b, c_attn's columns are q, k, v, GELU is "gelu_new" (tanh), the LM
head is the transposed token embedding.
"""
import json
import math
import struct

import torch
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
SIZES = {"F32": 4, "F16": 2, "BF16": 2}


def read_safetensors(path):
    """{name: float32 tensor} and the metadata; checks offsets against the file."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    out, end = {}, 0
    for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, e = t["data_offsets"]
        assert b == end, "%s: a hole or an overlap at %d" % (name, b)
        count = math.prod(t["shape"]) if t["shape"] else 1
        assert e - b == count * SIZES[t["dtype"]], name
        buf = bytearray(data[b:e])
        out[name] = torch.frombuffer(buf, dtype=DTYPES[t["dtype"]]).reshape(t["shape"]).float()
        end = e
    assert end == len(data), "data not covered exactly"
    return out, meta


def gpt2_logits(w, config, tokens):
    """Logits (T, vocab) of one sequence; w holds GPT2LMHeadModel's tensors by name."""
    p = "transformer." if "transformer.wte.weight" in w else ""
    C, NH = config["n_embd"], config["n_head"]
    eps = config["layer_norm_epsilon"]
    T = len(tokens)
    idx = torch.tensor(tokens)
    x = w[p + "wte.weight"][idx] + w[p + "wpe.weight"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(config["n_layer"]):
        h = "%sh.%d." % (p, i)
        a = F.layer_norm(x, (C,), w[h + "ln_1.weight"], w[h + "ln_1.bias"], eps)
        qkv = a @ w[h + "attn.c_attn.weight"] + w[h + "attn.c_attn.bias"]  # Conv1D
        q, k, v = qkv.split(C, dim=1)
        hs = C // NH
        q, k, v = (t.view(T, NH, hs).transpose(0, 1) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(0, 1).reshape(T, C)
        x = x + y @ w[h + "attn.c_proj.weight"] + w[h + "attn.c_proj.bias"]
        m = F.layer_norm(x, (C,), w[h + "ln_2.weight"], w[h + "ln_2.bias"], eps)
        m = F.gelu(m @ w[h + "mlp.c_fc.weight"] + w[h + "mlp.c_fc.bias"], approximate="tanh")
        x = x + m @ w[h + "mlp.c_proj.weight"] + w[h + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), w[p + "ln_f.weight"], w[p + "ln_f.bias"], eps)
    return x @ w[p + "wte.weight"].T


GPT2_CONFIG_FIELDS = ["model_type", "n_layer", "n_head", "n_embd", "n_positions", "n_ctx",
                      "vocab_size", "layer_norm_epsilon", "activation_function",
                      "bos_token_id", "eos_token_id", "tie_word_embeddings", "architectures",
                      "resid_pdrop", "embd_pdrop", "attn_pdrop", "initializer_range"]
