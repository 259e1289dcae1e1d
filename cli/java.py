"""Spark needs Java 17 or later: the commands that start Spark (`demo`, `bench --peer spark`)
check for it first and say in one line what to install, instead of PySpark's
``JAVA_GATEWAY_EXITED`` traceback. ``make demo`` does the same check (.ci/need-java), and
installs Debian's headless JRE when it runs as root with apt-get."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from runtime.errors import ConfigError

MINIMUM = 17
INSTALL = ("install a JRE (Debian/Ubuntu: apt-get install openjdk-17-jre-headless; `make demo` does it "
           "when run as root) or set JAVA_HOME to one")


def java_command(java_home: str | None) -> str | None:
    """The ``java`` PySpark runs: ``$JAVA_HOME/bin/java`` if JAVA_HOME is set, else the one on PATH."""
    if java_home:
        path = os.path.join(java_home, "bin", "java")
        return path if os.access(path, os.X_OK) else None
    return shutil.which("java")


def major_version(version_output: str) -> int | None:
    """17 from ``openjdk version "17.0.15" 2025-04-15``; 8 from ``java version "1.8.0_402"``."""
    m = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if m is None:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def check_java(what: str, java_home: str | None) -> None:
    """Raise :class:`ConfigError` (one line) unless a Java of at least :data:`MINIMUM` runs."""
    java = java_command(java_home)
    if java is None:
        where = f"JAVA_HOME={java_home} has no bin/java" if java_home else "no `java` on PATH"
        raise ConfigError(f"{what} runs Spark, which needs Java {MINIMUM} or later ({where}); {INSTALL}")
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
        said = done.stderr + done.stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        said = str(e)
    major = major_version(said)
    if major is None or major < MINIMUM:
        found = f"Java {major}" if major is not None else f"`{java} -version` said {said.strip()[:80]!r}"
        raise ConfigError(f"{what} runs Spark, which needs Java {MINIMUM} or later ({found} at {java}); {INSTALL}")
