"""``python -m fedbn_med``: the ``fedbn-med`` command (:mod:`fedbn_med.cli.command`)."""

import sys

from fedbn_med.cli.command import main

sys.exit(main())
