"""python -m kvstore.engines.reference: start one reference engine instance."""

import sys

from kvstore.engines.reference.cli import main

sys.exit(main())
