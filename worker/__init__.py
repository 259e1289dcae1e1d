"""The millstream worker: hosts tablets, runs user code, owns each tablet's RocksDB."""
