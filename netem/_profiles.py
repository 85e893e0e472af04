"""Link profiles: what a shaped link does to packets, per direction, and named presets.

Directions are named from the client's point of view, because a profile describes the client's
access link (a phone on 3G, a laptop on busy Wi-Fi):

* ``down``: server -> client packets (the response stream). Applied on the *ingress* of the
  client-side interface given to :func:`netem.apply_profile`.
* ``up``: client -> server packets (requests and ACKs). Applied on the *egress* of that interface.

Each direction's ``delay_ms`` is one-way, so a link's base round-trip time is
``down.delay_ms + up.delay_ms`` (plus the serialisation time at ``rate_kbit``). Units: ms,
percent (0-100) and kbit/s (1 kbit = 1000 bit, as ``tc(8)`` counts ``kbit``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from netem._errors import UnknownPreset


class DirectionProfile(BaseModel):
    """Impairments of one direction of a link.

    ``jitter_ms`` is a uniform variation in ``[-jitter_ms, +jitter_ms]`` around ``delay_ms`` (as
    netem without a distribution table); ``reorder_pct`` sends that share of packets at once,
    without the delay (netem's ``reorder``), so it needs ``delay_ms > 0``. ``duplicate_pct`` and
    ``corrupt_pct`` need the kernel's netem qdisc.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    delay_ms: float = Field(0.0, ge=0, le=60_000, description="one-way delay, ms")
    jitter_ms: float = Field(0.0, ge=0, le=60_000, description="uniform +/- delay variation, ms")
    loss_pct: float = Field(0.0, ge=0, le=100, description="random packet loss, percent")
    rate_kbit: float | None = Field(None, gt=0, le=100_000_000, description="rate, kbit/s")
    reorder_pct: float = Field(0.0, ge=0, le=100, description="packets sent undelayed, percent")
    duplicate_pct: float = Field(0.0, ge=0, le=100, description="duplicated packets, percent")
    corrupt_pct: float = Field(0.0, ge=0, le=100, description="packets with a bit flipped, %")

    @model_validator(mode="after")
    def _consistent(self) -> DirectionProfile:
        if self.jitter_ms > self.delay_ms:
            raise ValueError(
                f"jitter_ms ({self.jitter_ms}) must not exceed delay_ms ({self.delay_ms})"
            )
        if self.reorder_pct and not self.delay_ms:
            raise ValueError("reorder_pct needs delay_ms > 0 (reordered packets skip the delay)")
        return self

    @property
    def is_empty(self) -> bool:
        """True when this direction is not impaired at all."""
        return self == DirectionProfile()

    @property
    def needs_delay_line(self) -> bool:
        return bool(self.delay_ms or self.jitter_ms or self.reorder_pct)


class LinkProfile(BaseModel):
    """A shaped link: a ``down`` and an ``up`` :class:`DirectionProfile` (see module doc)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = Field(None, description="preset name or a label for reports")
    down: DirectionProfile = DirectionProfile()
    up: DirectionProfile = DirectionProfile()
    source: str | None = Field(None, description="where the numbers come from")

    @classmethod
    def symmetric(cls, name: str | None = None, **fields: Any) -> LinkProfile:
        """The same :class:`DirectionProfile` fields in both directions.

        ``delay_ms`` given here is the *round-trip* delay, split evenly (half each way), and so is
        ``jitter_ms``; ``loss_pct``, ``rate_kbit`` and the rest apply to each direction as given.
        """
        per = dict(fields)
        for k in ("delay_ms", "jitter_ms"):
            if k in per:
                per[k] = per[k] / 2.0
        d = DirectionProfile(**per)
        return cls(name=name, down=d, up=d)

    @property
    def is_empty(self) -> bool:
        return self.down.is_empty and self.up.is_empty

    @property
    def rtt_ms(self) -> float:
        """Base round-trip delay the profile adds (both one-way delays), ms."""
        return self.down.delay_ms + self.up.delay_ms


def _p(name: str, source: str, down: dict[str, float], up: dict[str, float]) -> LinkProfile:
    return LinkProfile(
        name=name, source=source, down=DirectionProfile(**down), up=DirectionProfile(**up)
    )


# Presets. Published "latency" figures are round-trip; they are split evenly over the two
# directions here. Sources are named in each entry (and in PRESET_SOURCES for reports).
PRESETS: dict[str, LinkProfile] = {
    # Good LTE. Loadero's network-condition table, row "4G": bandwidth 100 Mbit/s in / 50 Mbit/s
    # out, packet loss 0.2 %, latency 45 ms, jitter 5 ms in / 15 ms out
    # (wiki.loadero.com, test-creation/participant-configuration/network-conditions).
    "lte": _p(
        "lte",
        "Loadero network conditions, row 4G (wiki.loadero.com/test-creation/"
        "participant-configuration/network-conditions)",
        down=dict(delay_ms=22.5, jitter_ms=2.5, loss_pct=0.2, rate_kbit=100_000),
        up=dict(delay_ms=22.5, jitter_ms=7.5, loss_pct=0.2, rate_kbit=50_000),
    ),
    # 3G. Lighthouse's "mobileRegular3G" throttling: rttMs 300, throughputKbps 700 both ways, no
    # loss; its comment: aligned with Chrome UX Report's 3G (HTTP RTT 300-1400 ms, downlink
    # < 700 kbps) and partly with WebPageTest's "Regular 3G"
    # (GoogleChrome/lighthouse, core/config/constants.js, throttling.mobileRegular3G).
    "3g": _p(
        "3g",
        "Lighthouse throttling.mobileRegular3G (GoogleChrome/lighthouse core/config/constants.js)",
        down=dict(delay_ms=150, rate_kbit=700),
        up=dict(delay_ms=150, rate_kbit=700),
    ),
    # EDGE (2.5G). Loadero's table, row "Edge": 200 kbit/s in / 260 kbit/s out, loss 1 %,
    # latency 650 ms, jitter 100 ms.
    "edge": _p(
        "edge",
        "Loadero network conditions, row Edge (wiki.loadero.com/test-creation/"
        "participant-configuration/network-conditions)",
        down=dict(delay_ms=325, jitter_ms=50, loss_pct=1.0, rate_kbit=200),
        up=dict(delay_ms=325, jitter_ms=50, loss_pct=1.0, rate_kbit=260),
    ),
    # Congested Wi-Fi: a shared 802.11 cell at busy hours, with queueing delay and its variation
    # dominating. Loadero's table, rows "High jitter" (latency 200 ms, jitter 100 ms) for the
    # delay and "3.5G/HSPA"'s loss (0.5 %); the 2 Mbit/s share is this toolkit's choice (a busy
    # cell's per-client share), not a published figure.
    "congested-wifi": _p(
        "congested-wifi",
        "Loadero network conditions, rows High jitter and 3.5G/HSPA (wiki.loadero.com); "
        "rate: toolkit's choice",
        down=dict(delay_ms=100, jitter_ms=50, loss_pct=0.5, rate_kbit=2_000),
        up=dict(delay_ms=100, jitter_ms=50, loss_pct=0.5, rate_kbit=1_000),
    ),
    # Geostationary satellite: propagation through a GEO hop (35 786 km) takes about 240-270 ms
    # one way, 500-540 ms round trip (summary at probsee.com/p/satellite_delay; ITU-T G.114
    # (05/2003) lists one-way delay by orbit altitude); the top of that range is taken. Rates:
    # Loadero's table, row "Satellite phone": 1000 kbit/s in, 256 kbit/s out (latency 600 ms).
    "geo-satellite": _p(
        "geo-satellite",
        "GEO one-way propagation 240-270 ms (probsee.com/p/satellite_delay, ITU-T G.114); "
        "rates: Loadero network conditions, row Satellite phone (wiki.loadero.com)",
        down=dict(delay_ms=270, rate_kbit=1_000),
        up=dict(delay_ms=270, rate_kbit=256),
    ),
}


def preset(name: str) -> LinkProfile:
    """The built-in preset ``name`` (case-insensitive, ``_`` same as ``-``)."""
    key = name.strip().lower().replace("_", "-")
    try:
        return PRESETS[key]
    except KeyError:
        raise UnknownPreset(
            f"unknown link preset {name!r}; presets: {', '.join(sorted(PRESETS))}"
        ) from None


def resolve_profile(value: str | dict[str, Any] | LinkProfile) -> LinkProfile:
    """A :class:`LinkProfile` from a preset name, a mapping (e.g. a TOML table) or a profile.

    A mapping may name a ``preset`` and override ``down``/``up`` fields of it, e.g.
    ``{"preset": "3g", "down": {"loss_pct": 2}}``. Raises :class:`UnknownPreset` or pydantic's
    ``ValidationError`` (which names the bad field).
    """
    if isinstance(value, LinkProfile):
        return value
    if isinstance(value, str):
        return preset(value)
    data = dict(value)
    base_name = data.pop("preset", None)
    if base_name is None:
        return LinkProfile.model_validate(data)
    base = preset(str(base_name)).model_dump()
    for k, v in data.items():
        if k in ("down", "up") and isinstance(v, dict):
            base[k] = {**base[k], **v}
        else:
            base[k] = v
    return LinkProfile.model_validate(base)
