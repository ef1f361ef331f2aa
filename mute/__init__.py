"""Every "this connection is not read until T", whatever the reason (quota throttles, KIP-936 user holds)."""

from mute.channel import ChannelMute
from mute.holds import KeyedHolds

__all__ = ["ChannelMute", "KeyedHolds"]
