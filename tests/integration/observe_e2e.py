#!/usr/bin/python3
"""Seeing inside a run, end to end (`loom run`): the flight recorder's hang report and the
timeline.

  hang_e2e.py LOOM WORKDIR watchdog  a 3-rank data-parallel job with LOOM_WATCHDOG_S=3: rank 2
                                     stopped with SIGSTOP -> within 3 + 5 s one report names
                                     rank 2 as behind, the operation the others wait in and
                                     that they wait for rank 2; SIGUSR1 to a rank of a healthy
                                     job prints its last operations and a report
  observe_e2e.py LOOM WORKDIR timeline  train.profile on 2 ranks with ZeRO 3 and with pp 2:
                                     trace.json is Chrome-trace JSON with both ranks, spans
                                     on each track nest, every collective of each
                                     communicator is there (sequence numbers without gaps)
                                     with its bytes, steps hold the forward, backward and
                                     optimizer spans, units' passes and large GEMMs,
                                     pipelines their F/BW actions; every rank's clock
                                     offset (0 on one machine, measured within half the
                                     round trip); system.jsonl samples and the trace's
                                     counters
  observe_e2e.py LOOM WORKDIR report  `loom report` of a 2-rank tensor-parallel run with the
                                     timeline on, opened in headless Chromium: no console
                                     errors, every chart drew data, the summary's numbers
                                     equal metrics.jsonl's, the screenshot is not blank; bad
                                     input fails with one line and exit 2
  observe_e2e.py LOOM WORKDIR plan    `loom train --plan` on every layout family (one process,
                                     dp 2 with ZeRO 0-3, recompute, tp 2, pp 2): the predicted
                                     model state per rank within 10% of the measured
                                     high-water mark, the median step-time error over the
                                     layouts within 20% (each printed; docs/perf.md);
                                     `loom plan --out` writes a config that `loom train` runs
"""
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

from common import Trainer, fail, metrics, prepare_data, rank_pid, run, wait_for  # noqa: E402

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


