"""``report.html`` (issue 78): one self-contained page per run directory, and one over a sweep's jobs, telling the
status and answer in one line, every kept or reduced node, the trade-off picture inline, every check, and the
commands that reproduce and resume the run; well-formed, with nothing fetched from elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.helpers.checks import python_check
from tests.helpers.graphs import DECODER_CHECK, rmsnorm_decoder_files

ROOT = Path(__file__).resolve().parents[3]

#: elements HTML closes without an end tag
VOID = {"meta", "img", "br", "hr", "link", "input"}


class _Page(HTMLParser):
    """Checks that every element is closed in order and collects what a reader sees and what would be fetched."""

    def __init__(self) -> None:
        super().__init__()
        self.open: list = []
        self.text: list = []
        self.fetched: list = []
        self.ids: dict = {}
        self._id = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("src", "href"):
            value = attrs.get(key) or ""
            if value and not value.startswith("data:") and not (key == "href" and not value.startswith("http")):
                self.fetched.append(value)
            if key == "src" and value.startswith("http"):
                self.fetched.append(value)
        if tag not in VOID:
            self.open.append(tag)
        if "id" in attrs:
            self._id = attrs["id"]
            self.ids[self._id] = ""

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, (tag, self.open[-5:])
        self.open.pop()

    def handle_data(self, data):
        self.text.append(data)
        if self._id is not None:
            self.ids[self._id] += data


def _read(path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    assert not page.open, page.open
    assert not page.fetched, page.fetched  # self-contained: nothing from the network
    return page


def test_a_precision_runs_report_tells_its_answer_nodes_checks_and_commands(run, tmp_path):
    needed, _, files = rmsnorm_decoder_files(tmp_path, layers=2)
    r = run("mode=precision", "marker=minimal", *files, "output=mixed.onnx", *DECODER_CHECK)
    assert r.returncode == 0, r.stderr[-2000:]
    path = r.run_dir / "report.html"
    page = _read(path)
    html = path.read_text()
    status = page.ids["status"]
    assert status.startswith("ok: ") and f"{r.summary['kept']} of {r.summary['total']} nodes kept" in status
    assert "verified as written" in status
    shown = "".join(page.text)
    assert all(node in shown for node in needed)
    assert "data:image/png;base64," in html  # the trade-off picture, inline
    assert f"Checks ({r.summary['iterations']})" in shown
    assert "replay.load=" in page.ids["resume"] and "mode=precision" in page.ids["reproduce"]
    assert page.ids["resume"].startswith("cd ")


@pytest.mark.slow  # a sweep of two jobs in a child process: 1.5 s
def test_a_sweep_gets_one_page_over_its_jobs(tmp_path):
    import onnx

    from tests.helpers.models import chain_model

    onnx.save(chain_model(6), tmp_path / "chain.onnx")
    cmd = [sys.executable, "-m", "runner", "-m", "mode=reduce", "model=chain.onnx", *python_check("n2,n3")]
    proc = subprocess.run(
        [*cmd, "marker=bisect,linear", "hydra.sweep.dir=sweep"], cwd=tmp_path, capture_output=True, text=True,
        timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    page = _read(tmp_path / "sweep" / "report.html")
    shown = "".join(page.text)
    assert "Sweep of 2 runs" in shown and shown.count("reduced to") == 2
    for job in ("0", "1"):
        job_page = _read(tmp_path / "sweep" / job / "report.html")
        assert job_page.ids["status"].startswith("ok: reduced to")
