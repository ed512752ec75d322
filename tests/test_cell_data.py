"""A comparison's cells reach a task's data through its hook (``Task.cells``), not by name."""

from __future__ import annotations

import pytest

from fedbn_med.evaluation.cell_data import has_cells, task_cells
from fedbn_med.tasks import get_task


def test_abide_prepares_cells_and_the_imaging_tasks_do_not() -> None:
    assert has_cells("abide")
    assert task_cells("abide") is get_task("abide").cells
    assert not has_cells("mri")


def test_a_task_without_cells_is_refused_naming_those_with_them() -> None:
    with pytest.raises(ValueError, match=r"Task 'mri' prepares no cells for a subject-level "
                                         r"comparison \(its Task.cells is None\)\. Tasks "
                                         r"that do: .*abide"):
        task_cells("mri")