def check_trace(d, want_names):
    """The checks of trace.json in run dir d; returns the events."""
    with open(os.path.join(d, "trace.json")) as f:
        events = json.load(f)["traceEvents"]  # well-formed JSON, or this raises
    spans = [e for e in events if e["ph"] == "X"]
    ranks = sorted({e["pid"] for e in spans})
    if ranks != [0, 1]:
        fail("trace.json should hold ranks 0 and 1, not %s" % ranks)
    # Clocks: each rank's offset to rank 0's, measured by ping-pong; on one machine the true
    # offset is 0, so the measurement must lie within half its round trip of it, and the
    # offset applied is 0 (one machine's ranks share CLOCK_MONOTONIC).
    for e in events:
        if e["ph"] == "M" and e["name"] == "process_name":
            a = e["args"]
            if a.get("clock_offset_us") != 0 or \
                    abs(a["clock_measured_us"]) > a["clock_rtt_us"] / 2 + 1:
                fail("rank %d: clock offset %s: should be 0 applied, measured within half the "
                     "round trip" % (e["pid"], a))
    tracks = {}
    for e in spans:
        tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    for (pid, tid), evs in tracks.items():  # on one track a span ends before the next
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))  # starts or lies inside an open one
        stack = []
        for e in evs:
            while stack and e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"] - 0.01:
                stack.pop()
            if stack and e["ts"] + e["dur"] > stack[-1]["ts"] + stack[-1]["dur"] + 0.01:
                fail("rank %d track %d: %s overlaps %s without nesting" %
                     (pid, tid, e["name"], stack[-1]["name"]))
            stack.append(e)
    comm = [e for e in spans if e["cat"] == "comm"]
    seqs = {}
    for e in comm:
        a = e["args"]
        if a["bytes"] <= 0 and e["name"] not in ("barrier",):
            fail("collective without bytes: %s" % e)
        if not a.get("algo") or (e["name"] == "send/recv") != (a.get("direction") in
                                                               ("send", "recv")):
            fail("a communication span without its algorithm, or send/recv without its "
                 "peer and direction: %s" % e)
        seqs.setdefault((e["pid"], a["comm"], e["name"] in ("send/recv",)), []).append(a["seq"])
    for (pid, c, p2p), s in seqs.items():
        if not p2p and sorted(s) != list(range(min(s), max(s) + 1)):
            fail("rank %d '%s': sequence numbers with gaps: %s" % (pid, c, sorted(s)))
    names = {e["name"] for e in spans}
    for n in want_names:
        if n not in names:
            fail("trace.json has no %r span (it has %s)" % (n, sorted(names)))
    for step in (e for e in spans if e["cat"] == "step"):
        inside = [e["name"] for e in spans if e["pid"] == step["pid"] and e["tid"] == step["tid"]
                  and step["ts"] <= e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"]]
        if "optimizer" not in inside:
            fail("%s of rank %d holds no optimizer span" % (step["name"], step["pid"]))
    return spans


def timeline():
    d = os.path.join(WORK, "trace_zero3")
    shutil.rmtree(d, ignore_errors=True)
    run(T.launch(2, d, "--set", "train.profile=true", "--set", "train.zero=3", "--set",
                 "train.system_sample_s=0.1", steps=3))
    spans = check_trace(d, ["step 1", "step 3", "data", "forward", "backward", "optimizer",
                            "allgather", "reduce_scatter", "checkpoint", "embedding F",
                            "block 0 F", "block 1 BW", "final norm F", "head F", "head BW"])
    if not any(e["cat"] == "kernel" and e["name"].startswith("gemm ") for e in spans):
        fail("the timeline should show the large matrix products (cat kernel, 'gemm ...')")
    n = sum(1 for e in spans if e["cat"] == "comm")
    print("ok  ZeRO-3 on 2 ranks: %d spans, %d collectives with bytes, nested, no gaps" %
          (len(spans), n))
    # System sampling (every 0.1 s here): system.jsonl and the trace's counter track.
    with open(os.path.join(d, "system.jsonl")) as f:
        samples = [json.loads(line) for line in f]
    if len(samples) < 2:
        fail("system.jsonl should hold samples, not %d" % len(samples))
    for s in samples:
        if len(s["cpu_busy"]) != os.cpu_count() or not all(0 <= b <= 1 for b in s["cpu_busy"]):
            fail("per-core busy shares should be %d values in [0, 1]: %s" % (os.cpu_count(), s))
        if s["rss_mb"] <= 0 or "lo" not in s["net_mbps"] or s["ctxt_per_s"] <= 0:
            fail("a sample without RSS, loopback traffic or context switches: %s" % s)
    with open(os.path.join(d, "trace.json")) as f:
        counters = [e for e in json.load(f)["traceEvents"] if e["ph"] == "C"]
    if len(counters) != len(samples):
        fail("the trace should hold a counter event per sample: %d vs %d" %
             (len(counters), len(samples)))
    print("ok  system.jsonl: %d samples (cores busy %.2f on average), as counters in the trace" %
          (len(samples), sum(sum(s["cpu_busy"]) for s in samples) / len(samples)))
    d = os.path.join(WORK, "trace_pp")
    shutil.rmtree(d, ignore_errors=True)
    run(T.launch(2, d, "--set", "train.profile=true", "--set", "train.pp=2", steps=3))
    spans = check_trace(d, ["F 0", "BW 3", "send/recv", "optimizer"])
    print("ok  pp 2: %d spans, pipeline actions and their sends" % len(spans))
    # Each stage's idle and the schedule's own with the measured passes: metrics.jsonl has
    # both, the latter no larger than the step, and the report's summary shows their medians.
    rows = [m for m in metrics(d) if "loss" in m]
    idle, own = [], []
    for r in rows:
        n, step = len(r["pp_schedule_idle_ms"]), r["step_ms"]
        if n != 2 or not all(0 <= x <= step for x in r["pp_schedule_idle_ms"]):
            fail("pp_schedule_idle_ms should hold one share of the step per stage: %s" % r)
        idle.append(sum(step - r["compute_ms"][k] - r["optim_ms"][k] - r["data_ms"][k]
                        for k in range(n)) / n / step)
        own.append(sum(r["pp_schedule_idle_ms"]) / n / step)
    run([LOOM, "report", d])
    with open(os.path.join(d, "report.html")) as f:
        html = f.read()
    for key, v in (("median_pp_idle_pct", idle), ("median_pp_schedule_idle_pct", own)):
        m = re.search(r'<tr data-key="%s"><th>[^<]*</th><td class="v">([^<]*)<' % key, html)
        want = 100 * statistics.median(v)
        if not m or abs(float(m.group(1)) - want) > 0.05 + 1e-9:
            fail("the report's %s should be %.1f: %s" % (key, want, m and m.group(1)))
    print("ok  pp 2: idle %.1f%% of the step, the schedule's own with the measured passes "
          "%.1f%% (metrics.jsonl and the report)" % (100 * statistics.median(idle),
                                                      100 * statistics.median(own)))


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
def report():
    from chromium import Browser, png_pixels
    d = os.path.join(WORK, "report_tp2")
    shutil.rmtree(d, ignore_errors=True)
    run([LOOM, "run", "-n", "2", "--profile", LOOM] +
        T.args(d, "--set", "train.tp=2", "--set", "train.system_sample_s=0.2", "--set",
               "eval.every=4", "--set", "eval.batches=2", steps=8))
    out = run([LOOM, "report", d, "--step", "6"]).stdout
    page = os.path.join(d, "report.html")
    if page not in out or not os.path.exists(page):
        fail("loom report should write %s: %s" % (page, out))
    with open(page) as f:
        html = f.read()
    if re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html):
        fail("the page refers to something outside itself")
    rows = [m for m in metrics(d) if "loss" in m]
    vals = [m["val_loss"] for m in metrics(d) if "val_loss" in m]

    def median(v):
        v = sorted(v)
        return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2

    share = [sum(r["exposed_comm_ms"]) / len(r["exposed_comm_ms"]) / r["step_ms"] for r in rows]
    want = {"steps": (rows[-1]["step"], 0), "ranks": (2, 0),
            "final_loss": (rows[-1]["loss"], 1e-4), "best_val_loss": (min(vals), 1e-4),
            "median_step_ms": (median([r["step_ms"] for r in rows]), 0.1),
            "median_tokens_per_s": (median([r["tokens_per_s"] for r in rows]), 1),
            "median_mfu_pct": (median([100 * r["mfu"] for r in rows]), 0.01),
            "median_exposed_comm_pct": (100 * median(share), 0.1),
            "peak_state_mb": (max(max(r["state_peak_mb"]) for r in rows), 0.1),
            "peak_rss_mb": (max(max(r["rss_peak_mb"]) for r in rows), 0.1)}
    b = Browser()
    try:
        b.open(page)
        errors = b.errors()
        shown = b.eval("Object.fromEntries([...document.querySelectorAll('#summary tr')]"
                       ".map(r => [r.dataset.key, r.querySelector('td').textContent]))")
        charts = b.eval("[...document.querySelectorAll('figure.chart')]"
                        ".map(f => [f.id, Number(f.dataset.points || -1), "
                        "f.querySelectorAll('svg path, svg rect').length])")
        caption = b.eval("document.querySelector('#chart-timeline figcaption').textContent")
        png = b.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                                "clip": {"x": 0, "y": 0, "width": 1280,
                                                         "height": 2400, "scale": 0.25}})["data"]
    finally:
        b.close()
    if errors:
        fail("the page logged errors:\n  " + "\n  ".join(errors))
    for key, (value, tol) in want.items():
        got = float(shown[key])
        if abs(got - value) > tol + 1e-9:
            fail("summary %s shows %s, metrics.jsonl gives %s" % (key, shown[key], value))
    print("ok  summary: %d numbers equal metrics.jsonl's (%s)" %
          (len(want), ", ".join("%s %s" % kv for kv in sorted(shown.items()))))
    if len(charts) != 11:
        fail("expected 11 charts, the page has %s" % charts)
    for cid, points, shapes in charts:
        if points <= 0 or shapes == 0:
            fail("chart %s has no data (%d points, %d shapes)" % (cid, points, shapes))
    if "step 6" not in caption:
        fail("the timeline should show step 6 (--step 6): %r" % caption)
    print("ok  %d charts drew data: %s" % (len(charts), ", ".join("%s %d" % (c, p) for c, p, _ in charts)))
    import base64
    w, h, ch, px = png_pixels(base64.b64decode(png))
    colours = set()
    for row in px[::4]:
        for i in range(0, len(row), ch * 4):
            colours.add(row[i:i + 3])
    if len(colours) < 8:
        fail("the screenshot (%dx%d) is blank: %d colours" % (w, h, len(colours)))
    print("ok  no console errors; screenshot %dx%d with %d colours" % (w, h, len(colours)))
    # Bad input: one line, exit 2, nothing written.
    for args, words in ((["/nonexistent/run"], "is not a folder"),
                        ([WORK], "no " + WORK + "/metrics.jsonl"),
                        ([d, "--step", "99"], "the trace has no step 99")):
        p = run([LOOM, "report"] + args, expect_rc=2)
        if words not in p.stderr or "hint:" not in p.stderr or len(p.stderr.splitlines()) != 2:
            fail("loom report %s should fail with %r and a hint: %r" % (args, words, p.stderr))
    print("ok  bad input: one line and a hint, exit 2")


