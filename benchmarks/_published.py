"""The README's results tables: generated from the published CSVs, never typed by hand.

A benchmark run with ``--publish`` copies what it produced into
``benchmarks/published/<key>/`` (committed, unlike ``benchmarks/results/``):

- ``table.csv``: the machine-readable rows (for the comparison protocol, one row per
  method and cell, every metric at the selected and at the last round);
- ``report.md``: the tables and notes exactly as the benchmark printed them;
- ``meta.json``: how the figures were obtained (command, data, protocol, wall time,
  commit, date) and the SHA-256 of both files;
- for the comparison protocol, ``cell_predictions.csv.gz``: every run's test prediction
  of every subject (strategy, fold, seed, site, subject, label, P(ASD)), from which the
  subject-level tests can be recomputed without training again (hashed in ``meta.json``
  too).

It then rewrites the README block between ``<!-- results:<key> -->`` and
``<!-- /results:<key> -->`` with :func:`render_block`. ``tests/test_readme_tables.py``
checks that every block equals its rendering, that the files are those ``meta.json``
hashed, and that the comparison tables' means are those of ``table.csv``.

The key is the benchmark's name for the built-in cohort, and ``<name>-real-<sites>`` on
real ABIDE data, so a real-data table sits beside the built-in one::

    python benchmarks/real_compare.py --data-dir /data/abide --sites PITT,YALE --publish
    python benchmarks/readme_tables.py --check      # the README matches benchmarks/published
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

__all__ = ["PUBLISHED_DIR", "README", "RESULTS_DIR", "blocks", "check_file_names",
           "describe_data", "pages_text", "publish", "publish_key", "render_block",
           "result_pages", "rewrite_readme", "subject_level_table"]

ROOT = Path(__file__).resolve().parent.parent
PUBLISHED_DIR = ROOT / "benchmarks" / "published"
README = ROOT / "README.md"
#: The docs' results pages: every block outside the README's one headline table is here.
RESULTS_DIR = ROOT / "docs"
_KEY = re.compile(r"^[a-z][a-z0-9_]*(-[A-Za-z0-9_,+-]+)?$")
_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # matched whole (fullmatch)
_OWN = ("report.md", "table.csv", "meta.json")
_BLOCK = re.compile(r"<!-- results:(?P<key>[^ ]+) -->\n(?P<body>.*?)<!-- /results:(?P=key) -->",
                    re.DOTALL)


def publish_key(name: str, sites: Sequence[str] | None, real: bool,
                variant: str | None = None) -> str:
    """Return the README key of a benchmark's table (its name, or name-real-SITES).

    A ``variant`` (a run of the benchmark with other features, e.g. ``tangent``) is
    appended, so it is published beside the default's table, not over it.
    """
    if not real:
        key = name
    else:
        key = f"{name}-real-{'_'.join(sites or ())}" if sites else f"{name}-real"
    return f"{key}-{variant}" if variant else key


def describe_data(sites: Sequence[str], real: bool) -> str:
    """Return which data a published table came from, in words."""
    if real:
        return ("real ABIDE Preprocessed (C-PAC, filt_noglobal, rois_ho), shared sites "
                f"{', '.join(sites)}")
    from fedbn_med.tasks.abide.settings import COHORT_VERSION

    return f"built-in cohort v{COHORT_VERSION}, sites {', '.join(sites)}"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


#: The packages whose versions decide a long run's floating-point results.
NUMERIC_STACK = ("torch", "numpy", "scipy", "scikit-learn", "nilearn", "pandas", "monai")


def environment() -> dict[str, object]:
    """Return what a published figure was computed with: Python, CPU and numeric stack.

    Long training runs amplify last-bit differences, so the same command on another
    version of numpy or torch may give other numbers; ``constraints.txt`` pins them.
    The same versions on an AVX-512 and an AVX2 machine (an Intel and an AMD one) gave
    other numbers too, until the libraries' code path was pinned
    (:mod:`fedbn_med.numerics`, recorded under ``numerics``); the CPU's model and a digest
    of its feature flags are recorded as well.
    """
    import platform
    from importlib import metadata

    import torch

    from fedbn_med.numerics import describe

    versions = {}
    for package in NUMERIC_STACK:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "absent"
    return {"python": platform.python_version(), "machine": platform.machine(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), **_cpu(),
            "numerics": describe(), "packages": versions}


def _cpu() -> dict[str, str]:
    """Return the CPU's model name and a short digest of its feature flags (Linux)."""
    import hashlib
    import platform

    from fedbn_med.numerics import cpu_flags, cpu_info

    flags = " ".join(sorted(cpu_flags()))
    return {"cpu_model": cpu_info().get("model name") or platform.processor() or "unknown",
            "cpu_flags_sha256": (hashlib.sha256(flags.encode()).hexdigest()[:12]
                                 if flags else "unknown")}


