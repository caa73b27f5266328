//! The local span report (being written).
