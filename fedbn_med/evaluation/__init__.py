"""Judging runs: metrics, honest intervals, the comparison protocol, and tables.

- :mod:`.metrics`: one split's scores; :mod:`.report`: one run's tables and figures;
- :mod:`.comparison`: how a run is scored (its best round), its cell, the comparison;
- :mod:`.cell_data`, :mod:`.references`, :mod:`.runner`: a cell's split data, its
  reference rows, and running every cell in this process;
- :mod:`.out_of_fold`, :mod:`.tables`: per-subject tests and the comparison's text;
- :mod:`.intervals`, :mod:`.paired_tests`: the statistics under them.
"""
