//! Pyroscope push exporter (being written).