def _command(name: str, argv: Sequence[str]) -> str:
    """Return the command line, with the local data folder shown as DATA_DIR."""
    shown: list[str] = []
    skip: str | None = None  # what replaces the value of the option just seen
    for arg in argv:
        if skip is not None:
            if skip:
                shown.append(skip)
            skip = None
        elif arg in ("--data-dir", "--real-dir"):
            shown.append(arg)
            skip = "DATA_DIR"
        elif arg.startswith(("--data-dir=", "--real-dir=")):
            shown.append(f"{arg.split('=')[0]}=DATA_DIR")
        elif arg == "--out":  # a local output folder: left out with its value
            skip = ""
        elif arg == "--publish" or arg.startswith("--out="):
            continue
        else:
            shown.append(arg)
    return " ".join(["python", script_path(name), *map(shlex.quote, shown)])


def script_path(name: str) -> str:
    """Return where benchmark ``name`` is now: ``benchmarks/`` or ``benchmarks/research/``."""
    moved = ROOT / "benchmarks" / "research" / f"{name}.py"
    return f"benchmarks/research/{name}.py" if moved.is_file() else f"benchmarks/{name}.py"


_SCRIPT = re.compile(r"^python benchmarks/(\w+)\.py\b")


def publish(key: str, *, name: str, argv: Sequence[str] | None, report: str,
            csv_text: str, data: str, protocol: str, wall_time_s: float,
            check: str = "none", files: Mapping[str, bytes] | None = None) -> Path:
    """Write ``benchmarks/published/<key>/`` and rewrite the README block; return the folder.

    Parameters
    ----------
    key : str
        The README block's key (:func:`publish_key`).
    name : str
        The benchmark script's name.
    argv : sequence of str, optional
        Its command-line arguments (None: ``sys.argv[1:]``).
    report : str
        The tables and notes as printed.
    csv_text : str
        The machine-readable rows.
    data : str
        Which data: the built-in cohort (and version) or which real sites.
    protocol : str
        Rounds, folds and repetitions, the selection rule and the interval.
    wall_time_s : float
        The run's wall time.
    check : str
        What the README test recomputes from ``table.csv``: ``"comparison"`` (per-method
        means of the comparison protocol's tables) or ``"none"``.
    files : mapping of str to bytes, optional
        Further files to publish beside them (e.g. ``cell_predictions.csv.gz``), by
        plain file name; each is hashed in ``meta.json`` like the two above.
    """
    if not _KEY.match(key):
        raise ValueError(f"results key {key!r} must look like 'name' or 'name-real-SITES'")
    extra = dict(files or {})
    check_file_names(extra)  # before anything is written
    folder = PUBLISHED_DIR / key
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():  # a file of an earlier publication, not of this one
        if old.is_file() and old.name not in (*_OWN, *extra):
            old.unlink()
    (folder / "report.md").write_text(report.rstrip() + "\n", encoding="utf-8")
    (folder / "table.csv").write_text(csv_text, encoding="utf-8")
    for file, content in extra.items():
        (folder / file).write_bytes(content)
    meta = {
        "key": key, "benchmark": name,
        "command": _command(name, sys.argv[1:] if argv is None else argv),
        "data": data, "protocol": protocol, "wall_time_s": round(wall_time_s, 1),
        "commit": _commit(),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
        "check": check, "environment": environment(),
        "sha256": {"report.md": _sha256(folder / "report.md"),
                   "table.csv": _sha256(folder / "table.csv"),
                   **{file: _sha256(folder / file) for file in sorted(extra)}},
    }
    (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    if not rewrite_readme(key):
        print(f"(README.md has no block <!-- results:{key} -->: add one where the table "
              f"belongs, then run python benchmarks/readme_tables.py --write)")
    return folder


def check_file_names(files: Iterable[str]) -> None:
    """Raise ``ValueError`` naming a further published file's name that is not plain.

    Plain: letters, digits, ``_``, ``.`` and ``-``, not starting with ``.`` or ``-``,
    and none of the folder's own files (report.md, table.csv, meta.json).
    """
    for file in files:
        if file in _OWN or not _FILE.fullmatch(file):
            raise ValueError(f"published file name {file!r}: expected a plain file name "
                             f"other than report.md, table.csv and meta.json")


def subject_level_table(report: str) -> str | None:
    """Return the subject-level table of a comparison's ``report.md`` (markdown), or None.

    The first table after the line that opens "Subject-level paired tests"
    (:meth:`fedbn_med.evaluation.comparison.Comparison.report`).
    """
    _, found, rest = report.partition("\nSubject-level paired tests")
    if not found:
        return None
    lines = rest.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("|")), None)
    if start is None:
        return None
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")),
               len(lines))
    return "\n".join(lines[start:end])


