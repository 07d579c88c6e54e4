//! zgix proxy core.
