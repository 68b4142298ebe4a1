"""Helpers shared by the end-to-end test scripts (train_e2e.py, dp_e2e.py, tests/torch)."""
import os
import socket
import subprocess
import sys


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def prepare_data(loom, work):
    """The King James Bible (Debian bible-kjv) as `loom prep` shards under work/kjv."""
    data = os.path.join(work, "kjv")
    if os.path.exists(os.path.join(data, "manifest.json")):
        return data
    os.makedirs(work, exist_ok=True)
    text = os.path.join(work, "kjv.txt")
    with open(text, "wb") as f:
        subprocess.run(["bible", "-f", "gen1:1-rev22:21"], stdout=f, check=True)
    subprocess.run([loom, "prep", "-i", text, "-o", data, "--quiet"], check=True)
    return data


def free_port():
    """A TCP port free on 127.0.0.1 right now (for a store the test's ranks host)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
