"""Run report: a run folder → one self-contained HTML page.

Reads what the stages of a run wrote (``kg/``, ``walks/``, ``questions/``, ``trajectories/``,
``corpus/``, ``stage1/``, ``stage2_data/``, ``corpus_stage2/``, ``stage2/``, ``rl/``,
``eval/<label>/``, ``summary/``) and renders, in pipeline order, each stage's manifest summary,
its funnel (attempted → accepted, rejects by reason), its plots (PNG files embedded as base64
data URIs), training curves (the stage's PNG, else an inline SVG drawn from ``metrics.jsonl``),
seeded samples of walks, questions and trajectories (accepted and rejected, with their reasons;
trajectories as chat turns inside ``<details>``) and the evaluation comparison. The page loads
nothing: CSS and JS are inline, and every text from the run is escaped with
:func:`html.escape`. Missing stages get one line saying so::

    kgsynth report runs/x                        # writes runs/x/report.html
    kgsynth report runs/x --out /tmp/x.html --samples 12 --seed 1

:func:`collect_run` gathers a :class:`RunReport` (raising :class:`ConfigError` for a folder that
is not a run); :func:`render_html` turns it into the page. Both are pure apart from reading.
"""

from kgsynth.report.collect import collect_run, funnel_of, is_run_dir, pick_rows, read_curves
from kgsynth.report.contents import PIPELINE, Curve, Funnel, Part, RunReport, Sample, Stage
from kgsynth.report.elements import data_uri, svg_curve
from kgsynth.report.markdown import render_markdown
from kgsynth.report.page import render_html
from kgsynth.report.sections import render_chat, render_funnel

__all__ = [
    "PIPELINE",
    "Curve",
    "Funnel",
    "Part",
    "RunReport",
    "Sample",
    "Stage",
    "collect_run",
    "data_uri",
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
