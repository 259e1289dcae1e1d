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


class RoleError(MillstreamError):
    """A call the caller's role may not make, though its method is open to that role (an
    injector's token asking to release every hold under a name: an operator's action)."""


class MasterUnavailableError(MillstreamError):
    """No master could be reached at the given addresses."""


class EtcdUnavailableError(MillstreamError):
    """etcd could not be reached (or did not start)."""


class StaleTokenError(MillstreamError):
    """A sequencer token is older than the one already recorded: this owner is stale."""


class NotOwnerError(MillstreamError):
    """A tablet is not owned here under the token the caller named."""


class UserCodeError(MillstreamError):
    """User code raised; carries the original error's text."""


class UsageError(MillstreamError, TypeError, ValueError):
    """An API was given a value of the wrong type or out of range: a key or value that is not
    bytes, a timestamp outside 64 bits, an oversized value, a bad timer tag, a value a state
    codec cannot store. Also a TypeError and a ValueError, so handlers written for those
    still catch it."""


class InjectionError(MillstreamError):
    """An injector could not deliver its records (nobody subscribed, a drained job, ...)."""


class UnknownStreamError(InjectionError):
    """No running computation reads the stream an injector sends to (nothing was sent)."""


class StreamClosedError(InjectionError):
    """The stream an injector sends to is closed: its job was drained or cancelled, so no
    record of it will be taken again (retrying cannot help)."""


class InvalidRecordError(InjectionError, UsageError):
    """An injector was handed a record it cannot send (the same mistakes as
    :class:`UsageError` in user code, caught at ``send``)."""


class MissingExtraError(MillstreamError, ImportError):
    """A feature needs a library of one of millstream's optional extras (``pip install
    'millstream[spark]'``) that is not installed. Also an ImportError."""
