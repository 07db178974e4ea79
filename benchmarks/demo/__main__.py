import sys

from benchmarks.demo.scenarios import main

sys.exit(main())
