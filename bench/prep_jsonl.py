#!/usr/bin/env python3
"""`loom prep` on a .jsonl.zst corpus against the same documents as plain files, and against
`zstd -dc FILE | loom prep -i - --format jsonl` (decompression in a process in front), in one
run: issue 32's goal is .jsonl.zst >= 0.9x plain files (the tokenizer, not decompression,
stays the limit).

The corpus: the .c and .h files of Debian's linux-source-6.1 (up to --mb MB of them, sorted
by path) written once as plain files and once as JSON Lines records (one per file, Pile-style
"meta"), compressed with `zstd -3` (The Pile's files are zstd) and `zstd --long=27`. The
three ways give the same shards (checked), so their times compare the input paths alone.
Rounds interleave the ways; medians are reported with min/max, and the CPU named.

    /usr/bin/python3 bench/prep_jsonl.py [--loom build/apps/loom/loom] [--mb 150] [--rounds 3]
"""
import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import tarfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("--loom", default="build/apps/loom/loom")
ap.add_argument("--mb", type=float, default=150)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--work", default="/tmp/loom-prep-bench")
args = ap.parse_args()
loom = os.path.abspath(args.loom)
work = args.work
os.makedirs(work, exist_ok=True)
cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))

text_dir = os.path.join(work, "text")
jsonl = os.path.join(work, "linux.jsonl")
if not os.path.exists(jsonl + ".zst"):
    src = "/usr/src/linux-source-6.1.tar.xz"
    if not os.path.exists(src):
        raise SystemExit("needs Debian's linux-source-6.1 (apt-get install linux-source-6.1)")
    shutil.rmtree(text_dir, ignore_errors=True)
    files, total = [], 0
    with tarfile.open(src) as tar:
        for m in tar:
            if m.isfile() and m.name.endswith((".c", ".h")):
                data = tar.extractfile(m).read()
                try:
                    data.decode("utf-8")
                except UnicodeDecodeError:
                    continue  # JSON strings must be UTF-8; keep both corpora the same text
                files.append((m.name, data))
                total += len(data)
                if total >= args.mb * 1e6:
                    break
    files.sort()
    with open(jsonl, "w", encoding="utf-8") as out:
        for i, (name, data) in enumerate(files):
            # Plain files named so that their sorted order is the records' order.
            path = os.path.join(text_dir, "%07d.c" % i)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
            out.write(json.dumps({"text": data.decode("utf-8"),
                                  "meta": {"pile_set_name": "Github", "path": name}}) + "\n")
    subprocess.run(["zstd", "-q", "-3", "-f", jsonl, "-o", jsonl + ".zst"], check=True)
    subprocess.run(["zstd", "-q", "-3", "--long=27", "-f", jsonl, "-o",
                    os.path.join(work, "linux.long.jsonl.zst")], check=True)
text_mb = sum(os.path.getsize(os.path.join(text_dir, f)) for f in os.listdir(text_dir)) / 1e6


def digest(folder):
    h = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        if name.endswith(".bin"):
            with open(os.path.join(folder, name), "rb") as f:
                h.update(f.read())
    return h.hexdigest()


WAYS = {
    "plain files": lambda out: [loom, "prep", "-i", text_dir, "-o", out, "--quiet"],
    ".jsonl.zst": lambda out: [loom, "prep", "-i", jsonl + ".zst", "-o", out, "--quiet"],
    ".jsonl.zst --long": lambda out: [loom, "prep", "-i", os.path.join(work, "linux.long.jsonl.zst"),
                                      "-o", out, "--quiet"],
    "zstd -dc | prep -i -": lambda out: "zstd -dc %s | %s prep -i - --format jsonl -o %s --quiet" %
                                        (jsonl + ".zst", loom, out),
}
times = {k: [] for k in WAYS}
digests = {}
for r in range(args.rounds):
    for name, cmd in WAYS.items():
        out = os.path.join(work, "out")
        shutil.rmtree(out, ignore_errors=True)
        c = cmd(out)
        t0 = time.perf_counter()
        subprocess.run(c, shell=isinstance(c, str), check=True, stdout=subprocess.DEVNULL)
        times[name].append(time.perf_counter() - t0)
        digests.setdefault(name, digest(out))
same = len(set(digests.values())) == 1
base = statistics.median(times["plain files"])
print("CPU: %s, %d cores; %.1f MB of text in %d files / records; %d rounds; shards %s" %
      (cpu, os.cpu_count(), text_mb, len(os.listdir(text_dir)), args.rounds,
       "identical across the ways" if same else "DIFFER"))
print("| input | median s | min-max s | MB/s of text | vs plain files |")
print("|---|---|---|---|---|")
for name, t in times.items():
    med = statistics.median(t)
    print("| %s | %.2f | %.2f-%.2f | %.1f | %.2fx |" % (name, med, min(t), max(t), text_mb / med,
                                                      base / med))
print(json.dumps({"cpu": cpu, "text_mb": text_mb, "times": times, "identical": same}))
