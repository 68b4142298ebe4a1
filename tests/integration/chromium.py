"""Headless Chromium (Debian `chromium`) driven over the DevTools protocol on a pipe
(--remote-debugging-pipe: JSON messages ending in NUL on file descriptors 3 and 4), with
nothing but the standard library: load a page, collect console errors and uncaught
exceptions, evaluate expressions, take a PNG screenshot and decode it."""
import base64
import json
import os
import shutil
import struct
import subprocess
import tempfile
import time
import zlib


class Browser:
    def __init__(self, width=1280, height=2400):
        exe = shutil.which("chromium")
        if not exe:
            raise RuntimeError("chromium not found (scripts/setup.sh installs it)")
        to_chrome, self._w = os.pipe()
        self._r, from_chrome = os.pipe()
        self.profile = tempfile.mkdtemp(prefix="loom-chromium-")

        def fds():
            os.dup2(to_chrome, 3)
            os.dup2(from_chrome, 4)

        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
             "--no-first-run", "--no-default-browser-check", "--user-data-dir=" + self.profile,
             "--window-size=%d,%d" % (width, height), "about:blank"],
            pass_fds=(3, 4), preexec_fn=fds, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(to_chrome)
        os.close(from_chrome)
        self._buf, self._id, self.events, self.session = b"", 0, [], None

    def _send(self, method, params, session):
        self._id += 1
        m = {"id": self._id, "method": method, "params": params or {}}
        if session:
            m["sessionId"] = session
        os.write(self._w, json.dumps(m).encode() + b"\0")
        return self._id

    def _recv(self, deadline):
        while b"\0" not in self._buf:
            if time.time() > deadline:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium exited")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method, params=None, timeout=60, session=True):
        i = self._send(method, params, self.session if session else None)
        deadline = time.time() + timeout
        while True:
            m = self._recv(deadline)
            if m.get("id") == i:
                if "error" in m:
                    raise RuntimeError("%s: %s" % (method, m["error"]))
                return m["result"]
            self.events.append(m)

    def open(self, path, timeout=60):
        """Loads a file in a fresh tab and waits for its load event."""
        target = self.call("Target.createTarget", {"url": "about:blank"}, session=False)
        self.session = self.call("Target.attachToTarget",
                                 {"targetId": target["targetId"], "flatten": True},
                                 session=False)["sessionId"]
        for domain in ("Runtime", "Page", "Log"):
            self.call(domain + ".enable")
        self.call("Page.navigate", {"url": "file://" + os.path.abspath(path)})
        deadline = time.time() + timeout
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            self.events.append(self._recv(deadline))

    def errors(self):
        """Console errors, uncaught exceptions and error log entries seen so far."""
        out = []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                out.append("exception: " + json.dumps(p["exceptionDetails"])[:500])
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console.%s: %s" % (p["type"], json.dumps(p.get("args"))[:500]))
            elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
                out.append("log: " + p["entry"].get("text", "")[:500])
        return out

    def eval(self, expression):
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in r:
            raise RuntimeError("%s: %s" % (expression, r["exceptionDetails"]))
        return r["result"].get("value")

    def screenshot(self):
        """The whole page as PNG bytes."""
        return base64.b64decode(self.call("Page.captureScreenshot",
                                          {"format": "png", "captureBeyondViewport": True})["data"])

    def close(self):
        try:
            self.call("Browser.close", session=False, timeout=10)
        except Exception:  # already gone
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.close(self._r)
        os.close(self._w)
        shutil.rmtree(self.profile, ignore_errors=True)


def png_pixels(png):
    """(width, height, channels, rows of bytes) of an 8-bit RGB/RGBA PNG."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat = 8, b""
    while pos < len(png):
        n, kind = struct.unpack(">I4s", png[pos:pos + 8])
        data = png[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, color = struct.unpack(">IIBB", data[:10])
        elif kind == b"IDAT":
            idat += data
        pos += 12 + n
    if depth != 8 or color not in (2, 6):
        raise ValueError("PNG of depth %d, colour type %d" % (depth, color))
    ch = 3 if color == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), w * ch, [], bytearray(w * ch)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - ch] if i >= ch else 0
            b, c = prev[i], prev[i - ch] if i >= ch else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, ch, rows
