"""Offline analysis of the proxy's decision log in PySpark; imports only ``quotas`` of the project (its
executors get both shipped as a zip)."""
