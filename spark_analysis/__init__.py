"""Offline analysis of the proxy's decision log in PySpark.

Empty until the decision-log issue.
"""
