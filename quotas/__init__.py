"""Quota policy (entities, token bucket, sampled rate, bloom filters, throttle-time math).

Empty until the quota issues: nothing is throttled yet.
"""
