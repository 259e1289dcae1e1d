"""The millstream master: topologies, workers, tablet assignment, routing, status."""
