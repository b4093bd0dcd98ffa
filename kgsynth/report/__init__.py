"""Run report: a run folder → one self-contained HTML page.

Finds what the stages of a run wrote by their manifests, in any layout (``make all``'s
``walks/``, ``corpus/``, ``eval/stage1/``…, a recipe's own step names, or folders a person named;
:mod:`kgsynth.report.discover`), and renders first the headline numbers (each evaluated model's
Hits@1 with its 95 % interval, overall, by hops and by type; the data funnel's key counts; the
training runs), then, in the order the stages ran, each output's manifest summary, its funnel (attempted → accepted, rejects by reason), its plots (PNG files embedded as base64
data URIs), training curves (the stage's PNG, else an inline SVG drawn from ``metrics.jsonl``),
seeded samples of walks, questions and trajectories (accepted and rejected, with their reasons;
trajectories as chat turns inside ``<details>``) and the evaluation comparison. The page loads
nothing: CSS and JS are inline, and every text from the run is escaped with
:func:`html.escape`. Each kind of stage a whole run has and this one lacks gets one line saying so. Two runs
side by side (:mod:`kgsynth.report.compare`): headline numbers of both with the difference,
funnels side by side, training curves overlaid::

    kgsynth report runs/x                        # writes runs/x/report.html
    kgsynth report runs/x --out /tmp/x.html --samples 12 --seed 1
    kgsynth report runs/x runs/y                 # writes runs/x/compare_y.html

:func:`collect_run` gathers a :class:`RunReport` (raising :class:`ConfigError` for a folder that
is not a run); :func:`render_html` turns it into the page. Both are pure apart from reading.
"""

from kgsynth.report.collect import collect_run, funnel_of, is_run_dir, pick_rows, read_curves
from kgsynth.report.contents import KINDS, Curve, Found, Funnel, Part, RunReport, Sample, Stage
from kgsynth.report.discover import discover
from kgsynth.report.elements import data_uri, svg_curve
from kgsynth.report.markdown import render_markdown
from kgsynth.report.page import render_html
from kgsynth.report.sections import render_chat, render_funnel

__all__ = [
    "KINDS",
    "Curve",
    "Found",
    "Funnel",
    "Part",
    "RunReport",
    "Sample",
    "Stage",
    "collect_run",
    "data_uri",
    "discover",
    "funnel_of",
    "is_run_dir",
    "pick_rows",
    "read_curves",
    "render_chat",
    "render_funnel",
    "render_html",
    "render_markdown",
    "svg_curve",
]