def load_meta(key: str) -> dict[str, object]:
    """Return ``meta.json`` of a published table (a clear error if absent or damaged)."""
    path = PUBLISHED_DIR / key / "meta.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no published results for README block '{key}'; "
                                f"run its benchmark with --publish") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(meta, dict) or meta.get("key") != key:
        raise ValueError(f"{path}: expected a JSON object with key {key!r}")
    # A study published before the research studies moved to benchmarks/research/: its
    # record stays as it was, and the command shown is the one that runs it today.
    command = meta.get("command")
    if isinstance(command, str):
        meta["command"] = _SCRIPT.sub(lambda m: f"python {script_path(m[1])}", command)
    return meta


def render_block(key: str) -> str:
    """Return the README text of a published table: how it was obtained, then the tables."""
    meta = load_meta(key)
    report = (PUBLISHED_DIR / key / "report.md").read_text(encoding="utf-8").rstrip()
    return (f"`{meta['command']}`: {meta['data']}; {meta['protocol']}; "
            f"{meta['wall_time_s']} s wall time; commit {meta['commit']}, {meta['date']}. "
            f"Files: `benchmarks/published/{key}/`.\n\n{report}\n")


def blocks(text: str) -> dict[str, str]:
    """Return every results block of a README text, by key."""
    return {m["key"]: m["body"] for m in _BLOCK.finditer(text)}


def result_pages() -> list[Path]:
    """Return the files that hold results blocks: the README and the docs' pages."""
    docs = sorted(RESULTS_DIR.rglob("*.md")) if RESULTS_DIR.is_dir() else []
    return [README, *docs]


def pages_text() -> str:
    """Return the text of every results page, one after another (for the checks)."""
    return "\n".join(page.read_text(encoding="utf-8") for page in result_pages())


def rewrite_readme(key: str | None = None, readme: Path | None = None) -> bool:
    """Re-render one block (or every block) of the results pages (or of ``readme`` only).

    Return whether any was found.
    """
    found = False
    for page in [readme] if readme is not None else result_pages():
        found = _rewrite_page(page, key) or found
    return found


