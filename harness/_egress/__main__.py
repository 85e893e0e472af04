"""``python -m harness._egress``: the egress buffer's command line (see ``_cli``)."""

import sys

from harness._egress._cli import main

if __name__ == "__main__":
    sys.exit(main())
