"""Client actions: what a client does to its connection once it has received N tokens.

Each action is a frozen pydantic model with one method, :meth:`apply`, that acts on the live
stream through a :class:`StreamControl` and says whether the stream goes on. An action fires
once, at the first read after which at least ``after_tokens`` output tokens have arrived (with
full-speed reads that can be several tokens later), and never after ``[DONE]``.

- ``stall``: stop reading for ``stall_s`` seconds, then read on (one ``stalls`` interval).
- ``stop_reading``: stop reading for good, keep the connection open ``hold_s`` seconds, then
  close with FIN (``close="fin"``) or RST (``close="rst"``); outcome ``client_abort``.

While it holds (``stall``, ``stop_reading``) a client reads nothing but watches the TCP state
of its connection (``StreamControl.hold``): if the server resets or closes it, the hold ends
there and the record gets ``t_cut_seen`` and ``cut_kind``; a ``stall`` then reads on (what was
received before the cut, then the end), a ``stop_reading`` closes with outcome ``cut_by_peer``.
- ``half_close``: ``shutdown(SHUT_WR)`` (FIN to the server) and read on; the outcome is how the
  stream then ends (``complete`` if the server finishes it, ``cut_by_peer`` if it gives up).
- ``abortive_close``: ``SO_LINGER {1, 0}`` then ``close``: the server gets RST; outcome
  ``client_abort``.
- ``leave``: the disconnect matrix's action: leave ``after_s`` seconds after the send (before
  any token if the engine is slow enough: queued or in prefill) or after ``after_tokens``
  (then ``wait_s`` more, reading nothing: a client that leaves mid-decode however busy the
  engine), in one of the ways of :data:`LEAVE_STYLES`; outcome ``client_abort``
  (``half_close``: however the server then ends the stream).

A pause that would pass the request's deadline is cut at the deadline (outcome ``timeout``).
"""

from __future__ import annotations

import socket
import typing
from typing import Annotated, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from zwcore import Registry

from ._records import RequestRecord
from ._sockets import close_abortive, close_orderly
from ._vanish import VanishError, vanish


class StreamControl(Protocol):
    """What an action may touch of a live stream (implemented by the client)."""

    sock: socket.socket
    record: RequestRecord

    def now(self) -> float:
        """Monotonic time, s."""
        ...

    def pause(self, duration_s: float) -> bool:
        """Sleep ``duration_s`` without reading; ``False`` if the deadline cut it short."""
        ...

    def hold(self, duration_s: float) -> str:
        """Like :meth:`pause`, watching for a server cut: ``"held"``, ``"deadline"`` or
        ``"cut"`` (the record's ``t_cut_seen``/``cut_kind`` are then set)."""
        ...


_Frozen = ConfigDict(frozen=True, extra="forbid")


class ClientAction(BaseModel):
    """What a client does to its stream once it has counted ``after_tokens`` output tokens (an
    action kind subclasses this and registers with :data:`ACTIONS`)."""

    model_config = _Frozen
    kind: str
    after_tokens: int = Field(0, ge=0)

    @property
    def pause_s(self) -> float:
        """How long the action keeps the client from reading (s); it must fit the deadline."""
        return 0.0

    @property
    def after_send_s(self) -> float | None:
        """For an action timed from the send rather than by tokens: its delay (s)."""
        return None

    def apply(self, ctl: StreamControl) -> str | None:
        """Act on the stream; return the outcome that ends it, or ``None`` to read on."""
        raise NotImplementedError


ACTIONS: Registry[ClientAction] = Registry("client action")


@ACTIONS.register
class Stall(ClientAction):
    """After ``after_tokens`` tokens, read nothing for ``stall_s`` seconds, then read on."""

    model_config = _Frozen
    kind: Literal["stall"] = "stall"
    after_tokens: int = Field(ge=0)
    stall_s: float = Field(gt=0)

    @property
    def pause_s(self) -> float:
        return self.stall_s

    def apply(self, ctl: StreamControl) -> str | None:
        """Returns ``None`` (read on) or ``"timeout"``."""
        stall: list[float | None] = [ctl.now(), None]
        ctl.record.stalls.append(stall)
        if ctl.hold(self.stall_s) == "deadline":
            return "timeout"
        stall[1] = ctl.now()
        return None


@ACTIONS.register
class StopReading(ClientAction):
    """After ``after_tokens`` tokens, never read again; hold ``hold_s`` s, then close."""

    model_config = _Frozen
    kind: Literal["stop_reading"] = "stop_reading"
    after_tokens: int = Field(ge=0)
    hold_s: float = Field(ge=0)
    close: Literal["fin", "rst"] = "fin"

    @property
    def pause_s(self) -> float:
        return self.hold_s

    def apply(self, ctl: StreamControl) -> str | None:
        """Returns ``"client_abort"``, ``"cut_by_peer"`` if the server cut the connection
        during the hold, or ``"timeout"`` if the deadline came first."""
        ctl.record.stalls.append([ctl.now(), None])
        held = ctl.hold(self.hold_s)
        if self.close == "rst":
            close_abortive(ctl.sock)
        else:
            close_orderly(ctl.sock)  # what it drains is thrown away, not counted as received
        if held == "cut":
            how = "reset" if ctl.record.cut_kind == "rst" else "closed"
            ctl.record.error = f"connection {how} by the server while the client held it"
            return "cut_by_peer"
        return "client_abort" if held == "held" else "timeout"


