"""The one error hierarchy of millstream.

Every error a user can see derives from :class:`MillstreamError`. Each message
says what was wrong, with the offending value, and how to fix it.
"""

from __future__ import annotations


class MillstreamError(Exception):
    """Base of every error millstream raises on purpose."""


class TopologyError(MillstreamError):
    """A topology is invalid: bad names, unknown streams, cycles, bad options."""


class ImportPathError(TopologyError):
    """A `module:attr` import path does not name something importable."""


class ConfigError(MillstreamError):
    """A command-line flag, environment variable or setting is invalid."""


class WorkerIdentityError(MillstreamError):
    """A call as a worker id without the secret the leader issued that id at registration."""


class MasterUnavailable(MillstreamError):
    """No master could be reached at the given addresses."""


class EtcdUnavailable(MillstreamError):
    """etcd could not be reached (or did not start)."""


class StaleTokenError(MillstreamError):
    """A sequencer token is older than the one already recorded: this owner is stale."""


class NotOwner(MillstreamError):
    """A tablet is not owned here under the token the caller named."""


class UserCodeError(MillstreamError):
    """User code raised; carries the original error's text."""


class InjectionError(MillstreamError):
    """An injector could not deliver its records (bad input, nobody subscribed, ...)."""
