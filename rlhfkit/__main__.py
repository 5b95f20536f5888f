"""`python -m rlhfkit ...` is the `rlhfkit` command."""

import sys

from rlhfkit.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
