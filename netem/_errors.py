"""The exceptions netem raises: one tree rooted at :class:`NetemError`.

:class:`NetemError` derives from :class:`zwcore.NetworkError`, so ``except NetworkError`` (or
``except ZerowindowError``) catches every error netem raises on purpose. The subclasses keep the
built-in base they had before the tree existed (``RuntimeError``, ``ValueError``), so callers'
``except RuntimeError`` or ``except ValueError`` still work. Each module re-exports the ones it
raises, where callers have always imported them from.
"""

from __future__ import annotations

from zwcore import NetworkError


class NetemError(NetworkError):
    """A namespace, link or shaping operation failed; the message says which and why."""


class NetemPermissionError(NetemError):
    """The process lacks CAP_NET_ADMIN, which namespaces, links and qdiscs need."""


class NetnsError(NetemError, RuntimeError):
    """A command or netlink request inside a namespace failed; the message names both."""


class ProbeError(NetemError, RuntimeError):
    """The probe itself could not run (no CAP_NET_ADMIN, no ``ip`` command)."""


class ShapingError(NetemError, RuntimeError):
    """Applying a profile failed; everything created so far has been removed again."""


class ShapingUnsupported(ShapingError):
    """No selected backend can honour the profile here; the message names what is missing."""


class UnknownPreset(NetemError, ValueError):
    """No preset has that name; the message lists the names there are."""


class CaptureError(NetemError, RuntimeError):
    """tcpdump could not start or failed; the message carries its stderr."""