@ACTIONS.register
class HalfClose(ClientAction):
    """After ``after_tokens`` tokens, ``shutdown(SHUT_WR)`` and keep reading."""

    model_config = _Frozen
    kind: Literal["half_close"] = "half_close"
    after_tokens: int = Field(ge=0)

    def apply(self, ctl: StreamControl) -> str | None:
        """Returns ``None``: the stream goes on and ends however the server ends it."""
        try:
            ctl.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # already reset by the peer: the next recv reports it
        return None


@ACTIONS.register
class AbortiveClose(ClientAction):
    """After ``after_tokens`` tokens, close with RST (``SO_LINGER {1, 0}``, socket(7))."""

    model_config = _Frozen
    kind: Literal["abortive_close"] = "abortive_close"
    after_tokens: int = Field(ge=0)

    def apply(self, ctl: StreamControl) -> str | None:
        """Returns ``"client_abort"``."""
        close_abortive(ctl.sock)
        return "client_abort"


LeaveStyle = Literal["fin", "rst", "half_close", "stall_fin", "stall_rst", "vanish"]
LEAVE_STYLES: tuple[LeaveStyle, ...] = typing.get_args(LeaveStyle)
"""How a client leaves (``leave``'s ``how``): ``fin`` (``shutdown(SHUT_WR)`` then close, as
``stop_reading`` does), ``rst`` (``SO_LINGER {1, 0}``, socket(7)), ``half_close`` (FIN, then read
on), ``stall_fin``/``stall_rst`` (read nothing for ``stall_s``, watching for a server cut, then
close with FIN or RST), ``vanish`` (drop every packet of the connection from now on, both ways,
then close: the server never hears a FIN or an RST, as when a phone loses its network;
:func:`~loadgen._vanish.vanish`, which needs ``nft`` and CAP_NET_ADMIN)."""


@ACTIONS.register
class Leave(ClientAction):
    """Leave the stream ``after_s`` seconds after the send (reading nothing before; the
    engine may still be queueing or prefilling the request) or, without ``after_s``, after
    ``after_tokens`` output tokens and ``wait_s`` seconds more (counted from the arrival of
    the read that brought them, reading nothing meanwhile: the engine has been decoding the
    request since its first token, so the client leaves mid-decode however long it queued),
    in the way ``how`` names (:data:`LEAVE_STYLES`). ``t_action`` is the moment of leaving
    (after the wait; for ``stall_*`` the start of the stall). Validation errors: ``after_s``
    with ``after_tokens`` or ``wait_s``, ``stall_s`` without a ``stall_*``."""

    model_config = _Frozen
    kind: Literal["leave"] = "leave"
    after_tokens: int = Field(0, ge=0)
    after_s: float | None = Field(None, ge=0)
    wait_s: float = Field(0.0, ge=0, description="after the after_tokens-th token, s")
    how: LeaveStyle = "fin"
    stall_s: float = Field(0.0, ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> Leave:
        if self.after_s is not None and self.after_tokens:
            raise ValueError("give after_s or after_tokens, not both")
        if self.after_s is not None and self.wait_s:
            raise ValueError("wait_s counts from the after_tokens-th token: not with after_s")
        if self.stall_s and not self.how.startswith("stall_"):
            raise ValueError(f"stall_s is for how = stall_fin or stall_rst, not {self.how!r}")
        if self.how.startswith("stall_") and not self.stall_s:
            raise ValueError(f"how = {self.how!r} needs stall_s > 0")
        return self

    @property
    def pause_s(self) -> float:
        return self.stall_s + (self.after_s or 0.0) + self.wait_s

    @property
    def after_send_s(self) -> float | None:
        return self.after_s

    def apply(self, ctl: StreamControl) -> str | None:
        """Returns ``"client_abort"``, ``None`` after ``half_close`` (read on), ``"cut_by_peer"``
        if the server cut the connection during a stall, or ``"timeout"`` (the deadline came
        first, during the wait or the stall)."""
        if self.wait_s:
            rec = ctl.record
            since = rec.chunks[-1].t if rec.chunks else ctl.now()  # the read that brought them
            left_s = since + self.wait_s - ctl.now()
            if left_s > 0 and not ctl.pause(left_s):
                rec.action = rec.t_action = None  # it never left: its deadline came first
                return "timeout"
            rec.t_action = ctl.now()
        if self.how == "half_close":
            return HalfClose(after_tokens=0).apply(ctl)
        if self.how == "rst":
            close_abortive(ctl.sock)
            return "client_abort"
        if self.how == "vanish":
            try:
                vanish(ctl.sock)
            except VanishError as exc:  # the socket was reset instead
                ctl.record.error = f"vanish failed, reset instead: {exc}"
            return "client_abort"
        if self.how == "fin":
            close_orderly(ctl.sock)
            return "client_abort"
        close = "rst" if self.how == "stall_rst" else "fin"
        return StopReading(after_tokens=0, hold_s=self.stall_s, close=close).apply(ctl)


ActionConfig = Annotated[ClientAction, ACTIONS.validator, ACTIONS.serializer]
"""A field holding any registered client action, chosen by its ``kind``."""
