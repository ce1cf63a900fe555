"""`python -m dysco_interp.cli`, the same as the `dysco-interp` command."""

import sys

from dysco_interp.cli.app import main

if __name__ == "__main__":
    sys.exit(main())
