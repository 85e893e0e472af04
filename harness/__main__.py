"""``python -m harness`` is ``zerowindow``."""

from harness._entry import main

main()
