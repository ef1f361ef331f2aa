"""Quota policy with time passed in: the catalogue of quota kinds, entities, token bucket, sampled rate, bloom
filters, throttle-time math, the decision-log schema. Imports nothing of the project but itself."""
