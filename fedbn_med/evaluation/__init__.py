"""Judging runs: metrics, honest intervals, the comparison protocol, and tables.

- :mod:`.metrics`: one split's scores; :mod:`.report`: one run's tables and figures;
- :mod:`.selection`, :mod:`.cells`, :mod:`.comparison`: how a run is scored (its best
  round), its cell, the comparison;
- :mod:`.cell_data`, :mod:`.references`, :mod:`.keeping`, :mod:`.runner`: a cell's split
  data (through the task's hook), its reference rows, a run's kept predictions, and
  running every cell in this process (:mod:`.parallel`: in several);
- :mod:`.out_of_fold`, :mod:`.tables`: per-subject tests and the comparison's text;
- :mod:`.intervals`, :mod:`.paired_tests`: the statistics under them.
"""
