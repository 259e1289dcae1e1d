"""Example jobs, importable by workers (``examples.wordcount:Splitter`` ...)."""
