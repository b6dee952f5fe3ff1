"""HTML reports opened in a real headless Chromium: no console errors, every picture loads, nothing wider than the page.

Drives Debian's ``chromium-headless-shell`` (or ``chromium``) over the DevTools protocol on a pipe
(``--remote-debugging-pipe``: JSON messages separated by NUL bytes on file descriptors 3 and 4), standard library only.
The oracle is the browser's own layout and image decoder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest

from natgrad_diag import write_report

pytestmark = pytest.mark.slow

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium-headless-shell", "chromium", "chromium-browser")) if p), None)

_PROBE = """JSON.stringify({
  images: Array.from(document.images).map(i => ({complete: i.complete, width: i.naturalWidth})),
  scrollWidth: document.documentElement.scrollWidth, viewport: window.innerWidth,
  wide: Array.from(document.querySelectorAll('body *')).filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
        .map(e => e.tagName).slice(0, 5)})"""


class _Browser:
    """A headless Chromium driven over --remote-debugging-pipe; one page, its console errors collected."""

    def __init__(self, tmp_path):
        to_child, self._write = os.pipe()
        self._read, from_child = os.pipe()

        def fds():  # the browser reads commands on fd 3 and writes replies on fd 4 (via high fds: either may be 3 or 4)
            os.dup2(to_child, 100)
            os.dup2(from_child, 101)
            os.dup2(100, 3)
            os.dup2(101, 4)

        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--remote-debugging-pipe", "--no-first-run",
             f"--user-data-dir={tmp_path / 'profile'}", "about:blank"],
            preexec_fn=fds, pass_fds=(3, 4), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        os.close(to_child)
        os.close(from_child)
        self._buffer, self._id, self.events = b"", 0, []
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable", session=True)

    def send(self, method, *, session=False, **params):
        self._id += 1
        message = {"id": self._id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._next(deadline=time.monotonic() + 60)
            if reply.get("id") == self._id:
                assert "error" not in reply, reply
                return reply["result"]
            self.events.append(reply)

    def _next(self, deadline):
        while b"\0" not in self._buffer:
            assert time.monotonic() < deadline, "the browser did not answer within 60 s"
            chunk = os.read(self._read, 1 << 16)
            assert chunk, "the browser closed the pipe"
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def open(self, path, width):
        self.events.clear()
        self.send("Emulation.setDeviceMetricsOverride", session=True, width=width, height=800, deviceScaleFactor=1, mobile=False)
        self.send("Page.navigate", session=True, url=path.as_uri())
        deadline = time.monotonic() + 60
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            self.events.append(self._next(deadline))
        return json.loads(self.send("Runtime.evaluate", session=True, expression=_PROBE, returnByValue=True)["result"]["value"])

    def errors(self):
        out = [e["params"] for e in self.events if e.get("method") == "Runtime.exceptionThrown"]
        out += [e["params"] for e in self.events if e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert")]
        return out + [e["params"] for e in self.events if e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error"]

    def close(self):
        try:
            self.send("Browser.close")
        finally:
            os.close(self._write)
            os.close(self._read)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """A natgrad report whose γ fails (from check_natgrad) and a real monitor's timeline with a rollback."""
    pytest.importorskip("matplotlib")
    import gpflow
    import tensorflow as tf

    from natgrad_diag import NatGradMonitor, check_natgrad
    from natgrad_diag.demo import make_model

    where = tmp_path_factory.mktemp("html")
    demo = make_model("svgp", "bernoulli", num_inducing=8, num_data=30)  # γ = 5 leaves the cone (docs/natgrad-checks.md)
    X, Y = demo.data

    def model():
        m = gpflow.utilities.deepcopy(demo.model)
        gpflow.set_trainable(m.q_mu, False)
        gpflow.set_trainable(m.q_sqrt, False)
        return m

    report = check_natgrad(model(), (X, Y), gamma=5.0, mode="full", progress=False)
    assert not report.passed and report.gamma_trials  # the failing γ this test is about
    m = model()
    monitor = NatGradMonitor(m, (X, Y), gamma=5.0, on_failure="rollback", every=2)
    natgrad = gpflow.optimizers.NaturalGradient(tf.Variable(5.0, dtype=tf.float64))  # the guard lowers it
    for step in range(4):
        with monitor.guard(step, natgrad):
            natgrad.minimize(lambda: m.training_loss((X, Y)), [(m.q_mu, m.q_sqrt)])
        monitor(step)
    assert monitor.rollbacks >= 1 and monitor.records
    from natgrad_diag.cli.gradcheck import gradcheck_cli  # `natgrad-diag gradcheck`: its title is one long map name

    gradcheck = gradcheck_cli()
    return [write_report(r, where / f"{name}.html").path for r, name in ((report, "check"), (monitor, "training"), (gradcheck, "gradcheck"))]


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt install chromium-headless-shell)")
@pytest.mark.parametrize("width", [1024, 400])
def test_html_reports__load_cleanly_and_fit_the_page_in_chromium(reports, tmp_path, width):
    browser = _Browser(tmp_path)
    try:
        for path in reports:
            page = browser.open(path, width)
            assert browser.errors() == [], path.name
            assert page["images"] and all(i["complete"] and i["width"] > 0 for i in page["images"]), (path.name, page)
            assert page["scrollWidth"] <= page["viewport"] == width, (path.name, page)
    finally:
        browser.close()