def _rewrite_page(readme: Path, key: str | None) -> bool:
    text = readme.read_text(encoding="utf-8")
    found = False

    def replace(match: re.Match[str]) -> str:
        nonlocal found
        if key is not None and match["key"] != key:
            return match[0]
        found = True
        return (f"<!-- results:{match['key']} -->\n{render_block(match['key'])}"
                f"<!-- /results:{match['key']} -->")

    new = _BLOCK.sub(replace, text)
    if new != text:
        readme.write_text(new, encoding="utf-8")
    return found


def check_hashes(key: str) -> list[str]:
    """Return what differs between a published folder and the hashes in its meta.json."""
    meta = load_meta(key)
    problems = []
    hashes = meta.get("sha256")
    if not isinstance(hashes, Mapping):
        return [f"benchmarks/published/{key}/meta.json: no sha256 table"]
    for file in sorted({"report.md", "table.csv", *hashes}):
        path = PUBLISHED_DIR / key / str(file)
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif _sha256(path) != hashes.get(file):
            problems.append(f"{path}: changed since its benchmark published it")
    for path in sorted((PUBLISHED_DIR / key).iterdir()):
        if path.is_file() and path.name not in (*_OWN, *hashes):
            problems.append(f"{path}: not published by its benchmark (meta.json has no "
                            f"hash for it)")
    return problems


_TITLE = re.compile(r"^Test (?P<metric>balanced accuracy|AUC|accuracy|dice(_csf|_gm|_wm)?) "
                    r"at the (?P<at>best-validation|last) round:$")
_METRICS = {"balanced accuracy": "balanced_accuracy", "AUC": "auc", "accuracy": "accuracy",
            **{d: d for d in ("dice", "dice_csf", "dice_gm", "dice_wm")}}  # MRI


def _tables(report: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """Return (title line, header, rows) of every markdown table in a report."""
    found, lines = [], report.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("| ") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            title = next((t for t in reversed(lines[:i]) if t.strip()), "")
            header = [c.strip() for c in lines[i].strip("|").split("|")]
            rows, i = [], i + 2
            while i < len(lines) and lines[i].startswith("| "):
                rows.append([c.strip() for c in lines[i].strip("|").split("|")])
                i += 1
            found.append((title.strip(), header, rows))
        else:
            i += 1
    return found


def check_comparison(key: str) -> list[str]:
    """Recompute the comparison tables' means from ``table.csv``; return every mismatch.

    Every cell of a "Test <metric> at the <round> round" table reads ``mean [low, high]``
    in %; its mean must be the mean over that method's cells of the CSV column
    ``<metric>_<best|last>_<site or mean>`` (cells where it is not a number left out).
    """
    import csv
    import math

    folder = PUBLISHED_DIR / key
    with open(folder / "table.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    report = (folder / "report.md").read_text(encoding="utf-8")
    problems, checked = [], 0
    for title, header, body in _tables(report):
        match = _TITLE.match(title)
        if not match:
            continue
        at = "best" if match["at"] == "best-validation" else "last"
        metric = _METRICS[match["metric"]]
        for line in body:
            method = line[0]
            cells = [r for r in rows if r.get("strategy") == method]
            for column, shown in zip(header[1:], line[1:]):
                field = f"{metric}_{at}_{column}"
                values = [float(r[field]) for r in cells if r.get(field) not in (None, "")]
                values = [v for v in values if not math.isnan(v)]
                head = shown.split("[")[0].strip()
                if not values:
                    if head != "n/a":
                        problems.append(f"{key}: {title} {method} {column}: shows {shown}, "
                                        f"table.csv has no value")
                    continue
                expected = 100 * sum(values) / len(values)
                try:
                    ok = abs(float(head) - expected) <= 0.051
                except ValueError:
                    ok = False
                checked += 1
                if not ok:
                    problems.append(f"{key}: {title} {method} {column}: shows {head}, "
                                    f"table.csv gives {expected:.2f}")
    if not checked:
        problems.append(f"{key}: no comparison table found in report.md to check")
    return problems
