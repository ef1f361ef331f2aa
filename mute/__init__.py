"""Muting: "this connection may not be read until T" (KIP-219).

Empty until the quota issues.
"""
