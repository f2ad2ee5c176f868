"""``python -m detaug.bench``: the same as ``detaug bench``."""

import sys

from detaug.bench.runner import main

if __name__ == "__main__":
    sys.exit(main())
