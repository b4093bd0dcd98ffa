"""kgsynth as an installable package: what it ships (``kgsynth/resources/``) is found by name
wherever it is installed, and a wheel built from this checkout runs the pipeline's first steps
from a folder that is not the checkout.

The fast tests resolve names in this process. The wheel test builds the wheel (and the sdist)
from a copy of the checkout, installs it into a fresh venv made in ``tmp_path`` whose other
dependencies come from this test's own environment through a ``.pth`` line (kgsynth itself
only from the wheel; the checkout's editable finder stays inactive there), and runs the smoke
chain: ``recipes``, ``kg import`` of the packaged default KG, ``walk``, ``synthesize
questions`` (template), ``synthesize trajectories``, ``filter``, ``train stage1 --deepspeed
zero2 --dry-run`` and ``run metaqa_default``. The slow test does the honest install from the
package index: torch first, then the wheel under ``constraints.txt``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from kgsynth.core.errors import ConfigError
from kgsynth.resources import (
    deepspeed_names,
    default_kg,
    dev_check,
    dev_sample,
    find_deepspeed,
    find_recipe,
    prompts_dir,
    recipe_description,
    recipe_names,
)

CHECKOUT = Path(__file__).resolve().parents[1]
SHIPPED = [  # every packaged file a wheel and an sdist must hold, under kgsynth/resources/
    "prompts/question_path.j2",
    "prompts/agent_system.j2",
    "recipes/metaqa_default.yaml",
    "recipes/sparql_agents.yaml",
    "recipes/kbqa-r1.yaml",
    "recipes/graphwalker.yaml",
    "recipes/kg-r1.yaml",
    "recipes/kg-r1-sft.yaml",
    "recipes/knowcoder-a1.yaml",
    "recipes/isp.yaml",
    "deepspeed/ds_zero0.json",
    "deepspeed/ds_zero2.json",
    "deepspeed/ds_zero3.json",
    "deepspeed/README.md",
    "metaqa/kb_partial.txt.gz",
    "metaqa/LICENSE.txt",
    "metaqa/SOURCE.md",
    "metaqa/make_dev_sample.py",
    "metaqa/dev_sample/metaqa_dev_sample.jsonl",
    "metaqa/dev_check/metaqa_dev_check.jsonl",
]


# --- names, in this process ---------------------------------------------------------------


def test_the_packaged_files_are_found_inside_the_package():
    package = CHECKOUT / "kgsynth" / "resources"
    assert recipe_names() == [
        "graphwalker", "isp", "kbqa-r1", "kg-r1", "kg-r1-sft", "knowcoder-a1", "metaqa_default",
        "sparql_agents",
    ]  # fmt: skip
    assert deepspeed_names() == ["zero0", "zero2", "zero3"]
    assert default_kg() == package / "metaqa" / "kb_partial.txt.gz" and default_kg().is_file()
    assert dev_sample().is_file() and dev_check().is_file()
    assert (prompts_dir() / "question_path.j2").is_file()
    assert recipe_description("metaqa_default").startswith("The main job (make all)")
    assert all(recipe_description(n) and "\n" not in recipe_description(n) for n in recipe_names())
    for name in SHIPPED:
        assert (package / name).is_file(), name


def test_a_recipe_and_a_deepspeed_config_by_name_by_file_name_or_by_path(tmp_path):
    recipes = CHECKOUT / "kgsynth" / "resources" / "recipes"
    zero = CHECKOUT / "kgsynth" / "resources" / "deepspeed"
    notes: list[str] = []
    for spelling in ("metaqa_default", "metaqa_default.yaml"):
        assert find_recipe(spelling, notes.append) == recipes / "metaqa_default.yaml"
    for spelling in ("zero2", "ds_zero2", "ds_zero2.json"):
        assert find_deepspeed(spelling, notes.append) == zero / "ds_zero2.json"
    assert notes == []  # a name is no old spelling
    own = tmp_path / "ds_zero2.json"  # a file of the user's own wins over the packaged name
    own.write_text('{"zero_optimization": {"stage": 1}}')
    assert find_deepspeed(own) == own
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert find_deepspeed("ds_zero2.json") == Path("ds_zero2.json")
    finally:
        os.chdir(cwd)


def test_the_old_checkout_paths_name_the_packaged_files_with_one_note(tmp_path):
    notes: list[str] = []
    old = tmp_path / "pipelines" / "kbqa_r1.yaml"  # no such file there any more
    assert find_recipe(old, notes.append).name == "kbqa-r1.yaml"  # renamed since
    assert find_recipe(old, notes.append).name == "kbqa-r1.yaml"
    assert find_recipe("kbqa_r1", notes.append).name == "kbqa-r1.yaml"  # the earlier name
    zero = tmp_path / "train" / "ds_zero3.json"
    assert find_deepspeed(zero, notes.append).name == "ds_zero3.json"
    assert notes == [
        f"recipe: {old} is now the packaged recipe 'kbqa-r1' (give the name: kbqa-r1)",
        f"--deepspeed: {zero} is now the packaged DeepSpeed config 'zero3' (give the name: zero3)",
    ]  # once a process each: a config is read several times in a run


@pytest.mark.parametrize(
    ("find", "value", "line"),
    [
        (find_recipe, "metaqa", "recipe: metaqa: no packaged recipe of that name; packaged "
         "recipes: graphwalker, isp, kbqa-r1, kg-r1, kg-r1-sft, knowcoder-a1, metaqa_default, "
         "sparql_agents"),
        (find_recipe, "mine/metaqa_default.yaml", "recipe: mine/metaqa_default.yaml: no such "
         "file; packaged recipes: graphwalker, isp, kbqa-r1, kg-r1, kg-r1-sft, knowcoder-a1, "
         "metaqa_default, sparql_agents"),
        (find_deepspeed, "zero1", "--deepspeed: zero1: no packaged DeepSpeed config of that "
         "name; packaged DeepSpeed configs: zero0, zero2, zero3"),
        (find_deepspeed, "train/ds_zero9.json", "--deepspeed: train/ds_zero9.json: no such file; "
         "packaged DeepSpeed configs: zero0, zero2, zero3"),
    ],
)  # fmt: skip
def test_an_unknown_name_is_one_line_listing_the_packaged_names(find, value, line):
    with pytest.raises(ConfigError) as err:
        find(value)
    assert str(err.value) == line


def test_a_folder_is_not_a_recipe(tmp_path):
    with pytest.raises(ConfigError, match=r"a folder, not a file; packaged recipes: graphwalker"):
        find_recipe(tmp_path)


# --- the wheel, installed in a fresh venv ---------------------------------------------------


def _source_copy(into: Path) -> Path:
    """What a build reads (pyproject, README, the package), copied: the build's own folders
    (build/, *.egg-info) land there, not in the checkout."""
    src = into / "src"
    src.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(CHECKOUT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(CHECKOUT / "kgsynth", src / "kgsynth", ignore=ignore)
    return src


def _run(args: list[str], timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from this checkout, offline (this environment's setuptools)."""
    base = tmp_path_factory.mktemp("build")
    src, dist = _source_copy(base), base / "dist"
    done = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                 "-q", "-w", str(dist), str(src)])  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (built,) = dist.glob("kgsynth-*.whl")
    return built


