"""What the shared-memory comparison scripts (bench/single_copy.sh, bench/shared_gather.sh)
leave in their OUT_DIR, read back for their table printers: results.jsonl (one row per
benchmarked size) and probe.jsonl (the machine state before and after each block)."""
import json
from pathlib import Path


def load(out):
    """(rows, probes) of OUT_DIR `out`."""
    def lines(name):
        text = (Path(out) / name).read_text()
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return lines("results.jsonl"), lines("probe.jsonl")


def size(b):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k} {unit}"
    return f"{b} B"


def print_machine_state(probes):
    print("Machine state (core-to-core flag latency ns, memcpy GB/s):",
          ", ".join(f"{p['when']}/{p['nranks']}: {p['flag_latency_ns']:.0f} ns "
                    f"{p['memcpy_gbps']:.1f}" for p in probes))
