"""``python -m harness`` is ``zerowindow``."""

from harness.cli import main

main()
