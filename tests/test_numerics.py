"""The numeric code path: fedbn_med.numerics.pinned pins torch, MKL, numpy, OpenBLAS, oneDNN.

Importing fedbn_med itself changes nothing process-wide; entry scripts opt in.
"""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedbn_med import numerics

ROOT = Path(__file__).resolve().parent.parent
AVX2 = frozenset({"avx2", "fma", "sse4_2"})


def test_pin_sets_every_library_variable_on_an_avx2_machine() -> None:
    environ: dict[str, str] = {}
    added = numerics.pin(environ, flags=AVX2, machine="x86_64")
    assert environ == numerics.PINNED and added == numerics.PINNED
    assert environ["ATEN_CPU_CAPABILITY"] == "avx2" and environ["MKL_CBWR"] == "COMPATIBLE"
    assert environ["ONEDNN_MAX_CPU_ISA"] == "AVX2"


def test_pin_leaves_a_users_own_choice_alone() -> None:
    environ = {"MKL_CBWR": "AVX2"}
    added = numerics.pin(environ, flags=AVX2, machine="x86_64")
    assert environ["MKL_CBWR"] == "AVX2" and "MKL_CBWR" not in added
    assert environ["ATEN_CPU_CAPABILITY"] == "avx2"


@pytest.mark.parametrize(("environ", "flags", "machine"), [
    ({"FEDBN_MED_NUMERICS": "native"}, AVX2, "x86_64"),
    ({"FEDBN_MED_NUMERICS": " Native "}, AVX2, "x86_64"),
    ({}, frozenset({"sse4_2", "avx"}), "x86_64"),  # no AVX2: torch would fault on it
    ({}, frozenset({"avx2"}), "x86_64"),  # AVX2 without FMA
    ({}, frozenset({"asimd", "sve"}), "aarch64"),
])
def test_pin_sets_nothing_when_asked_not_to_or_where_avx2_is_missing(
        environ: dict[str, str], flags: frozenset[str], machine: str) -> None:
    before = dict(environ)
    assert numerics.pin(environ, flags=flags, machine=machine) == {}
    assert environ == before


def test_a_bad_switch_value_is_named() -> None:
    with pytest.raises(ValueError, match=r"FEDBN_MED_NUMERICS='avx512'.*'pinned'.*'native'"):
        numerics.pin({"FEDBN_MED_NUMERICS": "avx512"}, flags=AVX2, machine="x86_64")


def test_cpu_flags_read_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 fma sse2\n")
    assert numerics.cpu_flags(str(info)) == {"fpu", "avx2", "fma", "sse2"}
    assert numerics.cpu_flags(str(tmp_path / "absent")) == frozenset()
    assert not numerics.pinnable(frozenset(), "x86_64")


def _stdout(env_changes: dict[str, str], code: str) -> str:
    """Run ``code`` in a fresh interpreter without the pin's variables; return its stdout."""
    env = {k: v for k, v in os.environ.items()
           if k not in (*numerics.PINNED, numerics.SWITCH)}
    env.update(env_changes)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, check=True).stdout


def _fresh(env_changes: dict[str, str], code: str) -> dict:
    return json.loads(_stdout(env_changes, code).strip().splitlines()[-1])


