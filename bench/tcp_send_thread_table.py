"""Medians of bench/tcp_send_thread.sh's rounds: loom's TCP allgather busbw (out of place)
per send-thread threshold, and its share of the bidirectional socket stream."""
import json
import statistics
import sys

rows = [json.loads(line) for line in open(sys.argv[1] + "/results.jsonl")]
socket = statistics.median(r["gbps"] for r in rows if r.get("peer") == "socket")
loom = [r for r in rows if r.get("peer", "").startswith("loom") and not r["inplace"]]
peers = sorted({r["peer"] for r in loom}, key=lambda p: int(p.rsplit("-", 1)[1]))
sizes = sorted({r["bytes"] for r in loom})
print("socket stream, both directions: %.2f GB/s per direction (median of %d)" %
      (socket, sum(1 for r in rows if r.get("peer") == "socket")))
print("| size | " + " | ".join("%s busbw GB/s (share)" % p for p in peers) + " |")
print("|---" * (len(peers) + 1) + "|")
for b in sizes:
    cells = []
    for p in peers:
        v = statistics.median(r["busbw"] for r in loom if r["peer"] == p and r["bytes"] == b)
        cells.append("%.2f (%.0f%%)" % (v, 100 * v / socket))
    print("| %d MiB | %s |" % (b >> 20, " | ".join(cells)))