def plan():
    layouts = [("one process", 1, []), ("dp 2", 2, []), ("dp 2 zero 1", 2, ["train.zero=1"]),
               ("dp 2 zero 2", 2, ["train.zero=2"]), ("dp 2 zero 3", 2, ["train.zero=3"]),
               ("dp 2 recompute", 2, ["train.recompute=all"]), ("tp 2", 2, ["train.tp=2"]),
               ("tp 2 sp", 2, ["train.tp=2", "tp.sequence_parallel=true"]),
               ("pp 2 1f1b", 2, ["train.pp=2"]),
               ("pp 2 gpipe", 2, ["train.pp=2", "pp.schedule=gpipe"])]
    print("%-16s %22s %26s" % ("layout", "state MiB pred/meas", "step ms pred/meas (error)"))
    sanitizer = bool(os.environ.get("ASAN_OPTIONS"))  # its slowdown is not the product's timing

    def trained(name, n, sets):
        d = os.path.join(WORK, "plan_" + re.sub(r"\W+", "_", name))
        shutil.rmtree(d, ignore_errors=True)
        extra = [x for kv in sets for x in ("--set", kv)]
        run(T.launch(n, d, "--plan", *extra, steps=24))
        with open(os.path.join(d, "plan.json")) as f:
            p = json.load(f)
        pred, meas = p["predicted"], p["measured"]
        print("%-16s %9.2f / %-9.2f %9.1f / %-7.1f (%+.0f%%)" %
              (name, pred["state_mb"], meas["state_mb"], pred["step_ms"], meas["step_ms"],
               100 * p["error"]["step"]))
        return p

    step_errors, again = [], []
    for name, n, sets in layouts:
        p = trained(name, n, sets)
        pred, meas = p["predicted"], p["measured"]
        # Model state: the planner's formulas are loom's buffers (every layout within 0.03%
        # since this stop's mends); 2% leaves room for ZeRO-2/3's reductions landing early
        # (fewer gradients in flight than the formula's most: 2 blocks' of ~44 MiB, 0.9%).
        err = (pred["state_mb"] - meas["state_mb"]) / meas["state_mb"]
        if abs(err) > 0.02:
            fail("%s: model state per rank %.2f MiB predicted, %.2f measured (%+.1f%%, more than "
                 "2%%)" % (name, pred["state_mb"], meas["state_mb"], 100 * err))
        # Step time (issue 35 item 4): every layout within 20%. On 2 shared cores the host's
        # state moves a run's measurement by 10-40% for seconds at a time (docs/perf-history.md,
        # "The planner"), so a layout that misses is trained once more, printed as such, and
        # fails if it misses again.
        if not sanitizer and abs(p["error"]["step"]) > 0.20:
            print("    %s: %+.0f%%, trained again" % (name, 100 * p["error"]["step"]))
            p = trained(name, n, sets)
            again.append(name)
            if abs(p["error"]["step"]) > 0.20:
                fail("%s: step time %.1f ms predicted, %.1f measured (%+.0f%%) in two runs in a "
                     "row (target 20%%); the prediction's terms and measured costs (plan.json):"
                     "\n%s" % (name, p["predicted"]["step_ms"], p["measured"]["step_ms"],
                               100 * p["error"]["step"], json.dumps(p["predicted"], indent=1)))
        step_errors.append(p["error"]["step"])
    print("ok  model state per rank within 2%% of the measured high-water mark on %d layouts" %
          len(layouts))
    typical = sorted(abs(e) for e in step_errors)[len(step_errors) // 2]
    largest = max(abs(e) for e in step_errors)
    if sanitizer:
        print("(step time under a sanitizer build: median error %.0f%%, not checked)" %
              (100 * typical))
    else:
        print("ok  step time: every layout within 20%% (largest %.0f%%, median %.0f%%; trained "
              "again: %s)" % (100 * largest, 100 * typical, ", ".join(again) or "none"))
    # `loom plan` lists layouts and writes one as a config that trains.
    cfg = os.path.join(WORK, "planned.toml")
    out = run([LOOM, "plan", "--model", "tiny", "--seq", "32", "-b", "8", "--per-node", "2",
               "--top", "5", "--out", cfg], timeout=600).stdout
    if "fit" not in out or "wrote layout 1" not in out:
        fail("loom plan should list layouts and write the best: %s" % out)
    d = os.path.join(WORK, "planned_run")
    shutil.rmtree(d, ignore_errors=True)
    n = 2
    run([LOOM, "run", "-n", str(n), LOOM, "train", "-c", cfg] + T.args(d, steps=2)[1:])
    if len([m for m in metrics(d) if "loss" in m]) != 2:
        fail("the planned config should train 2 steps")
    print("ok  loom plan --out wrote a config that trains:\n" + out)
    p = run([LOOM, "plan", "--model", "tiny", "-b", "8", "--device", "v100"], expect_rc=2)
    if "hint:" not in p.stderr:
        fail("an unknown device should fail with a hint: %r" % p.stderr)
    # A model described by its shape alone (GPT-3 175B's) is named by it, at its own context.
    gpt3 = ["--layers", "96", "--hidden", "12288", "--heads", "96", "--context", "2048",
            "--nodes", "128", "--device", "a100-80", "-b", "1536", "--top", "1"]
    out = run([LOOM, "plan", *gpt3, "--seq", "2048", "--explain", "1"]).stdout
    if "custom 96x12288" not in out or "seq 2048" not in out or "gpt2" in out:
        fail("a custom shape should be named 'custom 96x12288' at seq 2048: " + out)
    # --explain 1: the first layout's step and memory term by term, each part with its total.
    terms = re.findall(r"^  (\S[\w +]*?)\s+([\d.]+) (s |GB)", out, re.M)
    names = [t[0] for t in terms]
    for want in ("compute", "recompute", "pipeline bubble", "tensor parallel", "pipeline sends",
                 "data parallel", "ZeRO gathers", "optimizer", "parameters", "activations"):
        if want not in names:
            fail("--explain should list the term %r:\n%s" % (want, out))
    for unit in ("s ", "GB"):
        rows = [float(v) for n, v, u in terms if u == unit and n != "total"]
        total = [float(v) for n, v, u in terms if u == unit and n == "total"]
        if len(total) != 1 or abs(sum(rows) - total[0]) > 5e-4 * len(rows):
            fail("--explain's %s terms should add up to its total:\n%s" % (unit.strip(), out))
    p = run([LOOM, "plan", *gpt3, "--explain", "-1"], expect_rc=2)
    if "hint:" not in p.stderr:
        fail("--explain -1 should fail with a hint: " + p.stderr)
    p = run([LOOM, "plan", *gpt3[:6], "--seq", "2048", "-b", "8", "--device", "a100-80"],
            expect_rc=2)
    if "--context 2048" not in p.stderr:
        fail("--seq past the context should suggest --context: " + p.stderr)
    print("ok  a custom shape, explained:", out.splitlines()[0])
    # ... and one planned on this machine is written as a config ([model] n_layer ...) that
    # `loom train --plan` trains, named by its shape, with the planner's parameter count and
    # model state.
    cfg = os.path.join(WORK, "custom.toml")
    out = run([LOOM, "plan", "--layers", "3", "--hidden", "96", "--heads", "4", "--context",
               "64", "--seq", "32", "--device", "cpu", "--per-node", "2", "-b", "8", "--top", "1",
               "--out", cfg], timeout=600).stdout
    planned = re.search(r"custom 3x96 \(([\d.]+)M parameters", out)
    with open(cfg) as f:
        text = f.read()
    if not planned or "n_layer = 3" not in text or "n_embd = 96" not in text:
        fail("loom plan --out of a custom shape should write its [model] keys:\n" + out + text)
    d = os.path.join(WORK, "custom_run")
    shutil.rmtree(d, ignore_errors=True)
    p = run([LOOM, "run", "-n", "2", LOOM, "train", "-c", cfg, "--plan"] +
            [a for a in T.args(d, steps=3)[1:] if a != "--quiet"])
    trained = re.search(r"training custom 3x96 \(([\d.]+)M parameters\)", p.stdout)
    state = re.search(r"model state per rank ([\d.]+) MiB predicted, ([\d.]+) measured", p.stdout)
    if not trained or trained.group(1) != planned.group(1) or not state or \
            state.group(1) != state.group(2):
        fail("loom train --plan should train the planned custom shape (%s M parameters) and "
             "predict its model state exactly:\n%s" % (planned.group(1), p.stdout[-3000:]))
    print("ok  loom plan --out of a custom shape trains with --plan: %s M parameters, model "
          "state %s MiB predicted and measured" % (trained.group(1), state.group(1)))


{"watchdog": watchdog, "timeline": timeline, "report": report, "plan": plan}[MODE]()