def _fresh_together(*runs: tuple[dict[str, str], str]) -> list[dict]:
    """Return :func:`_fresh` of each ``(env_changes, code)``, the processes side by side."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(len(runs), 4)) as pool:
        return list(pool.map(lambda run: _fresh(*run), runs))


_REPORT = ("import json, os\nimport fedbn_med.numerics.pinned\nfrom fedbn_med import numerics\n"
           "import torch\ntorch.ones(4).sum()\n"
           "print(json.dumps({'env': {k: os.environ.get(k) for k in numerics.PINNED},"
           " 'describe': numerics.describe()}))")


@pytest.mark.skipif(not numerics.pinnable(), reason="the pin needs x86-64 with AVX2 and FMA")
def test_a_fresh_process_runs_the_pinned_path_and_the_switch_turns_it_off() -> None:
    # each case is a fresh interpreter of its own; they run side by side
    pinned, native, own, loops, branch, late, inherited = _fresh_together(
        ({}, _REPORT),
        ({"FEDBN_MED_NUMERICS": "native"}, _REPORT),
        ({"ATEN_CPU_CAPABILITY": "default"}, _REPORT),
        ({"NPY_DISABLE_CPU_FEATURES": "X86_V3 X86_V4 AVX512_ICL AVX512_SPR"}, _REPORT),
        ({"MKL_CBWR": "AVX2"}, _REPORT),
        ({}, "import numpy\n" + _REPORT),
        (dict(numerics.PINNED), "import numpy\n" + _REPORT))
    assert pinned["env"] == numerics.PINNED
    assert pinned["describe"]["mode"] == "pinned"
    assert pinned["describe"]["torch_capability"] == "AVX2"
    assert not pinned["describe"]["numpy_x86_v4"]

    assert all(value is None for value in native["env"].values())

    # A user's own choice is kept, and the record says the run is not on the pinned path.
    assert own["describe"]["torch_capability"] == "DEFAULT"
    assert own["describe"]["mode"] == "native"

    # numpy without its AVX2 loops writes another cohort: not the pinned path either
    assert loops["describe"]["mode"] == "native"

    # MKL's AVX2 branch gives other numbers on a non-Intel CPU: not the pinned path
    assert branch["env"]["MKL_CBWR"] == "AVX2" and branch["describe"]["mode"] == "native"

    # numpy loaded first keeps its own kernels: the record says so
    assert late["describe"]["loaded_before_pin"] == ["numpy"]
    assert late["describe"]["mode"] == "native"
    # ... unless the process had the variables from its start (a site a launcher started)
    assert inherited["describe"]["loaded_before_pin"] == []
    assert inherited["describe"]["mode"] == "pinned"


@pytest.mark.skipif(not numerics.pinnable(), reason="the pin needs x86-64 with AVX2 and FMA")
def test_onednn_convolutions_run_on_the_pinned_isa() -> None:
    # oneDNN (torch takes it for a convolution this size) names the instruction set it
    # dispatches to when asked to be verbose. On a CPU whose best is AVX2 this holds
    # anyway: it tests the cap only where the CPU has more (AVX-512, AMX).
    code = ("import fedbn_med.numerics.pinned, torch\n"
            "torch.nn.Conv3d(1, 8, 3)(torch.ones(2, 1, 16, 16, 16))\n")
    out = _stdout({"ONEDNN_VERBOSE": "1"}, code)
    isa = [line for line in out.splitlines() if ",cpu,isa:" in line]
    assert isa and isa[0].endswith("isa:Intel AVX2"), isa


@pytest.mark.skipif(not numerics.pinnable(), reason="the pin needs x86-64 with AVX2 and FMA")
def test_this_test_process_is_on_the_pinned_path() -> None:
    # conftest imports fedbn_med before numpy, as every entry script must
    assert numerics.describe()["mode"] == "pinned"


def _first_import(path: Path) -> str:
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            return node.names[0].name
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            return node.module or ""
    return ""


@pytest.mark.parametrize("script", sorted(
    str(p.relative_to(ROOT / "benchmarks"))
    for folder in (ROOT / "benchmarks", ROOT / "benchmarks" / "research")
    for p in folder.glob("*.py")
    if not p.name.startswith("_")))
def test_every_benchmark_pins_before_numpy_loads(script: str) -> None:
    # numpy and OpenBLAS read their variable once, when they load
    assert _first_import(ROOT / "benchmarks" / script) == "fedbn_med.numerics.pinned"


def test_importing_the_library_changes_nothing_process_wide() -> None:
    code = ("import json, os\nimport fedbn_med\nfrom fedbn_med import numerics\n"
            "import sys\nprint(json.dumps([{k: os.environ.get(k) for k in numerics.PINNED},"
            " sorted({'numpy', 'torch'} & set(sys.modules))]))")
    env, loaded = json.loads(_stdout({}, code).strip().splitlines()[-1])
    assert env == {name: None for name in numerics.PINNED}
    assert loaded == []  # and it loads no numeric library


def test_the_pipelines_import_nothing_numeric_before_fedbn_med() -> None:
    for path in sorted((ROOT / "pipelines").glob("*.py")):
        modules = []
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Import):
                modules += [n.name for n in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
                modules.append(node.module or "")
        first = next(m for m in modules if m.split(".")[0] not in sys.stdlib_module_names)
        assert first.split(".")[0] == "fedbn_med", path.name


def test_the_fingerprint_sees_the_last_bit_and_nothing_else() -> None:
    bench = _numerics_benchmark()
    curve = [{"A": 0.6931471805599453, "B": 0.5}, {"A": 0.61, "B": 0.49}]
    same = [{"B": 0.5, "A": 0.6931471805599453}, {"B": 0.49, "A": 0.61}]  # other key order
    nudged = [{"A": 0.6931471805599453, "B": 0.5},
              {"A": 0.61, "B": math.nextafter(0.49, 1.0)}]  # one bit more
    assert bench.fingerprint(curve) == bench.fingerprint(same)
    assert bench.fingerprint(curve) != bench.fingerprint(nudged)
    assert len(bench.fingerprint(curve)) == 12


def test_the_final_weights_carry_the_last_bit_the_rounded_losses_hide() -> None:
    import torch

    bench = _numerics_benchmark()
    weights = {"net.0.weight": torch.linspace(-1, 1, 12).reshape(3, 4),
               "net.0.bias": torch.zeros(3)}
    nudged = dict(weights, **{"net.0.bias": torch.nextafter(torch.zeros(3), torch.ones(3))})
    reordered = {k: weights[k] for k in reversed(list(weights))}
    digest = bench.weights_digest(weights)
    assert digest == bench.weights_digest(reordered) and len(digest) == 12
    assert digest != bench.weights_digest(nudged)
    curve = [{"A": 0.6931, "B": 0.5}]  # as recorded: 4 decimals, a last bit does not show
    other = bench.weights_digest(nudged)
    assert bench.fingerprint(curve, digest) != bench.fingerprint(curve, other)


def test_against_compares_fingerprints_or_every_bit_of_the_figures(tmp_path: Path) -> None:
    bench = _numerics_benchmark()
    row = {"selected_round": 81, "accuracy": 0.6262515262515262,
           "balanced_accuracy": 0.6139069264069263, "auc": 0.6011544011544011,
           "val_loss_sha256": "287e854e76ac"}
    table = tmp_path / "table.csv"
    next_up = repr(math.nextafter(row["accuracy"], 1.0))  # one bit more
    table.write_text("path,fold,selected_round,accuracy,balanced_accuracy,auc,val_loss_sha256\n"
                     "pinned,0,81,0.6262515262515262,0.6139069264069263,0.6011544011544011,\n"
                     f"pinned,1,81,{next_up},0.6139069264069263,0.6011544011544011,\n"
                     "pinned,2,80,0.1,0.1,0.1,287e854e76ac\n"
                     "pinned,3,81,0.6262515262515262,0.6139069264069263,0.6011544011544011,"
                     "aaaaaaaaaaaa\n")
    other = bench.read_against(table)
    assert bench.same_as(row, other[("pinned", 0)]) == "same figures"
    assert bench.same_as(row, other[("pinned", 1)]) == "differs"  # one bit of accuracy
    assert bench.same_as(row, other[("pinned", 2)]) == "same fingerprint"  # it rules
    assert bench.same_as(row, other[("pinned", 3)]) == "differs"
    assert bench.same_as(row, other.get(("native", 0))) == "no such row"


@pytest.mark.parametrize(("text", "expected"), [
    (None, "cannot read it"),
    ("path,fold\npinned,0\n", "expected a table.csv of benchmarks/research/numerics.py"),
    ("", "expected a table.csv"),
    ("path,fold,selected_round,accuracy,balanced_accuracy,auc\n", "has no rows"),
    ("path,fold,selected_round,accuracy,balanced_accuracy,auc\npinned,x,1,0,0,0\n",
     "line 2: expected a fold"),
    ("path,fold,selected_round,accuracy,balanced_accuracy,auc\npinned,0,1,0.5\n",
     "line 2: expected a fold.*too few values"),
    ("path,fold,selected_round,accuracy,balanced_accuracy,auc\npinned,0,1,0.5,0.5,n/a?\n",
     "line 2: expected a fold"),
    ("path,fold,selected_round,accuracy,balanced_accuracy,auc\npinned,0,1,0,0,0\n"
     "pinned,0,2,0,0,0\n", "line 3: 'pinned' fold 0 is listed twice"),
])
def test_a_bad_against_file_is_named(tmp_path: Path, text: str | None, expected: str) -> None:
    bench = _numerics_benchmark()
    path = tmp_path / "other.csv"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SystemExit, match=expected) as caught:
        bench.read_against(path)
    assert str(path) in str(caught.value)


def test_the_kept_amd_table_reads_as_an_against_file() -> None:
    bench = _numerics_benchmark()
    rows = bench.read_against(ROOT / "benchmarks" / "reference" / "numerics-amd-epyc-avx2.csv")
    assert {path for path, _ in rows} <= set(bench.PATHS)
    assert {fold for _, fold in rows} == set(range(5))


def _numerics_benchmark():  # type: ignore[no-untyped-def]
    import importlib

    for folder in (ROOT / "benchmarks", ROOT / "benchmarks" / "research"):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    return importlib.import_module("numerics")


def test_the_benchmark_compares_its_runs_with_another_machines_table(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        abide_release: Path) -> None:
    # two code paths, 2 rounds on fold 0: each runs in a fresh process of its own, on the
    # tiny real-layout release (each computes its features afresh, into a cache of its own;
    # on the built-in cohort each would write the whole cohort first, some 8 s a process)
    bench = _numerics_benchmark()
    monkeypatch.setattr(bench, "PATHS", {bench.PINNED_PATH: {},
                                         "MKL: AVX2 branch (Intel CPUs only)":
                                             {"MKL_CBWR": "AVX2"}})
    other = tmp_path / "other.csv"
    other.write_text("path,fold,selected_round,accuracy,balanced_accuracy,auc,"
                     "val_loss_sha256\npinned,0,1,0.5,0.5,0.5,000000000000\n")
    assert bench.main(["--folds", "1", "--rounds", "2", "--data-dir", str(abide_release),
                       "--against", str(other)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| pinned | AVX2 / ")]
    assert len(rows) == 1 and rows[0].endswith("| differs |")  # another fingerprint
    fingerprint = rows[0].split("|")[-3].strip()
    assert len(fingerprint) == 12 and fingerprint != "000000000000"
    assert rows[0].split("|")[-4].strip() == "identical"  # its final weights: pinned's own
    assert "| MKL: AVX2 branch (Intel CPUs only) | AVX2 / AVX2 | 0 |" in out
    assert "no such row" in out and "0 of 1 runs agree" in out