def test_the_wheel_and_the_sdist_hold_every_packaged_file(wheel, tmp_path):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"kgsynth/resources/{f}" for f in SHIPPED} <= names
    native = {f"kgsynth/llm/{f}" for f in ("decode_step.c", "decode_loop.c", "decode_step.h")}
    assert native <= names  # the native decode step builds from them
    assert not any(n.startswith(("prompts/", "pipelines/", "train/", "data/")) for n in names)
    src = _source_copy(tmp_path)
    code = (
        "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    )
    done = _run([sys.executable, "-c", code, str(tmp_path / "sdist")], cwd=src)
    assert done.returncode == 0, done.stderr[-3000:]
    archive = tmp_path / "sdist" / done.stdout.split()[-1]
    with tarfile.open(archive) as tar:
        inside = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {f"kgsynth/resources/{f}" for f in SHIPPED} <= inside
    assert native <= inside


def _venv(where: Path, *, pip: bool) -> Path:
    args = [sys.executable, "-m", "venv", *([] if pip else ["--without-pip"]), str(where)]
    done = _run(args)
    assert done.returncode == 0, done.stderr[-2000:]
    return where / "bin" / "python"


def _site_packages(python: Path) -> Path:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(_run([str(python), "-c", code]).stdout.strip())


def _clean_env(venv: Path, home: Path) -> dict[str, str]:
    """The venv's bin first on PATH; no PYTHONPATH (it could name the checkout); kgsynth's
    cache inside the test."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.update(KGSYNTH_CACHE=str(home / "cache"), OMP_NUM_THREADS="1", VIRTUAL_ENV=str(venv))
    env["XDG_CACHE_HOME"] = str(home / "xdg")  # where the native decode step is built
    return env


def _check_isolated(python: Path, venv: Path, work: Path, env: dict[str, str]) -> None:
    """kgsynth, its packaged files and its console script come from the venv; no editable
    finder of the checkout is on the import path."""
    code = (
        "import json, sys, kgsynth, kgsynth.resources as r; from kgsynth.llm import native_step as n;"
        "print(json.dumps({"
        "'file': kgsynth.__file__, 'kg': str(r.default_kg()), 'prompts': str(r.prompts_dir()),"
        "'native': str(n.SOURCES[0]), 'built': n.load() is not None,"
        "'finders': [getattr(f, '__module__', '') or '' for f in sys.meta_path],"
        "'modules': [m for m in sys.modules if 'editable' in m]}))"
    )
    done = _run([str(python), "-c", code], cwd=work, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    where = json.loads(done.stdout)
    for key in ("file", "kg", "prompts", "native"):
        assert Path(where[key]).resolve().is_relative_to(venv.resolve()), where
        assert not Path(where[key]).resolve().is_relative_to(CHECKOUT), where
    assert not any("editable" in f for f in where["finders"]) and not where["modules"], where
    assert shutil.which("kgsynth", path=env["PATH"]) == str(venv / "bin" / "kgsynth")
    # the installed sources build the native decode step wherever there is a compiler
    assert where["built"] == bool(shutil.which("cc") or shutil.which("gcc")), where


def _smoke_chain(work: Path, env: dict[str, str], python: Path) -> None:
    """The first steps of the pipeline, each as a user types it, from ``work``."""

    def kgsynth(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
        done = _run(["kgsynth", *args], cwd=work, env=env)
        said = f"kgsynth {' '.join(args)}: {done.stdout[-1500:]}{done.stderr[-3000:]}"
        assert (done.returncode == 0) == ok, said
        return done

    listing = kgsynth("recipes").stdout
    assert "metaqa_default  The main job" in listing and "zero0, zero2, zero3" in listing
    (work / "my.yaml").write_text(kgsynth("recipes", "metaqa_default").stdout)
    assert "steps:" in (work / "my.yaml").read_text()
    assert '"stage": 2' in kgsynth("recipes", "zero2").stdout
    bad = kgsynth("recipes", "nope", ok=False).stderr.strip()
    assert bad.count("\n") == 0 and "metaqa_default" in bad and "zero2" in bad

    code = "from kgsynth.resources import default_kg; print(default_kg())"
    kb = _run([str(python), "-c", code], cwd=work, env=env).stdout.strip()
    kgsynth("kg", "import", kb, "--out", "kg")
    kgsynth("walk", "--kg", "kg", "--config", "metaqa_default", "--n", "30", "--out", "w.parquet")
    kgsynth("synthesize", "questions", "--walks", "w.parquet", "--llm", "template",
            "--out", "q.parquet")  # fmt: skip
    kgsynth("synthesize", "trajectories", "--config", "metaqa_default", "--questions",
            "q.parquet", "--kg", "kg", "--llm", "template", "--out", "t.parquet")  # fmt: skip
    kgsynth("filter", "--config", "metaqa_default", "--in", "t.parquet", "--out", "corpus")
    manifest = json.loads((work / "q.manifest.json").read_text())
    assert manifest["git_sha"] is None  # an installed kgsynth has no commit to record

    train = ["train", "stage1", "--corpus", "corpus/accepted.parquet", "--model", "tiny"]
    train += ["--out", "stage1", "--dry-run"]
    for spelling in ("zero2", "train/ds_zero2.json"):
        done = kgsynth(*train, "--deepspeed", spelling)
        resolved, _ = json.JSONDecoder().raw_decode(done.stdout)  # then the launch line
        assert resolved["config"]["deepspeed"] == spelling
        assert ("is now the packaged DeepSpeed config 'zero2'" in done.stderr) == ("/" in spelling)
    bad = kgsynth(*train, "--deepspeed", "zero9", ok=False).stderr.strip()
    assert bad == (
        "error: --deepspeed: zero9: no packaged DeepSpeed config of that name; packaged "
        "DeepSpeed configs: zero0, zero2, zero3"
    )

    kgsynth("run", "metaqa_default", "--kg", "kg", "--smoke", "--until", "kg_stats", "--out", "run")
    assert json.loads((work / "run" / "kg_stats.json").read_text())
    planned = kgsynth("run", "my.yaml", "--dry-run", "--out", "run2").stdout
    assert f"kg import {kb} --out" in planned and "--config" in planned
    old = kgsynth("run", "pipelines/metaqa_default.yaml", "--dry-run", "--out", "run3")
    assert "note: recipe: pipelines/metaqa_default.yaml is now the packaged recipe" in old.stderr


def test_the_wheel_runs_outside_the_checkout_in_a_fresh_venv(wheel, tmp_path):
    """The fresh venv takes kgsynth from the wheel only and every other package from this
    environment's site-packages (a ``.pth`` line; a ``.pth`` file inside a folder added that
    way is not processed, so the checkout's editable finder stays inactive; checked)."""
    if shutil.which("git"):  # the venv inside some git repository: still no commit recorded
        subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    venv = tmp_path / "venv"
    python = _venv(venv, pip=False)
    done = _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                 "--no-index", "-q", str(wheel)])  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (_site_packages(python) / "kgsynth_test_deps.pth").write_text("\n".join(sorted(ours)) + "\n")
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = _clean_env(venv, tmp_path)
    _check_isolated(python, venv, work, env)
    _smoke_chain(work, env, python)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_the_wheel_installs_from_the_package_index_and_runs(wheel, tmp_path):
    """The honest install: a fresh venv with its own pip, torch first (pinned, the CPU build
    the index gives here), then the wheel with every dependency under constraints.txt."""
    venv = tmp_path / "venv"
    python = _venv(venv, pip=True)
    for args in (["torch==2.13.0"], ["-c", str(CHECKOUT / "constraints.txt"), str(wheel)]):
        done = _run([str(python), "-m", "pip", "install", "-q", *args], timeout=2400)
        assert done.returncode == 0, done.stderr[-3000:]
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = _clean_env(venv, tmp_path)
    _check_isolated(python, venv, work, env)
    pip_list = _run([str(python), "-m", "pip", "list", "--format", "json"], env=env).stdout
    installed = {p["name"].lower() for p in json.loads(pip_list)}
    assert {"torch", "transformers", "deepspeed", "pyoxigraph"} <= installed
    assert "trl" not in installed  # an extra, not a dependency
    _smoke_chain(work, env, python)
