"""python -m kvstore.engines.router: start the PD router."""

import sys

from kvstore.engines.router.cli import main

sys.exit(main())
