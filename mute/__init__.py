"""Per-connection muting (KIP-219): the client's requests are not read until a deadline."""

from mute.channel import ChannelMute

__all__ = ["ChannelMute"]
