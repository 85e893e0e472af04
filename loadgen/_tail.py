"""Following a file that another process, or another part of this one, appends lines to."""

from __future__ import annotations

from pathlib import Path


class LineTail:
    """The complete lines appended to ``path`` since the last call; a line still being written
    (no ``\\n`` yet) is left for a later call. A file that does not exist yet reads as empty."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def new_data(self) -> bytes:
        """The new complete lines, as written (each ending in ``\\n``). Raises ``OSError`` for
        a file that exists but cannot be read."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return b""
        end = data.rfind(b"\n") + 1
        self.offset += end  # before the caller uses them: a yield there must not repeat them
        return data[:end]
