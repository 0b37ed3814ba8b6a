"""``python -m megatron_burst.cli``: the ``megatron-burst`` command without its console script."""
import sys

from .parser import main

sys.exit(main())
