"""``kgsynth report``: a small run built with the real CLI (import, walk, questions, oracle
trajectories, filter) over a KG with hostile names, rendered to one HTML page; the page
opens with the headline numbers, parses, shows the manifests' counts and sample rows, escapes
every name, references nothing outside itself, and renders in headless Chromium (installed like
Virtuoso, or skipped) with the headline table on the first 1280x800 screen."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
from html import unescape
from html.parser import HTMLParser
from pathlib import Path
from typing import ClassVar

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from kgsynth.cli import app
from kgsynth.report import collect_run, funnel_of, render_markdown
from tests.kgfixtures import MOVIE_FACTS

runner = CliRunner()

HOSTILE = {
    "Kismet": 'Kismet <script>alert("k")</script>',
    "Bette Davis": 'Bette "B" Davis & Co\'s <b>',
}
FACTS = [tuple(HOSTILE.get(x, x) for x in fact) for fact in MOVIE_FACTS]
LABEL = 'tiny <eval> & "co"'


def invoke(*args: str) -> str:
    res = runner.invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res.output


def eval_metrics() -> dict:
    """A metrics.json in ``kgsynth eval``'s format (the fields the comparison reads)."""
    overall = {"em_strict": 0.25, "hit": 0.5, "f1": 0.375, "hits_at_1": 0.5, "rhits_at_1": 0.25}
    return {
        "label": LABEL,
        "counts": {"questions": 4, "runs": 1, "predictions": 4},
        "overall": overall,
        "ci95": {k: [0.0, 0.9] for k in overall},
        "union": {},
        "breakdowns": {
            "hops": {"1": {**overall, "questions": 4, "ci95": {"hits_at_1": [0.1, 0.9]}}},
            "qtype": {"movie_to_director": {**overall, "questions": 4}},
        },
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A run folder laid out as ``make all`` lays it out, up to the stage-1 corpus, plus a
    stage-1 folder holding only its spec and ``metrics.jsonl`` (training cut short) and one
    evaluation."""
    root = tmp_path_factory.mktemp("report") / 'run <&"x">'
    root.mkdir()
    kb = root.parent / "kb.txt"
    kb.write_text("\n".join("|".join(f) for f in FACTS) + "\n", encoding="utf-8")
    walks = root / "walks" / "walks.parquet"
    questions = root / "questions" / "questions.parquet"
    trajectories = root / "trajectories" / "trajectories.parquet"
    invoke("kg", "import", str(kb), "--out", str(root / "kg"))
    invoke("walk", "--kg", str(root / "kg"), "--out", str(walks), "--n", "10",
           "--structures", "chain-1:0.5,chain-2:0.5")  # fmt: skip
    invoke("synthesize", "questions", "--walks", str(walks), "--out", str(questions))
    invoke("synthesize", "trajectories", "--questions", str(questions), "--kg", str(root / "kg"),
           "--mode", "oracle", "--llm", "template", "--out", str(trajectories))  # fmt: skip
    # a low --max-chars rejects the longer trajectories, so the corpus has rejects to show
    invoke("filter", "--in", str(trajectories), "--out", str(root / "corpus"),
           "--max-chars", "1800")  # fmt: skip
    (root / "stage1").mkdir()
    (root / "stage1" / "train_config.json").write_text(json.dumps({"stage": "stage1"}))
    (root / "stage1" / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "loss": 5.0 / s}) + "\n" for s in range(1, 21))
    )
    (root / "eval" / "tiny").mkdir(parents=True)
    (root / "eval" / "tiny" / "metrics.json").write_text(json.dumps(eval_metrics()))
    return root


class Page(HTMLParser):
    """Tags, attributes and text of a page, and whether its tags nest properly."""

    VOID: ClassVar[set[str]] = {
        "meta",
        "img",
        "br",
        "hr",
        "input",
        "link",
        "source",
        "rect",
        "polyline",
    }

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.stack: list[str] = []
        self.mismatched: list[str] = []
        self.text: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if self.stack and self.stack[-1] == tag:
            self.stack.pop()
        else:
            self.mismatched.append(tag)

    def handle_data(self, data):
        self.text.append(data)

    def find(self, tag: str, **attrs: str) -> list[dict[str, str | None]]:
        return [
            a for t, a in self.tags if t == tag and all(a.get(k) == v for k, v in attrs.items())
        ]


@pytest.fixture(scope="module")
def page(run) -> tuple[Path, str]:
    out = run / "report.html"
    invoke("report", str(run))
    return out, out.read_text(encoding="utf-8")


def manifest(path: Path) -> dict:
    return json.loads(path.read_text())


def test_funnels_show_the_manifests_counts(run, page):
    parsed = Page(page[1])
    assert not parsed.mismatched and not parsed.stack
    walk = manifest(run / "walks" / "walks.manifest.json")
    filt = manifest(run / "corpus" / "manifest.json")
    for stage, m, attempted in (
        ("walks/walks.parquet", walk, walk["attempts"]),
        ("questions/questions.parquet", manifest(run / "questions" / "questions.manifest.json"),
         None),
        ("corpus", filt, filt["rows_in"]),
    ):  # fmt: skip
        section = page[1].split(f'data-stage="{stage}"', 1)[1].split("</section>", 1)[0]
        rows = Page(section).find("tr")
        counts = {r["data-role"]: int(r["data-count"]) for r in rows if r.get("data-role") in
                  ("attempted", "accepted")}  # fmt: skip
        rejects = {r["data-reason"]: int(r["data-count"]) for r in rows if r.get("data-reason")}
        assert counts["accepted"] == m["accepted"] > 0, stage
        if attempted is not None:
            assert counts["attempted"] == attempted
        assert rejects == m["rejects"], stage
    # the tiny run has rejects where the test needs them
    assert filt["rejects"]["too_long"] > 0 and filt["accepted"] > 0
    assert funnel_of(filt).unattributed == 0


def test_the_headline_comes_first_with_every_models_hits_and_the_funnels_counts(run, page):
    parsed = Page(page[1])
    tables = [a.get("id") for t, a in parsed.tags if t == "table"]
    assert tables[0] == "headline-evals"  # the first table of the page
    assert [t for t in tables if t] == ["headline-evals", "headline-data", "headline-training"]
    sections = [a.get("id") for a in parsed.find("section")]
    assert sections[0] == "headline"
    head = page[1].split('id="headline"', 1)[1].split("</section>", 1)[0]
    evals = head.split('id="headline-evals"', 1)[1].split("</table>", 1)[0]
    assert "tiny &lt;eval&gt; &amp; &quot;co&quot;" in evals and "<th>1-hop</th>" in evals
    # overall and 1-hop Hits@1, each with its interval from metrics.json
    assert evals.count('<strong data-value="0.5">0.500</strong>') == 2
    assert "[0.000, 0.900]</span>" in evals and "[0.100, 0.900]</span>" in evals
    # by type: collapsed under the table (no predictions.parquet here: no interval)
    assert 'data-breakdown="qtype"' in head and "movie_to_director" in head
    data = Page(head.split('id="headline-data"', 1)[1].split("</table>", 1)[0])
    counts = [int(a["data-count"]) for a in data.find("strong") if a.get("data-count")]
    accepted = [
        manifest(run / "walks" / "walks.manifest.json")["accepted"],
        manifest(run / "questions" / "questions.manifest.json")["accepted"],
        manifest(run / "trajectories" / "trajectories.manifest.json")["trajectories"],
        manifest(run / "corpus" / "manifest.json")["accepted"],
    ]
    assert counts == accepted
    training = head.split('id="headline-training"', 1)[1].split("</table>", 1)[0]
    # the unfinished stage 1: steps and loss so far, from metrics.jsonl
    assert "Stage 1: SFT (not finished)" in training and "20 (so far)" in training
    assert "5 → 0.25" in training


def test_samples_show_rows_accepted_and_rejected_with_reasons(run, page):
    parsed = Page(page[1])
    headers = {
        (a["data-kind"], "rejected" in (a.get("class") or "")): int(a["data-shown"])
        for a in parsed.find("h4")
        if a.get("data-kind")
    }
    walks = pq.read_table(run / "walks" / "walks.parquet")
    assert headers[("walks", False)] == min(24, walks.num_rows) > 0
    assert headers[("trajectories", True)] > 0 and headers[("trajectories", False)] > 0
    assert headers[("questions", False)] > 0
    rejected = pq.read_table(run / "corpus" / "rejected.parquet").to_pylist()
    assert f'<span class="reason">{rejected[0]["reject_reason"]}</span>' in page[1]
    # fewer rows than --samples: every walk is on the page
    assert all(w in page[1] for w in walks.column("walk_id").to_pylist())
    # trajectories are chat turns in <details>, one block per message, styled by role
    traj = parsed.find("details", **{"class": "traj", "data-kind": "trajectories"})
    assert traj
    roles = {a["class"] for a in parsed.find("div") if (a.get("class") or "").startswith("msg ")}
    assert {"msg system", "msg user", "msg assistant", "msg tool"} <= roles


def test_hostile_names_are_escaped(run, page):
    text = page[1]
    for name in HOSTILE.values():
        assert name not in text  # never raw
    assert "<script>alert" not in text and "<b>" not in text
    assert "&lt;script&gt;alert(&quot;k&quot;)&lt;/script&gt;" in text
    assert "Bette &quot;B&quot; Davis &amp; Co&#x27;s &lt;b&gt;" in text
    # the run folder's own name and the eval label too
    assert (
        "run &lt;&amp;&quot;x&quot;&gt;" in text
        and "tiny &lt;eval&gt; &amp; &quot;co&quot;" in text
    )
    parsed = Page(text)
    scripts = parsed.find("script")
    assert len(scripts) == 1  # the page's own inline script, nothing from the run
    assert "".join(parsed.text).count('Kismet <script>alert("k")</script>') > 0


def test_page_references_nothing_outside_itself(page):
    parsed = Page(page[1])
    for tag, attrs in parsed.tags:
        for key in ("src", "href", "srcset", "action", "data", "poster"):
            value = attrs.get(key)
            if value is None:
                continue
            assert value.startswith(("data:image/png;base64,", "#")), (tag, key, value[:60])
    assert not parsed.find("link") and not parsed.find("iframe")
    assert all("src" not in a for a in parsed.find("script"))
    assert "@import" not in page[1] and "url(" not in page[1]


def test_stages_curves_eval_and_missing_lines(run, page):
    text = page[1]
    parsed = Page(text)
    stages = [a["data-stage"] for a in parsed.find("section") if a.get("data-stage")]
    assert stages == ["headline", "kg", "walks/walks.parquet", "questions/questions.parquet",
                      "trajectories/trajectories.parquet", "corpus", "stage1", "eval/tiny",
                      "comparison"]  # fmt: skip
    missing = [a["data-missing"] for a in parsed.find("p") if a.get("data-missing")]
    assert missing == ["train stage2", "train rl", "eval compare"]
    # the walk and filter plots are embedded; stage 1 has no PNG, so its curve is an SVG
    imgs = [a["alt"] for a in parsed.find("img")]
    assert "walks/walks.parquet: walks_stats.png" in imgs and "corpus: filter_stats.png" in imgs
    stage1 = text.split('data-stage="stage1"', 1)[1].split("</section>", 1)[0]
    assert '<svg class="curve"' in stage1 and "loss (20 points)" in stage1
    assert "training has not finished" in stage1
    comparison = text.split('data-stage="comparison"', 1)[1]
    assert "0.500 [0.000, 0.900]" in comparison


def test_cli_refuses_to_replace_and_rejects_non_runs(run, page, tmp_path):
    res = runner.invoke(app, ["report", str(run)])
    assert res.exit_code == 2 and "--overwrite" in res.output
    res = runner.invoke(app, ["report", str(run), "--overwrite", "--samples", "3", "--seed", "1"])
    assert res.exit_code == 0, res.output
    assert len((run / "report.html").read_text()) < len(page[1])
    res = runner.invoke(app, ["report", str(tmp_path)])
    assert res.exit_code == 2 and str(tmp_path) in res.output and "not a kgsynth run" in res.output
    assert len(res.output.strip().splitlines()) == 1
    res = runner.invoke(app, ["report", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "does not exist" in res.output
    res = runner.invoke(app, ["report", str(run), "--out", str(run / "walks" / "walks.parquet")])
    assert res.exit_code == 2 and ".html" in res.output


def test_seeded_picks_repeat_and_cover_every_reason(run):
    a = collect_run(run, samples=5, seed=3)
    b = collect_run(run, samples=5, seed=3)

    def picked(report):
        return [[r.get("walk_id") for r in s.rows] for st in report.stages for p in st.parts
                for s in p.samples]  # fmt: skip

    assert picked(a) == picked(b)
    corpus = next(s for s in a.stages if s.key == "corpus")
    rejected = next(s for p in corpus.parts for s in p.samples if s.rejected)
    reasons = {r["reject_reason"] for r in pq.read_table(rejected.path).to_pylist()}
    assert {r["reject_reason"] for r in rejected.rows} == reasons


def test_markdown_subset_embeds_local_images_only(tmp_path):
    png = tmp_path / "c.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\nfake")
    html = render_markdown(
        "# T <x>\n\n| a | b |\n|---|---|\n| `1<2` | & |\n\n![c](c.png)\n\n"
        "![far](http://example.com/x.png)\n\n- item `z`\n",
        tmp_path,
    )
    assert "<h3>T &lt;x&gt;</h3>" in html and "<code>1&lt;2</code>" in html
    assert "<td>&amp;</td>" in html and 'src="data:image/png;base64,' in html
    assert "http://example.com" not in html and "[image: far]" in html


# ---------------------------------------------------------------------------------------------
# headless Chromium


def chromium() -> str | None:
    """Debian's chromium, installed the way the Makefile installs Virtuoso when it is missing
    (apt-get install, after apt-get update if needed); None when it cannot be had."""
    for name in ("chromium", "chromium-browser"):
        if shutil.which(name):
            return shutil.which(name)
    if shutil.which("apt-get") is None:
        return None
    sudo = [] if _is_root() else ["sudo", "-n"]
    install = [*sudo, "apt-get", "install", "-y", "-q", "chromium"]
    for steps in ([install], [[*sudo, "apt-get", "update", "-q"], install]):
        try:
            if all(
                subprocess.run(s, capture_output=True, timeout=600).returncode == 0 for s in steps
            ):
                break
        except (OSError, subprocess.TimeoutExpired):
            return None
    return shutil.which("chromium")


def _is_root() -> bool:
    import os

    return os.geteuid() == 0


@pytest.fixture(scope="module")
def browser() -> str:
    path = chromium()
    if path is None:
        pytest.skip("chromium not found and `apt-get install -y chromium` failed")
    return path


def headless(browser: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_chromium_renders_the_page(browser, page, tmp_path):
    url = page[0].as_uri()
    res = headless(browser, "--dump-dom", url)
    assert res.returncode == 0, res.stderr[-2000:]
    dom = res.stdout
    for stage in (
        "headline",
        "walks/walks.parquet",
        "questions/questions.parquet",
        "trajectories/trajectories.parquet",
        "corpus",
        "stage1",
        "eval/tiny",
    ):
        assert f'data-stage="{stage}"' in dom
    assert "Pipeline overview" in dom and 'class="msg tool"' in dom
    # the escaped names stayed text: no element came from the KG
    assert dom.count("<script>") == 1 and "&lt;script&gt;alert" in dom
    shot = tmp_path / "report.png"
    res = headless(browser, f"--screenshot={shot}", "--window-size=1280,2000", url)
    assert res.returncode == 0, res.stderr[-2000:]
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"screenshot: {shot}")


def layout(browser: str, page: Path, tmp_path: Path) -> dict[str, tuple[int, int]]:
    """Where each section and table with an id lies on the first 1280x800 screen, in CSS
    pixels (top, bottom), as Chromium lays the page out: a copy of the page with a script that
    writes the positions into the DOM, read back with ``--dump-dom``."""
    probe = (
        "<script>document.body.setAttribute('data-layout', JSON.stringify(Array.from("
        "document.querySelectorAll('section[id],table[id]')).map(function(e){"
        "var r=e.getBoundingClientRect();return [e.id,Math.round(r.top),Math.round(r.bottom)];"
        "})));</script>"
    )
    copy = tmp_path / f"probe-{page.name}"
    copy.write_text(page.read_text(encoding="utf-8").replace("</body>", probe + "</body>"))
    res = headless(browser, "--window-size=1280,800", "--dump-dom", copy.as_uri())
    assert res.returncode == 0, res.stderr[-2000:]
    found = re.search(r'data-layout="([^"]*)"', res.stdout)
    assert found, "the probe did not run"
    return {name: (top, bottom) for name, top, bottom in json.loads(unescape(found.group(1)))}


def first_screen(browser: str, page: Path, tmp_path: Path) -> dict[str, tuple[int, int]]:
    """A 1280x800 screenshot of ``page`` (checked to be that PNG) and its layout."""
    shot = tmp_path / f"{page.stem}-1280x800.png"
    res = headless(browser, f"--screenshot={shot}", "--window-size=1280,800", page.as_uri())
    assert res.returncode == 0, res.stderr[-2000:]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert struct.unpack(">II", png[16:24]) == (1280, 800)  # IHDR: width, height
    print(f"screenshot: {shot}")
    return layout(browser, page, tmp_path)


def test_the_headline_table_is_on_the_first_screen(browser, page, tmp_path):
    boxes = first_screen(browser, page[0], tmp_path)
    top, bottom = boxes["headline-evals"]
    assert 0 < top < bottom <= 800, boxes
    assert boxes["headline-data"][0] < 800 and boxes["headline"][0] < top
    # nothing else comes before it
    assert all(b[0] >= boxes["headline"][1] for k, b in boxes.items()
               if not k.startswith("headline")), boxes  # fmt: skip
