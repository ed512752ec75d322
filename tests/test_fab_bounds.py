"""A FAB bomb is refused before it is read (issue 44, item 8).

A real zip archive, as ``flwr build`` writes one, whose ``pyproject.toml`` inflates to
1 GiB from about 1 MB; the site's reader (:func:`fedbn_med.federation._flwr_compat.
fused_run_config`, which every site node calls on the run's FAB) refuses it from the
archive's directory alone. Before issue 44 the same archive cost a site 58 s and 2.2 GB.
"""

from __future__ import annotations

import io
import time
import tracemalloc
import zipfile
import zlib

import pytest

from fedbn_med.federation._flwr_compat import fused_run_config
from fedbn_med.federation.fab import MAX_FAB_BYTES, MAX_MEMBER_BYTES, check_fab

GIB = 1 << 30


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """Return a zip whose pyproject.toml inflates to 1 GiB (deflated at level 9)."""
    out = io.BytesIO()
    chunk = b" " * (16 << 20)
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED,
                         compresslevel=zlib.Z_BEST_COMPRESSION) as archive:
        with archive.open("pyproject.toml", "w", force_zip64=True) as member:
            for _ in range(GIB // len(chunk)):
                member.write(chunk)
    return out.getvalue()


def _fab(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return out.getvalue()


def test_a_fab_bomb_is_refused_within_a_second_and_100_mb(bomb):
    assert len(bomb) < 2 * MAX_FAB_BYTES // 8  # about 1 MB on the wire
    tracemalloc.start()
    started = time.perf_counter()
    with pytest.raises(ValueError, match=r"The run's FAB holds 'pyproject.toml', which inflates "
                                         rf"to {GIB} bytes; a site reads at most "
                                         rf"{MAX_MEMBER_BYTES} per file"):
        fused_run_config(bomb, run=None)
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"FAB bomb ({len(bomb)} bytes, 1 GiB inflated) refused in {seconds * 1e3:.1f} ms, "
          f"peak {peak / 1e6:.2f} MB allocated")
    assert seconds < 1.0 and peak < 100e6


def test_fab_bounds_name_what_was_crossed():
    with pytest.raises(ValueError, match=r"The run's FAB is \d+ bytes; a site downloads at "
                                         rf"most {MAX_FAB_BYTES}"):
        check_fab(b"\0" * (MAX_FAB_BYTES + 1))
    with pytest.raises(ValueError, match=r"The run's FAB is not a zip archive"):
        check_fab(b"root:x:0:0:root:/root:/bin/bash\n")
    many = _fab({f"f{i}.txt": b"x" * (MAX_MEMBER_BYTES // 2) for i in range(70)})
    with pytest.raises(ValueError, match=r"The run's FAB inflates to \d+ bytes; a site reads "
                                         r"at most 33554432"):
        check_fab(many)
    check_fab(_fab({"pyproject.toml": b"[project]\nname = 'app'\n"}))
