"""Connecting PySpark to millstream (injection from DataFrames, Parquet export).

Arrives with issue 5; nothing here yet.
"""
