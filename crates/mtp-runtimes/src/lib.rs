//! Skeleton: see the crate README.
