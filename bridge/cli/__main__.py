"""`python -m bridge.cli ...` is `kakeya ...`."""

import sys

from bridge.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
