"""Bringing external data into millstream streams."""

from injectors.injector import END_OF_TIME, Injector

__all__ = ["END_OF_TIME", "Injector"]
