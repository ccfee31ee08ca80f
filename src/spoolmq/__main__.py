"""``python -m spoolmq``: with no arguments, the demo; otherwise the CLI."""

import sys

from spoolmq.cli import main

sys.exit(main(sys.argv[1:] or ["demo"]))
