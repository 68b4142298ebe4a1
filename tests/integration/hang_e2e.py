#!/usr/bin/python3
"""The flight recorder and the hang report, end to end (`loom run`).

  hang_e2e.py LOOM WORKDIR watchdog  a 3-rank data-parallel job with LOOM_WATCHDOG_S=3: rank 2
                                     stopped with SIGSTOP -> within 3 + 5 s one report names
                                     rank 2 as behind, the operation the others wait in and
                                     that they wait for rank 2; SIGUSR1 to a rank of a healthy
                                     job prints its last operations and a report
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

from common import Trainer, fail, prepare_data, rank_pid, wait_for  # noqa: E402

LOOM, WORK, MODE = sys.argv[1], sys.argv[2], sys.argv[3]


class Job:
    """A `loom run` job whose stderr is collected as it comes."""

    def __init__(self, cmd, env):
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, env=env)
        self.err, self.lock = [], threading.Lock()
        self.reader = threading.Thread(target=self.read)
        self.reader.start()

    def read(self):
        for line in self.proc.stderr:
            with self.lock:
                self.err.append(line)

    def text(self):
        with self.lock:
            return "".join(self.err)

    def end(self, rank):
        """Ends the job by killing `rank` (SIGCONT first, in case it was stopped)."""
        pid = rank_pid(self.proc.pid, rank)
        if pid:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=60)
        self.reader.join()


def start(name):
    d = os.path.join(WORK, name)
    shutil.rmtree(d, ignore_errors=True)
    env = dict(os.environ, LOOM_WATCHDOG_S="3", LOOM_TIMEOUT_S="120")
    job = Job(T.launch(3, d, "--set", "train.global_batch=6", steps=100000), env)
    wait_for(lambda: os.path.exists(os.path.join(d, "metrics.jsonl")), 120, "the first step")
    return job


def watchdog():
    # A stopped rank: the others block in their next collective and report within 3 + 5 s.
    job = start("stopped")
    victim = rank_pid(job.proc.pid, 2)
    t0 = time.time()
    os.kill(victim, signal.SIGSTOP)
    wait_for(lambda: "behind:" in job.text(), 30, "the hang report")
    took = time.time() - t0
    text = job.text()
    job.end(2)
    report = text[text.index("hang report"):]
    if took > 3 + 5:
        fail("the hang report came %.1f s after the stop (LOOM_WATCHDOG_S 3 + 5)" % took)
    if "behind: rank 2" not in report or re.search(r"behind: rank [01]\b", report):
        fail("the report should name rank 2 alone as behind:\n" + report)
    if not re.search(r"rank 2: no answer", report):
        fail("the report should say rank 2 did not answer:\n" + report)
    m = re.search(r"rank [01] \(pid \d+\): (\w+)\(.*waiting for rank\(s\) [0-9, ]*2", report)
    if not m:
        fail("the report should show a rank waiting in an operation for rank 2:\n" + report)
    if report.count("hang report") != 1:
        fail("one report per job, not %d:\n%s" % (report.count("hang report"), report))
    print("ok  SIGSTOP of rank 2: report after %.1f s, rank 2 behind, others in %s waiting "
          "for it" % (took, m.group(1)))
    print("    " + "\n    ".join(line for line in report.splitlines() if "loom:" in line))

    # SIGUSR1: the rank prints its last operations, and the job one report.
    job = start("usr1")
    os.kill(rank_pid(job.proc.pid, 1), signal.SIGUSR1)
    wait_for(lambda: "hang report" in job.text() and "behind" in job.text(), 30,
             "the SIGUSR1 report")
    text = job.text()
    job.end(0)
    if not re.search(r"rank 1's last operations \(SIGUSR1\):\n\[rank 1\] loom:   \w+\(.* #\d+ on "
                     r"'world", text):
        fail("SIGUSR1 should print rank 1's last operations:\n" + text[-3000:])
    if "hang report: SIGUSR1" not in text:
        fail("SIGUSR1 should print a report:\n" + text[-3000:])
    print("ok  SIGUSR1: rank 1's last operations and one report")


T = Trainer(LOOM, prepare_data(LOOM, WORK))
{"watchdog": watchdog}[MODE]()
